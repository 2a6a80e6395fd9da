"""Benchmark: serving policies on shipped traces, on the real engine and in the simulator (chapter 06).

    python benchmarks/serving_policies.py [--quick] [--threads 1] [--recalibrate] [--max-num-seqs 16]

1. continuous vs static batching on the same bursty trace (goal: ≥ 3× throughput, p99 TTFT no worse);
2. simulator vs real engine on the same trace and policy (goal: throughput and p50 TPOT within ±20%);
3. chunked prefill vs none when 720-token prompts arrive among running decodes (goal: the running
   decodes' longest inter-token gap cut ≥ 2×);
4. (not with --quick) simulated throughput, p99 TTFT and goodput vs arrival rate per policy.
Every check prints the simulator's prediction first, then the measurement and a PASS/MISS computed from
it. The cost model is calibrated once per machine and cached (``--recalibrate`` to redo it). Timings are
noisy on a shared CPU; not a test.
"""

import argparse
import time

import torch

from course_lib.engine import Engine, SchedulerConfig
from course_lib.engine import scheduler as sched
from course_lib.measure.metrics import SLO
from course_lib.serving import prompt_pool
from course_lib.serving.simulator import compare, load_or_calibrate, run_real, simulate, sweep
from course_lib.serving.traces import load_trace


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def row(label: str, m: dict) -> str:
    return (
        f"{label:<22}{m['throughput']:>9.1f}{m['ttft_p50'] * 1e3:>9.1f}{m['ttft_p99'] * 1e3:>9.1f}"
        f"{m['tpot_p50'] * 1e3:>9.2f}{m['tpot_p99'] * 1e3:>9.2f}{m['max_itl'] * 1e3:>9.1f}"
    )


