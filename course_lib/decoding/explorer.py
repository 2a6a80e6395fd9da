"""The speed-up calculator: α and c sliders → E(α, γ) and E/(γc + 1) against γ, the best γ marked.

``draw_speedup`` draws one picture on a ``Figure`` of its own (thread-safe, no pyplot state);
``speedup_explorer`` wraps it in ipywidgets sliders, with measured ``SpecRow`` points on the same axes
(predict, then measure). Pure formula: nothing is timed here. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from course_lib.decoding.speedup import SpecRow
from course_lib.engine.speculative.theory import best_gamma, expected_speedup, expected_tokens
from course_lib.measure.plots import DPI, FIGSIZE, as_outputs


def draw_speedup(alpha: float, c: float, max_gamma: int = 10, points: Sequence[SpecRow] = ()) -> tuple[Figure, str]:
    """The calculator's picture: E(α, γ) and the speed-up E/(γc + 1) for γ = 1..max_gamma, the best γ
    marked, and measured rows (if any) as points at their own γ. A ``Figure`` of its own (thread-safe)."""
    g_best = best_gamma(alpha, c, max_gamma)
    gs = list(range(1, max_gamma + 1))
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(gs, [expected_tokens(alpha, g) for g in gs], ":", color="grey", label="E: tokens per target forward")
    ax.plot(
        gs, [expected_speedup(alpha, g, c) for g in gs], "-", color="C0", label=f"speed-up, α={alpha:.2f}, c={c:.2f}"
    )
    ax.plot([g_best], [expected_speedup(alpha, g_best, c)], "*", ms=14, color="C0", label=f"best γ = {g_best}")
    for i, m in enumerate(dict.fromkeys(r.method for r in points)):
        rs = [r for r in points if r.method == m and r.gamma <= max_gamma]
        ax.plot([r.gamma for r in rs], [r.speedup for r in rs], "o", color=f"C{i + 1}", label=f"measured: {m}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_title("the formula E(α, γ)/(γc + 1) against γ, with this run's measurements")
    ax.set_xlabel("γ (draft tokens per step)")
    ax.set_ylabel("speed-up over plain decoding (×)")
    ax.legend(fontsize=7)
    text = (
        f"α = {alpha:.2f}, c = {c:.2f}: best γ = {g_best}, E = {expected_tokens(alpha, g_best):.2f} tokens per "
        f"target forward, predicted speed-up {expected_speedup(alpha, g_best, c):.2f}×"
        + ("  (a slowdown: the drafts cost more than they save)" if expected_speedup(alpha, g_best, c) < 1 else "")
    )
    return fig, text


def speedup_explorer(points: Sequence[SpecRow] = (), alpha: float = 0.6, c: float = 0.2):
    """An ipywidgets calculator: α and c sliders → expected speed-up vs γ, with measured points on it."""
    import ipywidgets as widgets

    controls = {
        "alpha": widgets.FloatSlider(value=alpha, min=0.0, max=0.99, step=0.01, description="α"),
        "c": widgets.FloatSlider(value=c, min=0.0, max=1.0, step=0.01, description="c"),
        "max_gamma": widgets.IntSlider(value=10, min=2, max=16, description="max γ"),
    }
    out = widgets.Output()

    def refresh(_change=None) -> None:
        fig, text = draw_speedup(**{k: w.value for k, w in controls.items()}, points=points)
        out.outputs = as_outputs(fig, text)

    for w in controls.values():
        w.observe(refresh, names="value")
    refresh()
    return widgets.VBox([*controls.values(), out])
