"""Priority scheduling against first come, first served, on a mixed trace: whose SLO does the queue serve?

A server often carries two classes at once: interactive chat (short prompts, short answers, a tight TTFT
target) and batch work (long prompts, long answers, no one waiting on the first token). Under FCFS an
interactive request that arrives behind a few batch requests waits for their admission; an SLO-aware
scheduler admits by class instead (vLLM's ``--scheduling-policy priority``). ``mixed_trace`` builds such a
trace (``load_for`` scales its rate and TTFT target to a cost model); ``compare_admission`` replays it in the
virtual-clock simulator (``simulator.simulate``, the engine's own ``Scheduler`` with
``SchedulerConfig(admission="priority")``) under both policies and returns each class's TTFT percentiles and
SLO attainment, so the notebook can show both the gain of the interactive class and its price, paid by the
batch class. Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from course_lib.engine.scheduler import SchedulerConfig
from course_lib.serving.traces import Trace, TraceRequest

CLASSES = ("interactive", "batch")


def mixed_trace(
    n: int = 60,
    rate: float = 20.0,
    interactive_share: float = 0.5,
    interactive=(32, 16),
    batch=(256, 96),
    seed: int = 0,
) -> tuple[Trace, list[int]]:
    """``n`` Poisson arrivals at ``rate`` req/s, each interactive (priority 0; (prompt, output) tokens
    ``interactive``) with probability ``interactive_share``, else batch (priority 1, ``batch``). Returns the
    trace and the priorities."""
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int ≥ 2, got {n!r}")
    if not 0 < interactive_share < 1:
        raise ValueError(f"interactive_share must be in (0, 1), got {interactive_share!r}")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate!r}")
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    t -= t[0]
    is_int = rng.random(n) < interactive_share
    reqs, prio = [], []
    for k in range(n):
        p, o = interactive if is_int[k] else batch
        reqs.append(TraceRequest(float(t[k]), int(p), int(o), offset=(37 * k) % 1024))
        prio.append(0 if is_int[k] else 1)
    meta = {"generator": "priority.mixed_trace", "rate": rate, "seed": seed, "interactive_share": interactive_share}
    return Trace(reqs, name="mixed_priority", meta=meta), prio


def class_stats(result, priorities: list[int], ttft_slo_s: float) -> dict:
    """{class: {"n", "ttft_p50", "ttft_p99", "attainment"}} of one replay; attainment = share with
    TTFT ≤ ``ttft_slo_s``."""
    out = {}
    for q, name in enumerate(CLASSES):
        tt = np.array([tr.ttft for tr, p in zip(result.traces, priorities) if p == q])
        if len(tt) == 0:
            raise ValueError(f"the trace has no {name} request (priority {q})")
        out[name] = {
            "n": int(len(tt)),
            "ttft_p50": float(np.percentile(tt, 50)),
            "ttft_p99": float(np.percentile(tt, 99)),
            "attainment": float(np.mean(tt <= ttft_slo_s + 1e-12)),
        }
    return out


def compare_admission(trace: Trace, priorities: list[int], config: SchedulerConfig, cost, ttft_slo_s: float, **kw):
    """{"fcfs": class_stats, "priority": class_stats}: the same trace and cost model under both admissions."""
    from course_lib.serving.simulator import simulate

    out = {}
    for adm in ("fcfs", "priority"):
        cfg = dataclasses.replace(config, admission=adm)
        res = simulate(trace, cfg, cost, priorities=priorities, **kw)
        out[adm] = class_stats(res, priorities, ttft_slo_s)
    return out


def plot_admission(stats: dict, ttft_slo_s: float):
    """Bars of each class's TTFT p50 / p99 under both admissions, the SLO dashed, on a Figure of its own."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.2), dpi=80)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    x = np.arange(2)
    for ax, name in zip(axes, CLASSES):
        for k, adm in enumerate(("fcfs", "priority")):
            s = stats[adm][name]
            vals = [s["ttft_p50"] * 1e3, s["ttft_p99"] * 1e3]
            ax.bar(x + (k - 0.5) * 0.38, vals, 0.38, label=f"{adm} (in SLO: {s['attainment']:.0%})")
        ax.axhline(ttft_slo_s * 1e3, ls="--", c="grey", lw=1, label=f"interactive TTFT SLO {ttft_slo_s * 1e3:g} ms")
        ax.set(xticks=x, xticklabels=["TTFT p50", "TTFT p99"], ylabel="ms", title=f"{name} requests")
        ax.legend(fontsize=7)
    fig.suptitle("Priority admission buys the interactive class its TTFT; the batch class pays", fontsize=10)
    fig.tight_layout()
    return fig


def attainment_lift(stats: dict) -> float:
    """The notebook's verdict quantity: the interactive class's SLO attainment under priority ÷ under FCFS."""
    return stats["priority"]["interactive"]["attainment"] / max(stats["fcfs"]["interactive"]["attainment"], 1e-9)


def load_for(cost, slots: int, interactive=(32, 16), batch=(256, 96), interactive_share: float = 0.5, load=1.0):
    """(rate, TTFT target) scaled to a cost model, so the experiment means the same on a fast or a slow
    machine: ``capacity`` = slots ÷ (a request's mean slot time: its prefill step plus one full-batch decode
    step per output token); rate = ``load`` × capacity; the target = 3 ÷ capacity, three mean gaps between
    two finishing requests (the wait for a free slot that priority admission cannot remove)."""
    if not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be a positive int, got {slots!r}")
    if not load > 0:
        raise ValueError(f"load must be > 0, got {load!r}")
    mean_ctx = interactive_share * sum(interactive) + (1 - interactive_share) * sum(batch)
    decode_step = cost.step_time(0, slots, int(slots * mean_ctx))
    slot_s = 0.0
    for (p, o), w in ((interactive, interactive_share), (batch, 1 - interactive_share)):
        slot_s += w * (cost.step_time(p, slots - 1, int((slots - 1) * mean_ctx)) + (o - 1) * decode_step)
    capacity = slots / slot_s
    return load * capacity, 3.0 / capacity
