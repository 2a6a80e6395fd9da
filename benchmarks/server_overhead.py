"""Benchmark: what the HTTP server adds to p50 TPOT over in-process generation (chapter 06's ≤ 10% goal).

    python benchmarks/server_overhead.py [--requests 48] [--rate 8] [--tokens 32] [--rounds 3] [--threads 1]
        [--layout processes|one-process] [--json data/measurements/server-tpot-cpu.json]

The same timed requests (vLLM-style: ``ignore_eos``, streaming, open loop) go three ways, in interleaved
rounds so that a burst of load on the machine hits all three alike:
  in-process      ``loadgen.measure_engine``: add_request/step on a worker thread, no HTTP;
  thread server   ``python -m course_lib.serving.server --engine thread``: uvicorn and the engine loop thread
                  in one process (one GIL);
  process server  ``python -m course_lib.serving.server`` (``--engine process``, its default): the engine
                  steps in a child process (vLLM's AsyncLLM layout).
``--layout processes`` (the default) runs each server as a process of its own (``server.spawn``), as it is
deployed, and the load generator (httpx, streaming) here, as a client would. ``--layout one-process`` starts
both servers inside this process (``server.serve``, as chapter 06 does in a notebook): the client's Python
then shares the thread server's interpreter lock, which a deployment never does.
An untimed warm-up round comes first (each engine meets its first batch shapes and packs its weights then).
Prints each round's p50 TPOT and TTFT, then the median over rounds and a PASS/MISS for each server against
the goal (≤ 10% over in-process). Greedy outputs are checked identical across the three.
Then issue 21's goal (the performance ledger's): each run's p50 TPOT ÷ the engine's own decode step at the
batch that run decoded at (``serving.server_tpot_record``: the batch from the client's token times, the step
timed in-process with that many requests decoding and nothing else, in every round right after its runs),
≤ 1.3× for the default server (the process server; the thread server's ratio beside it); written with the machine, the load average, the layout, the versions and the
command to ``--json`` (``--json ''`` writes nothing). Not a test.
"""

