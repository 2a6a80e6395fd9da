"""Benchmark: model bandwidth utilisation of a batch-1 decode step on a random-weight model of a real shape.

    python benchmarks/decode_mbu.py [--shape llama-3.2-1b] [--device cuda] [--dtype bf16]
                                    [--levers eager fused cudagraph] [--json OUT.json]

MBU = (the bytes a step must read: weights, LM head, KV of the context) / step time / the device's measured
copy-or-triad bandwidth (course_lib.bottlenecks.decode_mbu). Issue 21's goal is the Llama-3.2-1B shape in
bf16 at >= 60% of the measured HBM bandwidth; benchmarks/gpu_check.sh runs this on a lent GPU and the
performance ledger reads the best lever from data/measurements/<gpu>.json. On a CPU: --dtype fp32 and the
levers eager fused native (the 1B shape in fp32 is 4.9 GB: about 0.4 s a step at 12 GB/s). Every lever's
row is printed and written, the slow ones too. Not a test: timings are noisy.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from course_lib.bottlenecks.decode_mbu import DTYPES, GOAL, SHAPES, as_record, best, format_rows, goal_verdict, mbu_rows  # noqa: E402
from course_lib.engine.fast_decode import DECODE_MODES  # noqa: E402
from course_lib.measure.hardware.device import detect_device  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bf16 on a GPU, fp32 on a CPU")
    p.add_argument("--levers", nargs="+", default=None, choices=DECODE_MODES,
                   help="default: eager fused cudagraph on a GPU, eager fused native on a CPU")  # fmt: skip
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="write the record there")
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    dtype = args.dtype or ("bf16" if gpu else "fp32")
    levers = args.levers or (["eager", "fused", "cudagraph"] if gpu else ["eager", "fused", "native"])
    machine = detect_device(args.device).describe()
    print(machine, flush=True)
    rows = mbu_rows(args.shape, args.device, dtype, levers, args.context, args.steps, args.repeats)
    print(format_rows(rows))
    goal_verdict(best(rows), GOAL)  # prints its verdict
    command = "python benchmarks/decode_mbu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    record = as_record(rows, command, machine)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
