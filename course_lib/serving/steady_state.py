"""A steady-state load sweep: throughput and p99 TPOT against the arrival rate, measured on a long Poisson
trace after its warm-up, not on a burst of a few dozen requests that starts and ends empty. Each rate gets a
fresh seeded trace (``traces.make_trace``) simulated through the engine's own scheduler
(``simulator.simulate``); the window counted is from the arrival of the ``warmup`` share of requests to the
last arrival, so the queue has filled and never drains. Below saturation throughput follows the offered
load; past it, throughput flattens at the server's capacity while the queue, and TTFT, grow without bound.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SteadyPoint:
    """One rate's steady window: offered and delivered output tokens/s, p99 TPOT and TTFT of its requests."""

    rate: float
    offered_tok_s: float
    throughput_tok_s: float
    tpot_p99_s: float
    ttft_p99_s: float
    requests: int


def steady_sweep(cost_model, config, rates, *, n_requests: int = 400, warmup: float = 0.25, seed: int = 0, **trace_kw):
    """``SteadyPoint`` per rate. ``trace_kw`` go to ``make_trace`` (lengths; poisson arrivals by default)."""
    from course_lib.serving.simulator.virtual_clock import simulate
    from course_lib.serving.traces import make_trace

    rates = [float(r) for r in rates]
    if not rates or any(not r > 0 for r in rates):
        raise ValueError(f"rates must be positive numbers of requests/s, got {rates!r}")
    if not 0 <= warmup < 0.9:
        raise ValueError(f"warmup must be a share of the requests in [0, 0.9), got {warmup!r}")
    arrival = trace_kw.pop("arrival", "poisson")
    out = []
    for rate in rates:
        trace = make_trace(n_requests, rate, arrival=arrival, seed=seed, **trace_kw)
        res = simulate(trace, config, cost_model)
        arrivals = sorted(t.arrival for t in res.traces)
        t0, t1 = arrivals[int(warmup * len(arrivals))], arrivals[-1]
        tokens = sum(sum(t0 <= x <= t1 for x in t.token_times) for t in res.traces)
        steady = [t for t in res.traces if t0 <= t.arrival <= t1]
        offered = sum(r.max_new_tokens for r in trace.requests if t0 <= r.arrival_s <= t1) / (t1 - t0)
        tpots = [t.tpot for t in steady if len(t.token_times) > 1]
        out.append(
            SteadyPoint(
                rate,
                offered,
                tokens / (t1 - t0),
                float(np.percentile(tpots, 99)),
                float(np.percentile([t.ttft for t in steady], 99)),
                len(steady),
            )
        )
    return out


def saturation_rate(points, share: float = 0.9) -> float | None:
    """The lowest swept rate whose delivered throughput falls below ``share`` of its offered load (the
    server has saturated there), or None if none did (the sweep stopped below capacity)."""
    for p in sorted(points, key=lambda p: p.rate):
        if p.throughput_tok_s < share * p.offered_tok_s:
            return p.rate
    return None


def plot_steady(points, ax_pair=None, title: str | None = None):
    """Delivered vs offered tokens/s (the diagonal is the offered load), and p99 TPOT and TTFT vs rate."""
    import matplotlib.pyplot as plt

    if ax_pair is None:
        _, ax_pair = plt.subplots(1, 2, figsize=(11, 3.4), dpi=80)
    left, right = ax_pair
    off = [p.offered_tok_s for p in points]
    left.plot(off, [p.throughput_tok_s for p in points], "o-", label="delivered (steady window)")
    left.plot(off, off, "k--", lw=1, label="offered load (throughput = arrivals)")
    left.set(xlabel="offered load (output tok/s)", ylabel="throughput (output tok/s)")
    left.set_title("Throughput follows the load, then flattens at capacity", fontsize=9)
    left.legend(fontsize=7)
    rates = [p.rate for p in points]
    right.plot(rates, [p.tpot_p99_s * 1e3 for p in points], "o-", label="p99 TPOT")
    right.plot(rates, [p.ttft_p99_s * 1e3 for p in points], "s-", label="p99 TTFT")
    right.set(xlabel="arrival rate (req/s)", ylabel="ms", yscale="log")
    right.set_title(title or "Past capacity the queue grows: TTFT explodes, TPOT plateaus", fontsize=9)
    right.legend(fontsize=7)
    return ax_pair
