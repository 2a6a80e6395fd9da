"""Medusa against plain decoding: greedy, batch 1, plain vs the top-1 chain vs the candidate tree.

Per method: per-head (per-depth) acceptance, tokens per target forward, c (the heads' seconds per
draft token / seconds per verify forward), best-of-n seconds, the speed-up over plain and whether
every output was token-identical to plain greedy. Batch-1 decode is bandwidth-bound (each forward
reads all the weights), so the tokens per forward are what transfer to other machines; on our tiny
target the heads' D×V projections make c far from zero. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import dataclasses
import math

from course_lib.decoding.speedup import best_of
from course_lib.engine.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative.medusa import MedusaHeads, check_engine, medusa_decoder, positive_int
from course_lib.engine.speculative.medusa_tree import MedusaTreeDecoder, TreeStats
from course_lib.engine.speculative.stats import SpecStats

#: code prompts for ``measure_medusa``: the speculative benchmark's and the model card's greedy-sample prompts
CODE_PROMPTS = (
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b",
    "def fibonacci(n):",
    "import os\nimport sys\nimport re",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x",
)


def _merge_stats(parts: list[SpecStats]) -> SpecStats:
    """Sum the counters (numbers, per-position lists) of several runs' stats; history is dropped."""
    out = type(parts[0])(parts[0].gamma)
    for f in dataclasses.fields(out):
        if f.name in ("gamma", "history"):
            continue
        for p in parts:
            a, b = getattr(out, f.name), getattr(p, f.name)
            setattr(out, f.name, [x + y for x, y in zip(a, b)] if isinstance(a, list) else a + b)
    return out


def measure_medusa(
    target: Engine,
    heads: MedusaHeads,
    prompts=CODE_PROMPTS,
    max_new_tokens: int = 48,
    repeats: int = 3,
    top=(2, 2, 1, 1),
) -> dict:
    """Greedy, batch 1, each prompt on its own: plain ``target.generate`` vs Medusa top-1 (γ = K through
    ``SpeculativeDecoder``) vs the Medusa tree. Per method: per-head (per-depth) acceptance, tokens per
    target forward, c (heads' seconds per draft token / seconds per verify forward), best-of-``repeats``
    seconds, speedup over plain and whether every output was token-identical to plain greedy."""
    from course_lib.measure.report import machine_name

    check_engine(target)
    heads.check_target(target)
    positive_int("max_new_tokens", max_new_tokens)
    positive_int("repeats", repeats)
    ids = target.encode(list(prompts))
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    reference = [target.generate([p], params)[0].output_ids for p in ids]
    plain = best_of(lambda: [target.generate([p], params) for p in ids], repeats)
    rows = [dict(method="plain", acceptance_at=[], tokens_per_forward=1.0, c=math.nan, seconds=plain, speedup=1.0)]
    rows[0]["identical"] = True
    methods = {
        f"medusa top-1 (γ={heads.num_heads})": medusa_decoder(target, heads),
        f"medusa tree top={tuple(top)}": MedusaTreeDecoder(target, heads, top=top),
    }
    for name, dec in methods.items():

        def run(dec=dec):
            return [dec.generate([p], params) for p in ids]

        outs = run()
        seconds = best_of(run, repeats)
        st = _merge_stats([o.stats for o in outs])  # all prompts' counters together
        # tokens per forward excluding the prefill forwards (each yields one token for either method)
        decode_fwd = st.target_forwards - len(outs)
        row = dict(
            method=name,
            acceptance_at=st.acceptance_at,
            tokens_per_forward=(st.generated - len(outs)) / decode_fwd if decode_fwd else math.nan,
            c=(st.proposer_time / st.proposed) / ((st.target_time - st.first_forward_time) / decode_fwd)
            if st.proposed and decode_fwd
            else math.nan,
            seconds=seconds,
            speedup=plain / seconds,
            identical=[o[0].output_ids for o in outs] == reference,
        )
        if isinstance(st, TreeStats):
            row["nodes_per_forward"] = sum(o.stats.nodes for o in outs) / decode_fwd
        rows.append(row)
    return {
        "machine": machine_name(),
        "prompts": len(ids),
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "rows": rows,
    }


def format_medusa_table(result: dict) -> str:
    """The ``measure_medusa`` result as a fixed-width text table."""
    lines = [
        f"# {result['machine']}; {result['prompts']} prompts × {result['max_new_tokens']} new tokens, batch 1, greedy,"
        f" best of {result['repeats']}",
        f"{'method':<32}{'acceptance per head':<30}{'tok/fwd':>8}{'c':>7}{'s':>8}{'speedup':>9}{'identical':>10}",
    ]
    for r in result["rows"]:
        acc = " ".join(f"{a:.2f}" for a in r["acceptance_at"]) or "-"
        lines.append(
            f"{r['method']:<32}{acc:<30}{r['tokens_per_forward']:>8.2f}{r['c']:>7.3f}{r['seconds']:>8.3f}"
            f"{r['speedup']:>8.2f}x{str(r['identical']):>10}"
        )
    return "\n".join(lines)
