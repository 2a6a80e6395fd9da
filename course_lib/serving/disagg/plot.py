"""The plot of a disaggregation sweep: TTFT, TPOT, the longest stall between two tokens and goodput per GPU
against request rate, one line per setup, on a Figure of its own. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from course_lib.measure.metrics import SLO


def plot_disagg_sweep(rows: list[dict], slo: SLO | None = None, p: int = 90):
    """Panels on a Figure of its own, one line per setup vs request rate: p-th percentile TTFT and TPOT (SLO
    lines dashed), p99 of each request's longest stall between two tokens (the prefill interference), and,
    with rows swept under an SLO, goodput per GPU."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not rows:
        raise ValueError("rows must be the non-empty output of sweep_rates")
    if f"ttft_p{p}" not in rows[0]:
        raise ValueError(f"p must be one of the swept percentiles (50, 90, 99), got {p!r}")
    panels = [  # (key, scale, y label, SLO line, title)
        (
            f"ttft_p{p}",
            1e3,
            f"TTFT p{p} (ms)",
            None if slo is None else slo.ttft_s * 1e3,
            "first token: queue + prefill",
        ),
        (f"tpot_p{p}", 1e3, f"TPOT p{p} (ms)", None if slo is None else slo.tpot_s * 1e3, "per token: decode + stalls"),
        ("max_itl_p99", 1e3, "longest stall p99 (ms)", None, "a prefill stalls colocated decodes"),
    ]
    if "goodput_per_gpu" in rows[0]:
        panels.append(("goodput_per_gpu", 1.0, "goodput (req/s per GPU in SLO)", None, "what each GPU serves in SLO"))
    fig = Figure(figsize=(3.4 * len(panels), 3.2), dpi=90)
    FigureCanvasAgg(fig)  # renders without pyplot state
    axes = fig.subplots(1, len(panels))
    for s in dict.fromkeys(r["setup"] for r in rows):
        mine = [r for r in rows if r["setup"] == s]
        for ax, (key, scale, *_rest) in zip(axes, panels):
            ax.plot([r["rate"] for r in mine], [r[key] * scale for r in mine], marker="o", label=s)
    for ax, (_, _, label, line, title) in zip(axes, panels):
        if line is not None:
            ax.axhline(line, ls="--", c="grey", lw=1, label=f"SLO {line:g} ms")
        ax.set(xlabel="request rate (req/s)", ylabel=label, title=title)
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7)
    fig.suptitle(
        "Colocated vs disaggregated (simulated Llama-3-8B on H100s): tight TPOT favours the split", fontsize=10
    )
    fig.tight_layout()
    return fig
