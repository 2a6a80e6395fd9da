"""Chapter 04's speed goals for speculative decoding, measured with α and c from the same run.

    python benchmarks/speculative.py [--quick] [--out results.json]

For each proposer (tiny-draft, tiny-draft-distilled, prompt lookup) and γ = 1..6, at batch 1, greedy:
α, tokens per target forward, the cost ratio c, the measured wall-clock speed-up over plain
``Engine.generate``, and the formula's (1 − α^(γ+1)) / ((1 − α)(γc + 1)). Every run checks that the
output is token-identical to plain greedy. Last, the same pair through ``transformers``' assisted
generation. Run on an idle machine: other jobs change every timing.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from course_lib.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative import DraftProposer, PromptLookupProposer, SpeculativeDecoder, expected_speedup
from course_lib.report import machine_name

PROMPT = (
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n"
)


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    new, repeats = (32, 2) if args.quick else (64, 3)
    target = Engine("tiny-target")
    ids = target.tokenizer(PROMPT)["input_ids"]
    params = SamplingParams(max_new_tokens=new, ignore_eos=True)
    reference = target.generate([ids], params)[0].output_ids
    base = best_of(lambda: target.generate([ids], params), repeats)
    out = {"machine": machine_name(), "new_tokens": new, "baseline_s": base, "rows": []}
    print(f"# {out['machine']}; plain greedy {new} tokens: {base * 1e3:.1f} ms")
    proposers = {
        "tiny-draft": lambda: DraftProposer(Engine("tiny-draft")),
        "tiny-draft-distilled": lambda: DraftProposer(Engine("tiny-draft-distilled")),
        "prompt lookup": lambda: PromptLookupProposer(ngram=2, max_ngram=4),
    }
    print(f"{'proposer':<22}{'γ':>3}{'α':>7}{'tok/fwd':>9}{'c':>7}{'measured':>10}{'predicted':>10}{'identical':>10}")
    for name, make in proposers.items():
        for gamma in range(1, 7):
            dec = SpeculativeDecoder(target, make(), gamma)
            res = dec.generate([ids], params)
            same = res[0].output_ids == reference
            t = best_of(lambda dec=dec: dec.generate([ids], params), repeats)
            st = res.stats
            alpha, c = st.acceptance_rate, st.cost_ratio
            pred = expected_speedup(min(alpha, 1.0), gamma, c) if alpha == alpha and c == c else float("nan")
            row = dict(
                proposer=name,
                gamma=gamma,
                alpha=alpha,
                tokens_per_forward=st.tokens_per_forward,
                c=c,
                measured=base / t,
                predicted=pred,
                identical=same,
            )
            out["rows"].append(row)
            print(
                f"{name:<22}{gamma:>3}{alpha:>7.2f}{st.tokens_per_forward:>9.2f}{c:>7.3f}{base / t:>9.2f}x"
                f"{pred:>9.2f}x{str(same):>10}"
            )
    hf_t, hf_d = target.hf_model, Engine("tiny-draft").hf_model
    x = torch.tensor([ids])
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=target.tokenizer.pad_token_id)
    with torch.inference_mode():
        plain = best_of(lambda: hf_t.generate(x, attention_mask=torch.ones_like(x), **kw), repeats)
        assisted_ids = hf_t.generate(x, attention_mask=torch.ones_like(x), assistant_model=hf_d, **kw)[0, len(ids) :]
        assisted = best_of(
            lambda: hf_t.generate(x, attention_mask=torch.ones_like(x), assistant_model=hf_d, **kw), repeats
        )
    ours = min(r["measured"] for r in out["rows"] if r["proposer"] == "tiny-draft" and r["gamma"] == 3)
    out["hf"] = dict(plain_s=plain, assisted_s=assisted, identical=assisted_ids.tolist() == reference)
    print(
        f"transformers: plain {plain * 1e3:.1f} ms, assisted (tiny-draft) {assisted * 1e3:.1f} ms = "
        f"{plain / assisted:.2f}x its own plain; identical to our greedy: {out['hf']['identical']}"
    )
    print(
        f"ours with tiny-draft, γ=3: {base / (base / ours) * 1e3:.1f} ms -> {ours:.2f}x our plain, "
        f"{plain / (base / ours):.2f}x transformers' plain, {assisted / (base / ours):.2f}x transformers' assisted"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
