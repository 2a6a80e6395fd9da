"""Chapter 05's PagedAttention goals: KV memory wasted, memory shared by forks, and the decode-step cost.

    python benchmarks/paged_kv.py [--quick] [--out results.json]

1. Fragmentation on a seeded ShareGPT-like request mix (lognormal prompt and output lengths, means ~200,
   max_model_len 2048), reserved vs used KV slots summed over every decode step: max-length
   preallocation (the contiguous backend), an oracle that reserves exactly prompt + output, and paged
   blocks of 16. Goal: paged < 4 % waste against 60–80 % for max-length preallocation (Kwon et al. 2023).
2. Parallel sampling, n = 4 samples of each prompt: blocks held with ``fork`` sharing vs with copies.
3. Decode step time of tiny-target at batch 8, context 256, paged (torch gather + SDPA) vs contiguous,
   the whole step and attention alone. Goal: paged ≤ 1.3× the contiguous step on a CPU.
Run it on an idle machine: other jobs change every timing.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from course_lib.kv.paged_memory import fragmentation, request_mix, sharing
from course_lib.kv.paged_timing import paged_step_times
from course_lib.measure.report import machine_name

MAX_MODEL_LEN = 2048
BLOCK = 16


def memory(n_requests: int) -> dict:
    mix = request_mix(n_requests, prompt_mean=200, output_mean=200, sigma=1.0, max_model_len=MAX_MODEL_LEN, seed=0)
    prompts, outputs = [p for p, _ in mix], [o for _, o in mix]
    # tokens held at an average decode step: each request weighted by its number of steps (o)
    mean_live = sum(o * (p + (o + 1) / 2) for p, o in mix) / sum(outputs)
    print(
        f"request mix: {n_requests} requests, prompt mean {statistics.fmean(prompts):.0f} "
        f"(median {statistics.median(prompts):.0f}, max {max(prompts)}), output mean {statistics.fmean(outputs):.0f} "
        f"(median {statistics.median(outputs):.0f}, max {max(outputs)})"
    )
    # predict: max_len wastes 1 − mean_live / 2048; paged wastes ~half a block per sequence
    print(
        f"predicted waste: max_len ~{1 - mean_live / MAX_MODEL_LEN:.1%}, paged ~{(BLOCK / 2) / mean_live:.1%} "
        f"(half a block of {BLOCK} over ~{mean_live:.0f} live tokens)"
    )
    out = {"mix": {"n": n_requests, "prompt_mean": statistics.fmean(prompts), "output_mean": statistics.fmean(outputs)}}
    rows = []
    f = fragmentation(mix, MAX_MODEL_LEN, BLOCK)
    for scheme in ("max_len", "oracle", "paged"):
        rows.append((f"{scheme} (block {BLOCK})" if scheme == "paged" else scheme, f.reserved[scheme], f.waste(scheme)))
    for bs in (8, 32, 64, 256):
        g = fragmentation(mix, MAX_MODEL_LEN, bs)
        rows.append((f"paged (block {bs})", g.reserved["paged"], g.waste("paged")))
    print(f"\n{'scheme':<20} {'reserved / used':>16} {'waste':>8}")
    for name, reserved, waste in rows:
        print(f"{name:<20} {reserved / f.used:>15.2f}x {waste:>8.1%}")
    out["fragmentation"] = {name: {"reserved_over_used": r / f.used, "waste": w} for name, r, w in rows}
    verdict = f.waste("paged") < 0.04 and 0.6 <= f.waste("max_len")
    print(f"goal paged < 4% and max_len >= 60%: {'met' if verdict else 'NOT met'}")
    s = sharing(mix, n=4, block_size=BLOCK)
    print(
        f"\nparallel sampling n=4: {s.shared_blocks} blocks with fork sharing vs {s.copied_blocks} with copies "
        f"({s.saving:.1%} less; {s.copy_on_write} copy-on-write block copies)"
    )
    out["sharing"] = {"shared_blocks": s.shared_blocks, "copied_blocks": s.copied_blocks, "saving": s.saving}
    return out


def decode_time(batch: int, context: int, repeats: int, rounds: int) -> dict:
    res = paged_step_times(batch, context, repeats, rounds, block_size=BLOCK)
    kv_bytes = batch * (context + 1) * 2 * 6 * 2 * 32 * 4  # tiny-target: 2 (K,V) · 6 layers · 2 kv heads · 32 · fp32
    print(
        f"\ndecode step, tiny-target, batch {batch}, context {context}: {kv_bytes / 1e6:.1f} MB of KV read per step;"
        f" the gather writes and re-reads that much again (prediction: attention ~2x, step much less)"
    )
    print(f"{'backend':<12} {'step ms':>9} {'attention ms':>13}")
    out = {"batch": batch, "context": context, "kv_bytes": kv_bytes}
    for name, r in res.items():
        out[name] = {"step_ms": r.step_s * 1e3, "attention_ms": r.attention_s * 1e3}
        print(f"{name:<12} {r.step_s * 1e3:>9.2f} {r.attention_s * 1e3:>13.2f}")
    ratio = out["paged"]["step_ms"] / out["contiguous"]["step_ms"]
    att = out["paged"]["attention_ms"] / out["contiguous"]["attention_ms"]
    out["step_ratio"], out["attention_ratio"] = ratio, att
    print(
        f"paged / contiguous: step {ratio:.2f}x, attention alone {att:.2f}x; goal step <= 1.3x: "
        f"{'met' if ratio <= 1.3 else 'NOT met'}"
    )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for the timings (default 1: these ops are tiny, and on a shared 2-core machine "
        "OpenMP threads waiting for each other make 2-thread timings swing by 10-30x)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"# {machine_name()}, torch threads {torch.get_num_threads()}")
    out = {"machine": machine_name()}
    out.update(memory(300 if args.quick else 2000))
    out["decode"] = decode_time(8, 256, repeats=5 if args.quick else 20, rounds=2 if args.quick else 5)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
