"""Jacobi and lookahead decoding against plain greedy: tokens per forward, acceptance and wall-clock speed-up.

Batch 1, greedy, EOS ignored; each method's output is checked token-identical to plain. Timed round
robin (best of n rounds, each timing every method once) so that a load change on a shared machine hits
every method alike. Every verify forward is a bandwidth-bound step over W + 1 tokens; whether the
extra tokens per forward pay for its extra cost is what the speed-up column says. Introduced in
04_decoding.ipynb.
"""

from __future__ import annotations

import math

from course_lib.engine.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative.jacobi import JacobiProposer, LookaheadProposer, check_int
from course_lib.engine.speculative.verifier import SpeculativeDecoder

#: The code prompt of ``benchmarks/speculative.py``: the measurement helper's default.
CODE_PROMPT = (
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n"
)


def measure_jacobi(
    engine: Engine | None = None,
    prompts=(CODE_PROMPT,),
    *,
    max_new_tokens: int = 64,
    windows=(2, 4, 8),
    lookahead: dict | None = None,
    repeats: int = 3,
) -> list[dict]:
    """Batch 1, greedy, EOS ignored: per method, tokens per target forward, acceptance, forwards and the
    wall-clock speedup over plain ``engine.generate`` (all prompts one after the other; best of ``repeats``
    rounds, each timing every method once, after one warm-up), and whether every output is
    token-identical to plain.
    ``lookahead``: LookaheadProposer keyword arguments (default window 4, 4-grams, pool 8)."""
    from course_lib.measure.bench import benchmark

    engine = engine or Engine("tiny-target")
    repeats = check_int("repeats", repeats, "timed runs per method")
    ids = engine.encode(list(prompts))
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    refs = [engine.generate([x], params)[0].output_ids for x in ids]

    la = {"window": 4, "ngram": 4, "pool_size": 8, **(lookahead or {})}
    methods = [(f"jacobi W={w}", lambda w=w: JacobiProposer(w), w) for w in windows]
    methods.append((f"lookahead W={la['window']} n={la['ngram']}", lambda: LookaheadProposer(**la), la["window"]))
    rows = [dict(method="plain", window=0, tokens_per_forward=1.0, acceptance=math.nan, forwards=sum(map(len, refs)))]
    rows[0]["identical"] = True
    fns = [lambda: [engine.generate([x], params) for x in ids]]
    for name, make, w in methods:
        gen, acc, prop, fwd, same = 0, 0, 0, 0, True
        for x, ref in zip(ids, refs):
            out = SpeculativeDecoder(engine, make(), gamma=w).generate([x], params)
            st = out.stats
            gen, acc, prop, fwd = gen + st.generated, acc + st.accepted, prop + st.proposed, fwd + st.target_forwards
            same &= out[0].output_ids == ref
        rows.append(
            dict(
                method=name,
                window=w,
                tokens_per_forward=gen / fwd,
                acceptance=acc / prop if prop else math.nan,
                forwards=fwd,
                identical=same,
            )
        )
        fns.append(
            lambda make=make, w=w: [SpeculativeDecoder(engine, make(), gamma=w).generate([x], params) for x in ids]
        )
    # round robin, best of ``repeats``: a load change on a shared machine hits every method alike
    best = [math.inf] * len(fns)
    for fn in fns:
        fn()  # warm-up
    for _ in range(repeats):
        for m, fn in enumerate(fns):
            best[m] = min(best[m], benchmark(fn, warmup=0, repeats=1, device="cpu").best_s)
    for row, t in zip(rows, best):
        row["time_s"], row["speedup"] = t, best[0] / t
    return rows


def format_table(rows: list[dict]) -> str:
    """``measure_jacobi``'s rows as a fixed-width text table."""
    head = f"{'method':<22}{'tok/fwd':>9}{'α':>7}{'forwards':>10}{'ms':>9}{'speedup':>9}{'identical':>10}"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['method']:<22}{r['tokens_per_forward']:>9.2f}{r['acceptance']:>7.2f}{r['forwards']:>10}"
            f"{r['time_s'] * 1e3:>9.1f}{r['speedup']:>8.2f}x{str(r['identical']):>10}"
        )
    return "\n".join(lines)