HEAD = f"{'run':<22}{'tok/s':>9}{'TTFT50':>9}{'TTFT99':>9}{'TPOT50':>9}{'TPOT99':>9}{'maxITL':>9}   (ms)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-target")
    parser.add_argument("--quick", action="store_true", help="skip the rate sweep")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 is steadier on a busy CPU)")
    parser.add_argument("--recalibrate", action="store_true")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the engine's device)")
    parser.add_argument("--dtype", default="fp32", help="the engine's dtype: fp32, fp16 or bf16")
    parser.add_argument("--trace", default="bursty_small", help="shipped trace of the continuous-vs-static run")
    parser.add_argument(
        "--rate", type=float, default=40.0, help="its arrival rate, req/s (0: the trace's own; sharegpt_like: 1000)"
    )
    parser.add_argument("--slo-ttft", type=float, default=1.0, help="s")
    parser.add_argument("--slo-tpot", type=float, default=0.1, help="s")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    slo = SLO(args.slo_ttft, args.slo_tpot)
    engine = Engine(args.model, device=args.device, dtype=args.dtype)
    pool = prompt_pool(engine.tokenizer, 4096)
    t0 = time.perf_counter()
    cost = load_or_calibrate(engine, pool, refresh=args.recalibrate)
    print(
        f"device {args.device} ({args.dtype}), torch threads {torch.get_num_threads()}; cost model ({time.perf_counter() - t0:.1f} s):"
    )
    print(f"  {cost.describe()}")
    n = args.max_num_seqs

    # 1. continuous vs static -------------------------------------------------------------------
    trace = load_trace(args.trace)
    trace = trace.with_rate(args.rate) if args.rate > 0 else trace
    print(
        f"\n1. continuous vs static: {trace.name}, {len(trace)} requests, {trace.output_tokens} output tokens, "
        f"max_num_seqs {n}"
    )
    print(HEAD)
    res, predicted = {}, {}
    for policy in ("continuous", "static"):
        cfg = SchedulerConfig(policy=policy, max_num_seqs=n)
        predicted[policy] = simulate(trace, cfg, cost, pool=pool, slo=slo).metrics()
        print(row(f"{policy} (sim)", predicted[policy]))
        res[policy] = run_real(engine, trace, cfg, pool=pool, slo=slo).metrics()
        print(row(f"{policy} (real)", res[policy]))
    speedup = res["continuous"]["throughput"] / res["static"]["throughput"]
    ttft_ok = res["continuous"]["ttft_p99"] <= res["static"]["ttft_p99"]
    print(f"throughput continuous / static = {speedup:.2f}× (goal ≥ 3×): {verdict(speedup >= 3)}")
    print(
        f"  the simulator predicted {predicted['continuous']['throughput'] / predicted['static']['throughput']:.2f}×; "
        f"a decode row costs c/a = {cost.c / cost.a:.2f} of a step's fixed cost here (the smaller, the more a "
        f"static batch's idle rows waste and the larger continuous batching's gain)"
    )
    print(
        f"p99 TTFT continuous {res['continuous']['ttft_p99'] * 1e3:.0f} ms vs static "
        f"{res['static']['ttft_p99'] * 1e3:.0f} ms (goal: equal or better): {verdict(ttft_ok)}"
    )

    # 2. simulator vs real ----------------------------------------------------------------------
    trace = load_trace("poisson_small")
    print(f"\n2. simulator vs real: {trace.name}, continuous, max_num_seqs {n}")
    cmp = compare(engine, trace, SchedulerConfig(policy="continuous", max_num_seqs=n), cost, pool=pool, slo=slo)
    print(cmp.table())
    rat = cmp.ratios()
    for key in ("throughput", "tpot_p50"):
        print(f"{key}: sim/real = {rat[key]:.2f} (goal 0.80-1.20): {verdict(abs(rat[key] - 1) <= 0.2)}")
    print(f"steps: sim {len(cmp.sim.steps)}, real {len(cmp.real.steps)}")

    # 3. chunked prefill ------------------------------------------------------------------------
    trace = load_trace("long_prompts")
    short = [i for i, r in enumerate(trace.requests) if r.prompt_len < 200]
    print(f"\n3. chunked prefill: {trace.name}, {len(short)} decoding requests, {len(trace) - len(short)} long prompts")
    print(HEAD)
    gaps = {}
    for label, cfg in (
        ("no chunking, 1024", SchedulerConfig(max_num_seqs=n, max_num_batched_tokens=1024, chunked_prefill=False)),
        ("chunked, 64", SchedulerConfig(max_num_seqs=n, max_num_batched_tokens=64, chunked_prefill=True)),
    ):
        sim = simulate(trace, cfg, cost, pool=pool, slo=slo)
        real = run_real(engine, trace, cfg, pool=pool, slo=slo)
        print(row(f"{label} (sim)", sim.metrics()) + f"   decoders' max gap {sim.max_itl(short) * 1e3:.1f}")
        print(row(f"{label} (real)", real.metrics()) + f"   decoders' max gap {real.max_itl(short) * 1e3:.1f}")
        gaps[label] = real.max_itl(short)
    cut = gaps["no chunking, 1024"] / gaps["chunked, 64"]
    print(f"decoders' longest gap cut by chunking: {cut:.2f}× (goal ≥ 2×): {verdict(cut >= 2)}")

    # 4. sweep ----------------------------------------------------------------------------------
    if args.quick:
        return
    trace = load_trace("poisson_small")
    rates = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
    configs = {p: SchedulerConfig(policy=p, max_num_seqs=n) for p in sched.POLICIES}
    print(f"\n4. simulated sweep on {trace.name} (SLO: TTFT ≤ {slo.ttft_s} s, TPOT ≤ {slo.tpot_s} s)")
    print(f"{'policy':<12}{'rate':>7}{'tok/s':>9}{'TTFT99 ms':>11}{'TPOT50 ms':>11}{'goodput/s':>11}{'SLO met':>9}")
    for pt in sweep(trace, configs, rates, cost, slo=slo):
        m = pt.metrics
        print(
            f"{pt.policy:<12}{pt.rate:>7g}{m['throughput']:>9.1f}{m['ttft_p99'] * 1e3:>11.1f}"
            f"{m['tpot_p50'] * 1e3:>11.2f}{m['goodput_rps']:>11.2f}{m['slo_attainment']:>9.0%}"
        )


if __name__ == "__main__":
    main()
