"""The command line: ``python -m course_lib.serving.loadgen --url http://127.0.0.1:8000 --n 32 --rate 4``
benchmarks a running server and prints its table. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import math

from course_lib.measure.metrics import SLO
from course_lib.serving.loadgen.http_client import run_load
from course_lib.serving.loadgen.timed_requests import schedule


def main(argv=None) -> None:
    """``python -m course_lib.serving.loadgen --url http://127.0.0.1:8000 --n 32 --rate 4``: benchmark a server."""
    import argparse

    from course_lib.core.paths import data_dir
    from course_lib.models.tokenizer import load_tokenizer
    from course_lib.serving.workload import make_workload, prompt_pool

    ap = argparse.ArgumentParser(prog="python -m course_lib.serving.loadgen", description=main.__doc__)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="tiny-target")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--rate", type=float, default=math.inf, help="requests/s (default: all at once)")
    ap.add_argument("--burstiness", type=float, default=1.0)
    ap.add_argument("--prompt-lens", type=int, nargs=2, default=(16, 128))
    ap.add_argument("--output-median", type=int, default=24)
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--slo-ttft", type=float, default=1.0)
    ap.add_argument("--slo-tpot", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    pool = prompt_pool(load_tokenizer(data_dir() / "models" / "tokenizer"), 4096)
    work = make_workload(
        pool, args.n, prompt_lens=tuple(args.prompt_lens), output_median=args.output_median, seed=args.seed
    )
    timed = schedule(work, args.rate, burstiness=args.burstiness, seed=args.seed)
    result = run_load(
        args.url, timed, model=args.model, slo=SLO(args.slo_ttft, args.slo_tpot), max_concurrency=args.max_concurrency
    )
    print(result.table())


if __name__ == "__main__":
    main()
