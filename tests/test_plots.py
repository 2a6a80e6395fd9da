"""Figures: log-log, small, with the roofs and points asked for; the explorer wires widgets to llm_phases."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.bottlenecks import explorer  # noqa: E402
from course_lib.bottlenecks.llm_phases import llm_phases  # noqa: E402
from course_lib.measure import plots  # noqa: E402
from course_lib.measure.hardware import gpu_spec  # noqa: E402
from course_lib.measure.roofline import Point, Roof  # noqa: E402


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
    fig, ax = explorer.plot_phases(llm_phases("L4", "llama-3-8b", batch=4))
    plt.close(fig)
    widget = explorer.phase_explorer()
    assert {c.description for c in widget.children[:-1]} >= {"GPU", "model", "batch", "dtype", "context"}
    plt.close("all")


def _controls(widget) -> dict:
    return {c.description: c for c in widget.children[:-1]}


def _cases():
    """Every GPU with every dtype (the pairs that can fail), cycling through every model and the
    smallest and largest batch and context the sliders offer."""
    controls = _controls(explorer.phase_explorer())
    models, batches, contexts = (controls[k].options for k in ("model", "batch", "context"))
    pairs = [(g, d) for g in controls["GPU"].options for d in controls["dtype"].options]
    for i, (gpu, dtype) in enumerate(pairs):
        yield (
            gpu,
            models[i % len(models)],
            (batches[0], batches[-1])[i % 2],
            dtype,
            (contexts[0], contexts[-1])[i // 2 % 2],
        )


def test_draw_phases_has_data_for_every_option():
    before = plt.get_fignums()
    cases = list(_cases())
    controls = _controls(explorer.phase_explorer())
    for name, key in (("GPU", 0), ("model", 1), ("dtype", 3)):  # every option of every control is drawn
        assert {c[key] for c in cases} == set(controls[name].options)
    for gpu, model, batch, dtype, context in cases:
        fig, text = explorer.draw_phases(gpu, model, batch, dtype, context)
        (ax,) = fig.axes
        assert ax.lines and ax.get_legend().get_texts() and ax.get_title(), (gpu, model, dtype)
        xs = [x for line in ax.lines for x in line.get_xdata()]
        assert xs and all(x > 0 for x in xs)
        assert text.strip() and "decode" in text and "memory:" in text
        try:
            gpu_spec(gpu).peak_flops(dtype)
        except ValueError:  # the chip lacks the dtype: a note, not an error
            assert f"no {dtype} support" in text
        else:
            assert "note:" not in text
    assert plt.get_fignums() == before  # no pyplot state touched


def test_draw_phases_unsupported_dtype_notes_instead_of_raising():
    fig, text = explorer.draw_phases("T4", "llama-2-7b", 1, "bf16", 512)
    assert text.startswith("note: T4 has no bf16 support") and "fp16 roof" in text
    assert any("fp16" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    fig, text = explorer.draw_phases("A100 80GB SXM", "llama-2-7b", 1, "fp8", 512)
    assert "no fp8 support" in text and "bf16 roof" in text


def test_explorer_outputs_and_wiring():
    outs = explorer.explorer_outputs("H100 SXM", "llama-2-7b", 256, "bf16", 512)
    assert [o["output_type"] for o in outs] == ["stream", "display_data"]
    assert "KV cache" in outs[0]["text"] and outs[1]["data"]["image/png"]
    assert explorer.explorer_outputs("H9000", "llama-2-7b", 1, "bf16", 512)[0]["text"].startswith("cannot place")
    widget = explorer.phase_explorer()
    out = widget.children[-1]
    assert "llama-2-7b bf16 on H100 SXM" in out.outputs[0]["text"]  # drawn on construction
    controls = _controls(widget)
    controls["GPU"].value = "T4"  # a change redraws, with the note for bf16
    assert "no bf16 support" in out.outputs[0]["text"] and out.outputs[1]["data"]["image/png"]
    controls["model"].value = "llama-2-70b"
    assert "the weights alone overflow" in out.outputs[0]["text"]
