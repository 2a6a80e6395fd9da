"""Benchmark: static (request-level) vs continuous (iteration-level) batching on one mixed workload.

    python benchmarks/continuous_vs_static.py [--requests 48] [--max-num-seqs 8] [--rate 0]

The same seeded requests (prompts 16-256 tokens, long-tailed output lengths) go through the same engine
twice, once per policy; the tokens are identical (tests/test_engine_loop.py), only the timing differs.
``--rate 0`` means every request arrives at once (a burst); a positive rate adds them between steps as a
Poisson process of that many requests per second. Prints throughput and latency percentiles. Chapter 06
owns the goals; this is the engine-architecture issue's report. Not a test: timings are noisy.
"""

import argparse
import time

import numpy as np

from course_lib.engine import Engine, SamplingParams, SchedulerConfig
from course_lib.measure.metrics import RequestTrace, summarize
from course_lib.serving import make_workload, prompt_pool


def run(engine: Engine, workload, arrivals) -> tuple[list[RequestTrace], float]:
    """Add request i at time ``arrivals[i]`` (s after start, between steps); step until everything is done."""
    order = sorted(range(len(workload)), key=lambda i: arrivals[i])
    seqs, start = {}, time.perf_counter()
    while order or engine.has_unfinished():
        now = time.perf_counter() - start
        while order and arrivals[order[0]] <= now:
            i = order.pop(0)
            r = workload[i]
            seqs[i] = engine.add_request(
                list(r.prompt_ids),
                SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True),
                arrival=start + arrivals[i],
            )
        if not engine.step() and order and not engine.has_unfinished():
            time.sleep(max(0.0, arrivals[order[0]] - (time.perf_counter() - start)))
    return [seqs[i].trace for i in range(len(workload))], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-target")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s (Poisson); 0 = all at once")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    base = Engine(args.model)
    pool = prompt_pool(base.tokenizer, 8192)
    workload = make_workload(
        pool, args.requests, prompt_lens=(16, 256), output_median=24, output_max=128, seed=args.seed
    )
    rng = np.random.default_rng(args.seed)
    arrivals = (
        np.cumsum(rng.exponential(1 / args.rate, args.requests)) if args.rate > 0 else np.zeros(args.requests)
    ).tolist()
    print(
        f"{args.requests} requests, {sum(r.max_new_tokens for r in workload)} output tokens, "
        f"max_num_seqs {args.max_num_seqs}, arrivals: {'burst' if args.rate <= 0 else f'Poisson {args.rate}/s'}"
    )
    for policy in ("static", "continuous"):
        engine = Engine(
            base.hf_model, base.tokenizer, config=SchedulerConfig(policy=policy, max_num_seqs=args.max_num_seqs)
        )
        run(engine, workload[:4], [0.0] * 4)  # warm-up
        traces, wall = run(engine, workload, arrivals)
        s = summarize(traces)
        out = sum(t.n_output for t in traces)
        print(
            f"{policy:>10}: {out / wall:7.1f} output tok/s, wall {wall:5.2f} s | latency p50 {s.latency[50] * 1e3:6.0f} ms "
            f"p99 {s.latency[99] * 1e3:6.0f} ms | TTFT p50 {s.ttft[50] * 1e3:6.0f} ms p99 {s.ttft[99] * 1e3:6.0f} ms"
        )


if __name__ == "__main__":
    main()
