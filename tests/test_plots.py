"""Figures: log-log, small, with the roofs and points asked for; the explorer wires widgets to llm_phases."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib import plots  # noqa: E402
from course_lib.roofline import Point, Roof, llm_phases  # noqa: E402


def test_roofline_plot_is_small_and_loglog():
    roofs = [Roof("me", 1e11, 1e10, "measured"), Roof.from_spec("H100 SXM")]
    pts = [Point("a", 1e9, 1e9, 0.1), Point("b (theory)", 1e12, 1e9)]
    fig, ax = plots.plot_roofline(roofs, pts)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert fig.dpi == plots.DPI and tuple(fig.get_size_inches()) == plots.FIGSIZE
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("me" in s for s in labels) and any("H100" in s for s in labels) and "a" in labels
    plt.close(fig)
    with pytest.raises(ValueError, match="roofs must hold"):
        plots.plot_roofline([])
    with pytest.raises(ValueError, match="intensity_range"):
        plots.plot_roofline(roofs, intensity_range=(10, 1))


def test_measured_vs_theory_checks_lengths():
    fig, ax = plots.plot_measured_vs_theory([1, 2], [1, 2], [2, 3], xlabel="x", ylabel="y")
    plt.close(fig)
    with pytest.raises(ValueError, match="equally long"):
        plots.plot_measured_vs_theory([1, 2], [1], [2, 3], xlabel="x", ylabel="y")


def test_phase_plot_and_explorer():
    fig, ax = plots.plot_phases(llm_phases("L4", "llama-3-8b", batch=4))
    plt.close(fig)
    widget = plots.phase_explorer()
    assert {c.description for c in widget.children[:-1]} >= {"GPU", "model", "batch", "dtype"}
    plt.close("all")
