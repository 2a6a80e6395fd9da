"""Chapter 05's command line: uptrain a model with fewer KV heads, or time MHA / GQA / MQA decode steps.

    python -m course_lib.kv.cli uptrain --kv-heads 1 --steps 200 --out data/models/tiny-target-mqa
    python -m course_lib.kv.cli bench --kv-heads 8 2 1 --contexts 256 1024

``uptrain`` converts tiny-target's KV heads by mean-pooling, uptrains and saves the checkpoint with its
train_log.json, which records this command (``uptraining.run_uptrain``); ``bench`` prints the rows of
``heads_timing.kv_heads_rows`` (bytes per token, predicted and measured decode step) and can write them
as JSON. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from course_lib.kv.heads_timing import kv_heads_rows
from course_lib.kv.plots import format_kv_rows
from course_lib.kv.uptraining import run_uptrain
from course_lib.models.train import command_line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.kv.cli", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("uptrain", help="convert tiny-target's KV heads by mean-pooling, then uptrain")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--source", default="tiny-target", help="embedded model name or checkpoint folder")
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-tokens", type=int, default=16_384, help="validation tokens at each evaluation")
    p.add_argument("--final-tokens", type=int, default=1_000_000, help="validation tokens, before/after evaluation")
    p.add_argument("--threads", type=int, default=None)
    b = sub.add_parser("bench", help="KV bytes and decode step time of MHA / GQA / MQA random models")
    b.add_argument("--kv-heads", type=int, nargs="+", default=[8, 2, 1])
    b.add_argument("--batch", type=int, default=8)
    b.add_argument("--contexts", type=int, nargs="+", default=[1024])
    b.add_argument("--repeats", type=int, default=10)
    b.add_argument("--threads", type=int, default=None, help="default: the idle cores")
    b.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.cmd == "bench":
        rows = kv_heads_rows(
            tuple(args.kv_heads), args.batch, tuple(args.contexts), repeats=args.repeats, threads=args.threads
        )
        print(f"bandwidth assumed: {rows[0].bandwidth_gbs:.1f} GB/s (measured STREAM), {rows[0].threads} thread(s)")
        print(format_kv_rows(rows))
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    command = command_line("course_lib.kv.cli", argv)
    info = run_uptrain(
        args.out,
        args.kv_heads,
        args.source,
        args.steps,
        args.batch,
        args.seq_len,
        args.lr,
        args.seed,
        args.eval_every,
        args.eval_tokens,
        args.final_tokens,
        args.threads,
        command,
    )
    print(json.dumps(info["final_eval"], indent=1))
    print(f"wall time {info['total_wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
