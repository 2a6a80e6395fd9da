"""The figure of chapter 01's decode sweep: measured TPOT against the batch, with the roofline's floor.

The floor is max(bytes ÷ bandwidth, FLOPs ÷ peak) of each batch (``time_floors.decode_time``): flat while
the step is bandwidth-bound, rising ∝ batch once it is compute-bound, the corner at the ridge batch. The
measured curve is drawn on top with its fitted bend (``decode_roofline.bend_batch``) and, where the
engine switches matmul kernels, that switch, so a reader sees which change of slope is the roofline's and
which the library's. Introduced in 01_bottlenecks_2_prefill_decode.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence

from course_lib.bottlenecks.decode_roofline import Bend, DecodeStep
from course_lib.measure.plots import new_axes


def plot_tpot_vs_batch(
    rows: Sequence[DecodeStep],
    floors_s: Sequence[float],
    *,
    ridge_batch: float | None = None,
    bend: Bend | None = None,
    switch_rows: int | None = None,
    ax=None,
    title: str = "decode TPOT vs batch",
):
    """TPOT in ms against the batch (log-log): measured medians with their fastest-slowest range,
    the roofline floor ``floors_s``, the predicted ridge batch, the fitted bend and the kernel switch."""
    rows = list(rows)
    if not rows or len(floors_s) != len(rows):
        raise ValueError(f"rows and floors_s must be non-empty and equally long, got {len(rows)} and {len(floors_s)}")
    fig, ax = new_axes(ax)
    b = [r.batch for r in rows]
    med = [r.tpot_s * 1e3 for r in rows]
    lo = [m - min(r.step_s) * 1e3 for m, r in zip(med, rows)]
    hi = [max(r.step_s) * 1e3 - m for m, r in zip(med, rows)]
    ax.plot(b, [f * 1e3 for f in floors_s], "--", color="grey", label="roofline floor (measured peaks)")
    ax.errorbar(b, med, yerr=[lo, hi], fmt="o-", capsize=3, label="measured TPOT (median, fastest-slowest)")
    if bend is not None and bend.batch is not None:
        xs = [b[0], bend.batch, b[-1]]
        fit = [max(bend.floor_s, bend.per_seq_s * x) * 1e3 for x in xs]
        ax.plot(xs, fit, ":", color="tab:green", label=f"fit max(flat, ∝ batch): bend at {bend.batch:.1f}")
    if ridge_batch is not None:
        ax.axvline(ridge_batch, color="tab:red", lw=1, label=f"ridge batch from the peaks: {ridge_batch:.1f}")
    if switch_rows is not None and b[0] <= switch_rows < b[-1]:
        ax.axvline(switch_rows + 0.5, color="tab:purple", lw=1, ls="-.", label=f"> {switch_rows} rows: F.linear")
    ax.set(xscale="log", yscale="log", xlabel="decode batch (sequences per step)", ylabel="TPOT (ms)", title=title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig, ax
