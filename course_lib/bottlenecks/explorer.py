"""The phase explorer of chapter 01: pick a GPU, a model, a batch, a dtype and a context, and see its
decode step and prefill on that GPU's datasheet roof, with whether weights and KV cache fit in memory.

``draw_phases`` computes the picture and the text (``llm_phases`` underneath; tested without widgets);
``phase_explorer`` only wires ipywidgets controls to it. The figure is drawn on a ``Figure`` of its
own, never through pyplot: JupyterLab runs widget callbacks on a kernel subshell thread, and pyplot's
global "current figure" shared between threads drew blank plots. Introduced in 01_bottlenecks_2_prefill_decode.ipynb.
"""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from course_lib.bottlenecks.llm_phases import PhaseReport, llm_phases
from course_lib.measure.hardware.datasheet import gpu_names, gpu_spec
from course_lib.measure.plots import DPI, FIGSIZE, as_outputs, plot_roofline
from course_lib.measure.roofline import Point
from course_lib.models.accounting import PRESETS


def plot_phases(report: PhaseReport, *, ax=None):
    """One GPU's datasheet roof with the predicted decode and prefill points of ``report``."""
    points = [
        Point(f"decode b={report.batch}", report.decode.flops, report.decode.bytes),
        Point(f"prefill b={report.batch}x{report.prompt_len}", report.prefill.flops, report.prefill.bytes),
    ]
    return plot_roofline(
        [report.roof], points, ax=ax, intensity_range=(0.1, 1e5), title=f"{report.model} {report.dtype} on {report.gpu}"
    )


EXPLORER_DTYPES = ("bf16", "fp16", "fp8", "fp32")


def _compute_dtype(spec, dtype: str) -> tuple[str, str]:
    """(dtype whose roof to draw, note): ``dtype`` if the chip has it, else its best of bf16/fp16/fp32."""
    for candidate in (dtype, "bf16", "fp16", "fp32"):
        try:
            spec.peak_flops(candidate)
        except ValueError:
            continue
        if candidate == dtype:
            return dtype, ""
        return candidate, (
            f"note: {spec.name} has no {dtype} support (datasheet): drawn against its {candidate} roof, "
            f"with weights and KV cache counted in {dtype}"
        )
    raise ValueError(f"{spec.name} supports none of bf16, fp16, fp32")


def draw_phases(gpu: str, model: str, batch: int, dtype: str, context_len: int) -> tuple[Figure, str]:
    """The explorer's picture and text for one choice: a ``Figure`` of its own (no pyplot state, safe
    from any thread) and the ``PhaseReport`` text. A dtype the GPU lacks adds a note and falls back to
    the chip's own compute roof instead of failing."""
    compute, note = _compute_dtype(gpu_spec(gpu), dtype)
    report = llm_phases(
        gpu, model, batch=batch, dtype=dtype, prompt_len=context_len, context_len=context_len, compute_dtype=compute
    )
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)  # renders without pyplot
    plot_phases(report, ax=fig.add_subplot())
    return fig, "\n".join(filter(None, (note, str(report))))


def explorer_outputs(gpu: str, model: str, batch: int, dtype: str, context_len: int) -> tuple[dict, ...]:
    """The explorer's output area for one choice, as notebook outputs (a text stream and a PNG)."""
    try:
        fig, text = draw_phases(gpu, model, batch, dtype, context_len)
    except ValueError as exc:
        return ({"output_type": "stream", "name": "stdout", "text": f"cannot place this combination: {exc}\n"},)
    return as_outputs(fig, text)


def phase_explorer(default_gpu: str = "H100 SXM", default_model: str = "llama-2-7b"):
    """An ipywidgets explorer: pick GPU, model, batch, dtype and context; see decode and prefill on the
    roof and whether they fit in memory. ``draw_phases`` computes (tested); this wires widgets to it.
    Each change replaces the ``Output`` widget's outputs in one assignment: unlike pyplot's current
    figure or ``with output:`` capture, that does not depend on which thread or message runs the callback."""
    import ipywidgets as widgets

    controls = {
        "gpu": widgets.Dropdown(options=list(gpu_names()), value=default_gpu, description="GPU"),
        "model": widgets.Dropdown(options=sorted(PRESETS), value=default_model, description="model"),
        "batch": widgets.SelectionSlider(options=[2**i for i in range(11)], value=1, description="batch"),
        "dtype": widgets.Dropdown(options=list(EXPLORER_DTYPES), value="bf16", description="dtype"),
        "context_len": widgets.SelectionSlider(options=[2**i for i in range(7, 16)], value=512, description="context"),
    }
    out = widgets.Output()

    def refresh(_change=None) -> None:
        out.outputs = explorer_outputs(**{name: w.value for name, w in controls.items()})

    for w in controls.values():
        w.observe(refresh, names="value")
    refresh()
    return widgets.VBox([*controls.values(), out])
