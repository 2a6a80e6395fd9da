"""The KV calculator as an ipywidgets explorer: pick a model, GPU, dtype, context and batch; see the cache's size.

``draw_kv`` computes one choice (a ``Figure`` of weights + KV cache against context next to the GPU's
usable memory, and the lines of text that explain it; tested without widgets), ``kv_explorer_outputs``
turns it into notebook outputs and ``kv_explorer`` wires the controls, as ``bottlenecks.explorer.phase_explorer``
does. The numbers come from ``formulas``. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from course_lib.kv.checks import resolve_dtype, resolve_gpu, resolve_shape
from course_lib.kv.formulas import USABLE, attention_kind, fit_requests, kv_gb
from course_lib.kv.plots import finish_log_axes
from course_lib.measure.costs import check_positive_int
from course_lib.models.accounting import PRESETS, kv_bytes_per_token, weight_bytes

#: dtypes the explorer offers (those of the GPU datasheet table)
KV_DTYPES = ("bf16", "fp16", "fp8", "fp32")


#: contexts the explorer's slider offers: 512 … 128k tokens
CONTEXTS = tuple(2**i for i in range(9, 18))


#: batches the explorer's slider offers: 1 … 256
BATCHES = tuple(2**i for i in range(9))


def draw_kv(model, gpu, dtype: str, context: int, batch: int) -> tuple[Figure, str]:
    """The KV explorer's picture and text for one choice, weights and KV cache both in ``dtype``: weights
    + KV cache of ``batch`` requests against context, next to the GPU's usable memory. A ``Figure`` of its
    own (no pyplot state). A combination that cannot run (weights that do not fit, a dtype the GPU lacks,
    a context past the model's window) gives a line of text saying so, never an exception."""
    from course_lib.bottlenecks.capacity import device_bytes

    shape, spec = resolve_shape(model), resolve_gpu(gpu)
    dtype = resolve_dtype("dtype", dtype)
    check_positive_int("context", context)
    check_positive_int("batch", batch)
    per_token = kv_bytes_per_token(shape, dtype)
    weights = weight_bytes(shape, dtype) / 1e9
    usable = device_bytes(spec) * USABLE / 1e9
    kv = kv_gb(shape, dtype, context, batch)
    fit = fit_requests(shape, spec, dtype, context)
    kind = attention_kind(shape)
    group = f", {shape.gqa_group} query heads per KV head" if kind == "GQA" else ""
    elem = per_token / (2 * shape.num_layers * shape.num_kv_heads * shape.head_dim)  # bytes per element
    lines = [
        f"{shape.name} {dtype} on {spec.name}: KV cache = 2 x {shape.num_layers} layers x {shape.num_kv_heads} "
        f"KV heads x {shape.head_dim} head_dim x {elem:g} B = {per_token / 1024:g} KiB per token ({kind}{group})",
        f"  {batch} request(s) x {context:,} tokens: KV cache {kv:,.2f} GB + weights {weights:,.2f} GB = "
        f"{kv + weights:,.2f} GB of {usable:,.1f} GB usable ({USABLE:.0%} of {device_bytes(spec) / 1e9:,.1f} GB, "
        f"the datasheet's {spec.memory_gb:g} GiB); weights and KV cache both in {dtype}",
    ]
    if weights > usable:
        lines.append(
            f"  the weights alone ({weights:,.1f} GB) exceed the usable memory: no request fits on one {spec.name}"
        )
    elif fit == 0:
        lines.append(f"  not even one request of {context:,} tokens fits beside the weights")
    else:
        verdict = "fits" if batch <= fit else f"does NOT fit: batch {batch} > {fit}"
        lines.append(f"  at most {fit:,} concurrent request(s) of {context:,} tokens fit: batch {batch} {verdict}")
    if dtype in KV_DTYPES and not spec.supports(dtype):
        lines.append(
            f"note: {spec.name} has no {dtype} support (datasheet): sizes are counted in {dtype} as asked; "
            f"the chip would compute in {spec.best_dtype(dtype)}"
        )
    if context > shape.max_position:
        lines.append(f"note: {context:,} tokens exceed {shape.name}'s context window of {shape.max_position:,} tokens")

    fig = Figure(figsize=(7, 4), dpi=80)
    FigureCanvasAgg(fig)  # renders without pyplot
    ax = fig.add_subplot()
    xs = np.array(CONTEXTS if context in CONTEXTS else sorted({*CONTEXTS, context}), dtype=float)
    ax.plot(xs, weights + per_token * xs * batch / 1e9, "-", label=f"weights + KV cache, batch {batch}")
    ax.axhline(weights, color="grey", ls=":", label=f"weights {weights:,.1f} GB")
    ax.axhline(usable, color="red", ls="--", label=f"usable {usable:,.1f} GB ({spec.name})")
    ax.plot([context], [weights + kv], "o", ms=8, zorder=6, label=f"{context:,} tokens: {weights + kv:,.1f} GB")
    if context > shape.max_position:
        ax.axvline(shape.max_position, color="black", lw=0.8, label=f"context window {shape.max_position:,}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(CONTEXTS, [f"{c // 1024}k" if c >= 1024 else str(c) for c in CONTEXTS])
    finish_log_axes(
        ax, "context (tokens per request)", "GB (10⁹ bytes)", f"{shape.name}, weights and KV in {dtype}, on {spec.name}"
    )
    return fig, "\n".join(lines)


def kv_explorer_outputs(model, gpu, dtype: str, context: int, batch: int) -> tuple[dict, ...]:
    """The explorer's output area for one choice, as notebook outputs (a text stream and a PNG)."""
    from course_lib.measure.plots import as_outputs

    try:
        fig, text = draw_kv(model, gpu, dtype, context, batch)
    except ValueError as exc:
        return ({"output_type": "stream", "name": "stdout", "text": f"cannot size this combination: {exc}\n"},)
    return as_outputs(fig, text)


def kv_explorer(default_model: str = "llama-2-7b", default_gpu: str = "H100 SXM"):
    """An ipywidgets explorer: pick model, GPU, dtype, context (512 … 128k) and batch (1 … 256); see the KV
    cache's size and how many requests fit. ``draw_kv`` computes (tested); each change replaces the
    ``Output`` widget's outputs in one assignment, as ``bottlenecks.explorer.phase_explorer`` does."""
    import ipywidgets as widgets

    from course_lib.measure.hardware.datasheet import gpu_names

    controls = {
        "model": widgets.Dropdown(options=sorted(PRESETS), value=default_model, description="model"),
        "gpu": widgets.Dropdown(options=list(gpu_names()), value=default_gpu, description="GPU"),
        # the dtype of the weights and of the KV cache both (the text under the plot says so)
        "dtype": widgets.Dropdown(options=list(KV_DTYPES), value="bf16", description="dtype"),
        "context": widgets.SelectionSlider(options=list(CONTEXTS), value=4096, description="context"),
        "batch": widgets.SelectionSlider(options=list(BATCHES), value=1, description="batch"),
    }
    out = widgets.Output()

    def refresh(_change=None) -> None:
        out.outputs = kv_explorer_outputs(**{name: w.value for name, w in controls.items()})

    for w in controls.values():
        w.observe(refresh, names="value")
    refresh()
    return widgets.VBox([*controls.values(), out])
