"""Small log-log figures: rooflines with measured points, and measured-vs-theory curves.

Figures are kept small (``FIGSIZE``, ``DPI``) so executed notebooks stay well under a megabyte.
``as_outputs`` turns a figure and its text into notebook outputs for an ipywidgets ``Output``: every
explorer of the course (``bottlenecks.explorer``, ``kv.explorer``, ...) draws on a ``Figure`` of
its own and shows it this way, never through pyplot's thread-shared "current figure".
Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import base64
import io
from typing import Iterable, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from course_lib.measure.roofline import Point, Roof

FIGSIZE = (7, 4)
DPI = 80
_MARKERS = "osD^vP*Xh<>"


def new_axes(ax=None, figsize=FIGSIZE):
    """(fig, ax): a fresh small figure unless ``ax`` is given."""
    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=figsize, dpi=DPI)
    return fig, ax


def _range(roofs: Sequence[Roof], points: Sequence[Point], intensity_range) -> tuple[float, float]:
    if intensity_range is not None:
        lo, hi = intensity_range
        if not 0 < lo < hi:
            raise ValueError(f"intensity_range must be (low, high) with 0 < low < high, got {intensity_range!r}")
        return lo, hi
    xs = [r.ridge for r in roofs] + [p.intensity for p in points if p.intensity > 0]
    return min(xs) / 10, max(xs) * 10


def plot_roofline(
    roofs: Iterable[Roof],
    points: Iterable[Point] = (),
    *,
    ax=None,
    title: str = "",
    intensity_range: tuple[float, float] | None = None,
    predicted: bool = True,
    point_roofs=None,
):
    """Draw each roof (measured: solid, datasheet: dashed) with its ridge point, and each point
    at (intensity, achieved FLOP/s). With ``predicted`` a point also gets a hollow marker at the
    roof's attainable value for its intensity (the ceiling theory allows): on ``point_roofs[i]`` where
    given (one Roof per point, e.g. a bf16 point on the bf16 roof), else on the first roof."""
    roofs = list(roofs)
    points = list(points)
    if not roofs:
        raise ValueError("roofs must hold at least one Roof")
    point_roofs = list(point_roofs) if point_roofs is not None else [None] * len(points)
    if len(point_roofs) != len(points):
        raise ValueError(f"point_roofs must hold one Roof (or None) per point: {len(point_roofs)} for {len(points)}")
    fig, ax = new_axes(ax)
    lo, hi = _range(roofs, points, intensity_range)
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    for i, roof in enumerate(roofs):
        style = "-" if roof.kind == "measured" else "--"
        (line,) = ax.plot(
            x,
            roof.attainable(x),
            style,
            lw=2 if roof.kind == "measured" else 1.2,
            label=f"{roof.label}: ridge {roof.ridge:.3g} FLOP/B",
        )
        ax.plot([roof.ridge], [roof.peak_flops], "|", ms=14, color=line.get_color())
    for i, point in enumerate(points):
        marker = _MARKERS[i % len(_MARKERS)]
        if point.achieved is not None:
            (dot,) = ax.plot(
                [point.intensity], [point.achieved], marker, ms=7, label=point.label, zorder=6
            )  # above the legend box: a point must never hide behind it
            color = dot.get_color()
        else:
            color = None
        if predicted or point.achieved is None:
            ceiling = (point_roofs[i] or roofs[0]).attainable(point.intensity)
            ax.plot(
                [point.intensity],
                [ceiling],
                marker,
                ms=9,
                mfc="none",
                color=color,
                zorder=6,
                label=None if point.achieved is not None else f"{point.label} (ceiling)",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title or "Roofline")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left")  # above every roof: a region no measured point can reach
    fig.tight_layout()
    return fig, ax


def plot_measured_vs_theory(
    x: Sequence[float],
    measured: Sequence[float],
    theory: Sequence[float],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    ax=None,
    logx: bool = True,
    logy: bool = True,
    label: str = "measured",
    theory_label: str = "theory (ceiling)",
):
    """Measured values and their theoretical ceiling on the same axes."""
    if not (len(x) == len(measured) == len(theory)) or len(x) == 0:
        raise ValueError(
            f"x, measured and theory must be non-empty and equally long, got {len(x)}, {len(measured)}, {len(theory)}"
        )
    fig, ax = new_axes(ax)
    ax.plot(x, theory, "--", color="grey", label=theory_label)
    ax.plot(x, measured, "o-", label=label)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, ax


def as_outputs(fig: Figure, text: str) -> tuple[dict, ...]:
    """A figure and its text as notebook outputs (a stdout stream and a PNG), ready for
    ``ipywidgets.Output.outputs``: every explorer of the course shows its result this way."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    png = base64.b64encode(buf.getvalue()).decode("ascii")
    return (
        {"output_type": "stream", "name": "stdout", "text": text + "\n"},
        {"output_type": "display_data", "data": {"image/png": png, "text/plain": repr(fig)}, "metadata": {}},
    )
