"""The figures of chapter 07: the α–β fit against message size, a (tp, pp) plan, and a pipeline timeline.

Each draws on a Figure of its own (no pyplot state, so a cell re-run or a widget thread cannot draw on
another cell's figure) and returns it: ``plot_alpha_beta`` (measured collectives and the fitted model,
log-log, with datasheet links for scale), ``plot_plan`` (memory per GPU and time per token of each split
of ``course_lib.parallel.planning``), ``plot_timeline`` (one row per pipeline stage, one bar per
micro-batch: the GPipe schedule, simulated or measured), ``plot_decode_trace`` (per rank: compute, time
blocked in a receive, and the messages of pipelined decode). Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from course_lib.measure.plots import DPI, FIGSIZE
from course_lib.parallel.alpha_beta import AlphaBetaFit, fmt_bytes
from course_lib.parallel.collectives import OPS
from course_lib.parallel.interconnects import collective_time, link
from course_lib.parallel.planning import ParallelEstimate
from course_lib.parallel.pp_schedule import Timeline, bubble_fraction


def _figure(figsize=FIGSIZE) -> Figure:
    fig = Figure(figsize=figsize, dpi=DPI)  # its own figure, not pyplot's global one
    FigureCanvasAgg(fig)  # renders without pyplot
    return fig


def plot_alpha_beta(fit, links_to_show=("nvlink4", "pcie4_x16"), marks=None):
    """Measured times (markers) and the fitted model (lines) per op against message size, log-log, for one
    ``AlphaBetaFit`` or several (e.g. ``fit_by_op(...).values()``); a fit's knee as a dotted vertical line,
    ``marks`` ({label: bytes}, e.g. the last-level cache) dashed grey; the datasheet links' all-reduce
    predictions dashed for scale. Returns a matplotlib Figure."""
    import numpy as np

    fits = [fit] if isinstance(fit, AlphaBetaFit) else list(fit)
    if not fits or not all(isinstance(f, AlphaBetaFit) for f in fits):
        raise ValueError("fit must be an AlphaBetaFit or a non-empty sequence of them (fit_by_op(...).values())")
    fig = _figure()
    ax = fig.add_subplot()
    timings = [t for f in fits for t in f.timings]
    sizes = np.array(sorted({t.nbytes for t in timings}), dtype=float)
    x = np.logspace(np.log10(sizes.min()), np.log10(sizes.max()), 200)
    markers = dict(zip(OPS, "osD"))
    for f in fits:
        for op in OPS:
            points = [t for t in f.timings if t.op == op]
            if not points:
                continue
            p = points[0].p
            (line,) = ax.plot(
                [t.nbytes for t in points], [t.seconds for t in points], markers[op], label=f"{op} measured"
            )
            model = "two-regime α–β fit" if f.knee_bytes is not None else "α–β fit"
            ax.plot(x, [f.predict(op, n, p) for n in x], "-", color=line.get_color(), label=f"{op} {model}")
            if f.knee_bytes is not None:
                ax.axvline(f.knee_bytes, color=line.get_color(), ls=":", lw=1)
    for name, nbytes in (marks or {}).items():
        ax.axvline(nbytes, color="grey", ls="--", lw=1)
        ax.text(nbytes, 0.02, f"{name} ", transform=ax.get_xaxis_transform(), fontsize=7, color="grey", ha="right")
    p = timings[0].p
    for key in links_to_show:
        lk = link(key)
        ax.plot(x, [collective_time("all_reduce", n, p, lk) for n in x], "--", lw=1, label=f"all_reduce, {lk.name}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("seconds")
    if len(fits) == 1:
        f = fits[0]
        title = f"{f.label}: α = {f.alpha * 1e6:.0f} µs, 1/β = {f.gbps:.2f} GB/s"
        if f.knee_bytes is not None:
            title += f", above {fmt_bytes(f.knee_bytes)} {f.gbps_large:.2f} GB/s"
    else:
        title = "measured (markers) and fitted (lines); dotted: a fit's knee"
    ax.set_title(f"{title} (p = {p})", fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    fig.subplots_adjust(right=0.66)  # the legend goes beside the axes, never over the points
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def plot_plan(plan: list[ParallelEstimate]):
    """Memory per GPU (with the GPU's capacity) and token latency for each (tp, pp) of a plan."""
    if not plan:
        raise ValueError("plan must be a non-empty list of ParallelEstimate (from parallel_plan)")
    fig = _figure((9, 3.5))
    ax_mem, ax_t = fig.subplots(1, 2)
    labels = [f"TP{e.tp}·PP{e.pp}" for e in plan]
    xs = range(len(plan))
    gib = 2**30
    ax_mem.bar(xs, [e.memory.weights / gib for e in plan], label="weights")
    ax_mem.bar(xs, [e.memory.kv / gib for e in plan], bottom=[e.memory.weights / gib for e in plan], label="KV")
    ax_mem.axhline(0.9 * plan[0].memory.capacity / gib, color="k", ls="--", lw=1, label="90% of GPU memory")
    ax_mem.set_ylabel("GiB per GPU")
    ax_t.bar(xs, [e.pp * e.compute_s * 1e3 for e in plan], label="compute")
    ax_t.bar(
        xs,
        [(e.latency_s - e.pp * e.compute_s) * 1e3 for e in plan],
        bottom=[e.pp * e.compute_s * 1e3 for e in plan],
        label="communication",
    )
    ax_t.set_ylabel("ms per token (TPOT)")
    for ax in (ax_mem, ax_t):
        ax.set_xticks(list(xs), labels, rotation=60, fontsize=7)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # head-room: the legend sits above the tallest bar
        ax.legend(fontsize=7, loc="upper center", ncol=3, frameon=False)
    fig.suptitle(f"{plan[0].model}, batch {plan[0].batch}")
    fig.tight_layout()
    return fig


def plot_timeline(timeline: Timeline, *, ax=None, title: str | None = None):
    """One row per stage (stage 0 on top), one bar per micro-batch and step, coloured by micro-batch: the
    cooks on a line. Draws on a Figure of its own (no pyplot state) unless ``ax`` is given; returns (fig, ax)."""
    if not timeline.slots:
        raise ValueError("the timeline has no slots to draw")
    if ax is None:
        ax = _figure().add_subplot()
    fig = ax.figure
    origin = min(s.start for s in timeline.slots)
    span = float(timeline.makespan)
    scale, unit = (1e3, "ms") if timeline.unit == "s" else (1.0, timeline.unit)
    colors = [f"C{j % 10}" for j in range(timeline.micro_batches)]
    for s in timeline.slots:
        x0, w = float(s.start - origin) * scale, float(s.end - s.start) * scale
        ax.barh(s.stage, w, left=x0, height=0.7, color=colors[s.micro], edgecolor="black", lw=0.5)
        if w > 0.03 * span * scale:
            label = f"{s.micro}" if s.step == 0 else f"{s.micro}·{s.step}"
            ax.text(x0 + w / 2, s.stage, label, ha="center", va="center", fontsize=7)
    p, m = timeline.stages, timeline.micro_batches
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(
        title
        or f"p={p} stages, m={m} micro-batches: bubble {float(timeline.bubble()):.3f} "
        f"(formula (p−1)/(m+p−1) = {bubble_fraction(p, m):.3f})",
        fontsize=9,
    )
    ax.grid(True, axis="x", alpha=0.25)
    fig.tight_layout()
    return fig, ax


def plot_decode_trace(timeline: Timeline, steps=None, *, ax=None, title: str | None = None):
    """Per-rank trace of pipelined decode: each stage's compute slots (coloured by micro-batch, labelled
    micro·step), the time it sat blocked in a receive (grey, from ``Slot.wait`` to the slot's start), and
    an arrow per message (activations to the next stage, tokens back to stage 0), for the decode ``steps``
    given (default: the first three). Returns (fig, ax)."""
    keep = set(steps) if steps is not None else set(sorted({s.step for s in timeline.slots if s.step > 0})[:3])
    slots = [s for s in timeline.slots if s.step in keep]
    if not slots:
        raise ValueError(f"the timeline has no slots in decode steps {sorted(keep)}")
    if ax is None:
        ax = _figure().add_subplot()
    fig = ax.figure
    origin, p = min(s.wait if s.wait is not None else s.start for s in slots), timeline.stages
    ms = 1e3
    by = {(s.stage, s.step, s.micro): s for s in timeline.slots}
    for s in slots:
        x0, w = (s.start - origin) * ms, (s.end - s.start) * ms
        ax.barh(s.stage, w, left=x0, height=0.6, color=f"C{s.micro % 10}", edgecolor="black", lw=0.5)
        ax.text(x0 + w / 2, s.stage, f"{s.micro}·{s.step}", ha="center", va="center", fontsize=6)
        if s.wait is not None and s.start > s.wait:
            ax.barh(s.stage, (s.start - s.wait) * ms, left=(s.wait - origin) * ms, height=0.25, color="0.6")
        src = by.get((s.stage - 1, s.step, s.micro)) if s.stage else by.get((p - 1, s.step - 1, s.micro))
        if src is not None and src.step in keep:
            ax.annotate(
                "",
                xy=((s.start - origin) * ms, s.stage),
                xytext=((src.end - origin) * ms, src.stage),
                arrowprops=dict(arrowstyle="->", lw=0.6, color="0.3"),
            )
    ax.legend(
        handles=[Patch(color="0.6", label="blocked in a receive")],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7,
        frameon=False,
    )
    ax.set_yticks(range(p), [f"rank {s}" for s in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlabel("ms")
    ax.set_title(title or f"decode steps {sorted(keep)}: compute, waits and messages per rank", fontsize=9)
    ax.grid(True, axis="x", alpha=0.25)
    fig.tight_layout()
    return fig, ax


__all__ = ["plot_alpha_beta", "plot_decode_trace", "plot_plan", "plot_timeline"]