import argparse
import contextlib
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from course_lib.engine import Engine
from course_lib.measure.metrics import SLO
from course_lib.serving import loadgen, prompt_pool, server
from course_lib.serving import server_tpot_record as rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-target")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=8.0, help="requests/s (Poisson)")
    ap.add_argument("--tokens", type=int, default=32, help="output tokens per request (EOS ignored)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every engine")
    ap.add_argument("--goal", type=float, default=0.10, help="vs in-process TPOT (the ledger's goal is separate)")
    ap.add_argument(
        "--json",
        default=str(Path(__file__).resolve().parents[1] / "data" / "measurements" / rec.OUT),
        help="where to write the record ('' for nowhere)",
    )
    ap.add_argument(
        "--layout",
        choices=("processes", "one-process"),
        default="processes",
        help="servers as processes of their own (deployed) or inside this process, beside the client",
    )
    ap.add_argument("--pin-child", action="store_true", help="pin only the engine process, to the last CPU")
    ap.add_argument("--no-thread-server", action="store_true", help="compare in-process with the process server only")
    ap.add_argument(
        "--pin",
        action="store_true",
        help="pin this process (HTTP side, client, in-process baseline) to the first CPU, the engine process to the last",
    )
    args = ap.parse_args()
    for name in ("requests", "tokens", "prompt_tokens", "rounds", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.rate <= 0:
        ap.error(f"--rate must be > 0, got {args.rate:g}")
    if (args.pin or args.pin_child) and args.layout != "one-process":
        ap.error("--pin and --pin-child need --layout one-process (they pin this process's EngineProcess)")
    load_before = os.getloadavg()
    torch.set_num_threads(args.threads)
    cpus = {max(os.sched_getaffinity(0))} if args.pin_child else None
    if args.pin:
        mine = sorted(os.sched_getaffinity(0))
        if len(mine) < 2:
            raise SystemExit("--pin needs two CPUs")
        os.sched_setaffinity(0, {mine[0]})
        cpus = {mine[-1]}
    eng = Engine(args.model)
    pool = prompt_pool(eng.tokenizer, 4096)
    step = args.prompt_tokens + 8
    if args.requests * step > len(pool):
        raise SystemExit(f"--requests × (--prompt-tokens + 8) must fit the {len(pool)}-token prompt pool")
    reqs = loadgen.schedule(
        [
            loadgen.TimedRequest(0.0, eng.tokenizer.decode(pool[i * step : i * step + args.prompt_tokens]), args.tokens)
            for i in range(args.requests)
        ],
        rate=args.rate,
        seed=0,
    )
    slo = SLO(1.0, 0.1)
    print(
        f"{args.model}, {args.requests} requests × {args.tokens} tokens at {args.rate:g} req/s, "
        f"torch threads {args.threads}, {args.rounds} rounds"
    )
    t0 = time.perf_counter()
    steps_per_round: list[dict] = []
    with contextlib.ExitStack() as stack:
        if args.layout == "processes":
            proc_srv = stack.enter_context(server.spawn(args.model, engine="process", threads=args.threads))
            thread_srv = stack.enter_context(server.spawn(args.model, engine="thread", threads=args.threads))
        else:
            proc_srv = stack.enter_context(
                server.serve(server.EngineProcess(args.model, threads=args.threads, cpus=cpus))
            )
            thread_srv = stack.enter_context(server.serve(Engine(args.model)))
        print(f"servers up in {time.perf_counter() - t0:.1f} s ({args.layout})")
        runs: dict[str, list] = {"in-process": [], "thread server": [], "process server": []}
        if args.no_thread_server:
            del runs["thread server"]
        print(f"{'round':<6}{'run':<16}{'TPOT p50 ms':>12}{'TTFT p50 ms':>12}{'tok/s':>8}")
        for r in range(-args.warmup_rounds, args.rounds):  # negative rounds warm up (first shapes, packed weights)
            for name in runs:
                if name == "in-process":
                    res = loadgen.measure_engine(eng, reqs, slo=slo)
                else:
                    res = loadgen.run_load((thread_srv if name == "thread server" else proc_srv).url, reqs, slo=slo)
                bad = [x.error for x in res.results if not x.ok]
                if bad:
                    raise SystemExit(f"{name}: {len(bad)} requests failed, e.g. {bad[0]}")
                if r < 0:
                    continue
                runs[name].append(res)
                print(
                    f"{r:<6}{name:<16}{res.p('tpot') * 1e3:>12.2f}{res.p('ttft') * 1e3:>12.1f}"
                    f"{res.output_tokens_per_s:>8.0f}"
                )
            if r >= 0:  # the denominator, timed now: under the same load as this round's runs
                batches = rec.batches_to_time({name: v[-1] for name, v in runs.items()})
                steps_per_round.append(
                    rec.step_times(eng, batches, prompt_tokens=args.prompt_tokens, steps=args.tokens, repeats=3)
                )
                print(
                    f"{r:<6}{'decode step':<16}"
                    + ", ".join(f"batch {b} {t * 1e3:.2f} ms" for b, t in steps_per_round[-1].items())
                )
    texts = [[x.text for x in rs[0].results] for rs in runs.values()]
    print("greedy outputs identical across the runs:", all(t == texts[0] for t in texts))
    base = statistics.median(x.p("tpot") for x in runs["in-process"])
    print(f"\nmedian over rounds of p50 TPOT: in-process {base * 1e3:.2f} ms")
    for name in [n for n in runs if n != "in-process"]:
        med = statistics.median(x.p("tpot") for x in runs[name])
        rel = med / base - 1
        verdict = "PASS" if rel <= args.goal else "MISS"
        print(f"  {name:<15} {med * 1e3:.2f} ms → {rel:+.1%} (goal ≤ {args.goal:.0%}): {verdict}")

    from course_lib.measure.hardware import detect_device

    meta = {
        "machine": detect_device("cpu").describe(),
        "date": time.strftime("%Y-%m-%d"),
        "command": ("python benchmarks/server_overhead.py " + shlex.join(sys.argv[1:])).strip(),
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "model": args.model,
        "requests": args.requests,
        "rate_req_s": args.rate,
        "output_tokens": args.tokens,
        "prompt_tokens": args.prompt_tokens,
        "threads": args.threads,
        "layout": args.layout,
        "pin": args.pin,
        "pin_child": args.pin_child,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "greedy_identical": all(t == texts[0] for t in texts),
    }
    record = rec.build_record(runs, steps_per_round, meta)
    for name, m in record["median_over_rounds"].items():
        print(
            f"  {name:<15} p50 TPOT {m['tpot_p50_ms']:.2f} ms at batch {m['batch']:.2f}: step there "
            f"{m['step_ms_at_batch']:.2f} ms → {m['tpot_over_step']:.2f}×"
        )
    verdict = "met" if record["met"] else "missed"
    print(f"ledger goal ({record['ratio_run']}): {record['ratio']:.2f}× ≤ {rec.GOAL:g}×: {verdict}")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":  # the engine process is spawned: it re-imports this file, which must not run main()
    main()
