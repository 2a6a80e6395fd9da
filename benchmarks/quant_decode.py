"""Chapter 03's speed and quality goals: weight-only int8/int4 against fp32 on this machine.

    python benchmarks/quant_decode.py            # GEMV, bench-80m decode, tiny-target quality
    python benchmarks/quant_decode.py --quick    # smaller sizes, fewer repeats

Goals (issue "Chapter 03 — compression"), at batch 1 against fp32 on a CPU:
GEMV on a large matrix int8 >= 3x, int4 >= 5.5x; end-to-end decode of bench-80m int8 >= 2.5x, int4 >= 4x;
tiny-target perplexity: int8 within 1% of fp32, GPTQ int4 within 5% and closer than RTN at the same group.
Run it on an idle machine: other jobs change every timing.
"""

from __future__ import annotations

import argparse
import json

import torch

from course_lib.compression.apply import gemv_speed, linear_bytes, quantize_engine
from course_lib.compression.calibrate import collect_inputs
from course_lib.compression.evaluate import decode_step_time, perplexity
from course_lib.compression.gptq import quantize_engine_gptq
from course_lib.compression.quantize import QuantConfig
from course_lib.engine import Engine
from course_lib.measure.report import machine_name
from course_lib.models.load import random_model

INT8 = QuantConfig(8, True, "channel")
INT4 = QuantConfig(4, False, "group", 128)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = 4096 if args.quick else 8192
    out = {"machine": machine_name(), "device": dev, "gemv": [], "decode": {}, "quality": {}}
    print(f"# {out['machine']}")
    for batch in (1, 4, 16):
        rows = gemv_speed(n, n, [INT8, INT4], batch=batch, repeats=10 if args.quick else 30, device=dev)
        for r in rows:
            speed = rows[0].seconds / r.seconds
            out["gemv"].append(dict(n=n, batch=batch, format=r.name, path=r.path, ms=r.seconds * 1e3, speedup=speed))
            print(f"GEMV {n}x{n} batch {batch:>2} {r.name:<22} {r.path:<9} {r.seconds * 1e3:7.2f} ms {speed:5.2f}x")
    model, tok = random_model("bench-80m", device=dev)
    for name, cfg in (("fp32", None), (INT8.name, INT8), (INT4.name, INT4)):
        eng = Engine(model, tok, device=dev)
        if cfg is not None:
            quantize_engine(eng, cfg)
        step = decode_step_time(eng, batch=1, new_tokens=16 if args.quick else 64, repeats=3 if args.quick else 5)
        out["decode"][name] = dict(ms=step * 1e3, linear_mb=linear_bytes(eng) / 1e6)
    for name, d in out["decode"].items():
        d["speedup"] = out["decode"]["fp32"]["ms"] / d["ms"]
        print(f"bench-80m decode {name:<22} {d['linear_mb']:7.1f} MB  {d['ms']:6.2f} ms/step  {d['speedup']:4.2f}x")
    target = Engine("tiny-target", device=dev)
    tokens = 16_384 if args.quick else 65_536
    q = out["quality"]
    q["fp32"] = perplexity(target, max_tokens=tokens)
    h = collect_inputs(target, n_samples=16 if args.quick else 32)
    for cfg in (INT8, QuantConfig(4, False, "group", 32), INT4):
        rtn = Engine(target.hf_model, target.tokenizer, device=dev)
        quantize_engine(rtn, cfg, include_lm_head=False)
        q[f"RTN {cfg.name}"] = perplexity(rtn, max_tokens=tokens)
        if cfg.bits == 4:
            g = Engine(target.hf_model, target.tokenizer, device=dev)
            quantize_engine_gptq(g, cfg, h, include_lm_head=False)
            q[f"GPTQ {cfg.name}"] = perplexity(g, max_tokens=tokens)
    for name, v in q.items():
        print(f"tiny-target perplexity {name:<26} {v:8.3f} ({v / q['fp32'] - 1:+.2%}), {tokens:,} validation tokens")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
