"""Benchmark: our engine's decode tokens/s vs HF `generate`, same model and inputs, batch 1 and 8.

    python benchmarks/engine_vs_hf.py [--model tiny-target] [--device cpu] [--new-tokens 64]

Goal (issue: engine core): ≥ 1.5x HF at batch 1 on CPU. Prints the table and the MBU of decode
against this machine's measured memory bandwidth. Not a test: timings are noisy by nature.
"""
import argparse
import json

from course_lib.engine.benchmark import as_dicts, engine_vs_hf, format_rows
from course_lib.engine import Engine
from course_lib.hardware import detect_device, measured_peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-target")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    engine = Engine(args.model, device=args.device, dtype=args.dtype)
    print(detect_device(args.device).describe())
    peaks = measured_peaks(args.device)
    print(f"measured bandwidth {peaks.bandwidth / 1e9:.1f} GB/s")
    rows = engine_vs_hf(engine, args.batches, args.new_tokens, args.repeats, peaks.bandwidth)
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(as_dicts(rows), f, indent=1)


if __name__ == "__main__":
    main()
