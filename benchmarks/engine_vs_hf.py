"""Benchmark: our engine's decode tokens/s vs HF `generate`, same model and inputs, batch 1 and 8.

    python benchmarks/engine_vs_hf.py [--model tiny-target|bench-80m] [--device cpu] [--new-tokens 64] [--profile]
                                      [--decode auto|eager|fused|compiled|cudagraph|native]

`bench-80m` is a random-weight Llama (hidden 768, 12 layers, 314 MB in fp32): ten times a typical
L3 cache, so its decode streams the weights from DRAM. The table gives the engine's effective weight
bandwidth (weight bytes / step time) beside this machine's measured STREAM bandwidth.
Goals (engine-architecture issue): >= 1.6x HF at batch 1 and >= 1.5x at batch 8 on tiny-target;
stretch goals: >= 3x HF on tiny-target, >= 60% of STREAM on bench-80m. Not a test: timings are noisy.
``--decode`` is the engine's decode step (``Engine(decode=...)``); auto: "native" (the whole step in one C
call) on a CPU where the course's kernels build, "cudagraph" on a CUDA device, else "eager". The native
step takes batches of up to 4 (5+ run the eager step); the graph step has batch buckets up to 64.
"""

import argparse
import json
import sys
import time

from course_lib.bottlenecks.engine_vs_hf import as_dicts, engine_vs_hf, format_rows, profile_decode_step
from course_lib.engine.engine import Engine
from course_lib.engine.fast_decode import DECODE_MODES
from course_lib.kernels import cpu_gemv
from course_lib.measure.hardware.device import detect_device
from course_lib.measure.microbench import measured_peaks
from course_lib.models.family import SPECS
from course_lib.models.load import EMBEDDED, random_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-target", help=f"{list(EMBEDDED)}, bench-80m, a folder or a hub id")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--profile", action="store_true", help="also print a torch.profiler table of decode steps")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--decode", default="auto", choices=DECODE_MODES)
    args = parser.parse_args()
    decode = args.decode
    if decode == "auto":
        if str(args.device).startswith("cuda"):
            decode = "cudagraph"  # one graph replay per step (falls back to fused, with a warning, if capture fails)
        else:
            decode = (
                "native" if str(args.device) == "cpu" and args.dtype == "fp32" and cpu_gemv.available() else "eager"
            )
    if args.model in SPECS and args.model not in EMBEDDED:
        engine = Engine(*random_model(args.model, device=args.device, dtype=args.dtype), decode=decode)
    else:
        engine = Engine(args.model, device=args.device, dtype=args.dtype, decode=decode)
    print(detect_device(args.device).describe())
    peaks = measured_peaks(args.device)
    print(f"measured bandwidth (STREAM-like triad) {peaks.bandwidth / 1e9:.1f} GB/s")
    rows = engine_vs_hf(engine, args.batches, args.new_tokens, args.repeats, peaks.bandwidth)
    print(format_rows(rows, peaks.bandwidth / 1e9))
    if args.profile:
        for b in args.batches:
            print(f"\ntorch.profiler, 20 decode steps at batch {b}:")
            print(profile_decode_step(engine, b))
    if args.json:
        meta = {
            "machine": detect_device(args.device).describe(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python benchmarks/engine_vs_hf.py " + " ".join(sys.argv[1:]),
            "decode": decode,
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": as_dicts(rows)}, f, indent=1)


if __name__ == "__main__":
    main()
