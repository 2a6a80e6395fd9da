"""An explorer of quantization error: bits, group size, symmetric or not, and one outlier's size.

``draw_quant_error`` computes and draws (tested for every option); ``quant_explorer`` wires ipywidgets to
it the way every course explorer does (its own ``Figure``, outputs replaced in one assignment).
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from course_lib.compression.quantize import QuantConfig, dequantize, max_error, quantize
from course_lib.measure.plots import DPI, as_outputs

BITS = (8, 4)
GROUPS = ("tensor", "channel", 256, 128, 64, 32)
OUTLIERS = (1.0, 10.0, 100.0)


def _config(bits: int, group, symmetric: bool) -> QuantConfig:
    if group in ("tensor", "channel"):
        return QuantConfig(bits, symmetric, group)
    return QuantConfig(bits, symmetric, "group", int(group))


def dequant_bound(qw, shape) -> torch.Tensor:
    """Each weight's round-to-nearest bound (its scale / 2), broadcast to ``shape`` (out, in)."""
    bound = max_error(qw)  # (out, groups)
    return bound.repeat_interleave(shape[1] // bound.shape[1], dim=1) if bound.shape[1] > 1 else bound.expand(shape)


def draw_quant_error(bits: int = 4, group="channel", symmetric: bool = True, outlier: float = 1.0, seed: int = 0):
    """Quantize a (64, 512) Gaussian weight whose entry [0, 0] is scaled to ``outlier`` × its row's max,
    and draw the error distribution; returns (Figure, text)."""
    if outlier < 1:
        raise ValueError(f"outlier must be >= 1 (a multiple of the largest ordinary value), got {outlier!r}")
    cfg = _config(bits, group, symmetric)
    w = torch.randn(64, 512, generator=torch.Generator().manual_seed(seed)) * 0.02
    w[0, 0] = w[0].abs().max() * outlier
    qw = quantize(w, cfg)
    err = dequantize(qw) - w
    ordinary = torch.ones_like(w, dtype=torch.bool)
    ordinary[0, 0] = False  # judge the weights that are not the outlier
    rel = (err[ordinary].pow(2).mean().sqrt() / w[ordinary].pow(2).mean().sqrt()).item()
    fig = Figure(figsize=(7, 3.2), dpi=DPI)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.hist(err.flatten().numpy() * 1e3, bins=60, color="tab:blue")
    within = bool((err.abs() <= dequant_bound(qw, w.shape) * (1 + 1e-4)).all())
    ax1.set(xlabel="quantization error (×1e-3, weight units)", ylabel="number of weights")
    ax1.set_title(f"{cfg.name}: each error within its scale/2: {within}", fontsize=9)
    ax2.plot((w[0, :64]).numpy(), "o", ms=3, label="original row 0")
    ax2.plot((w[0, :64] + err[0, :64]).numpy(), "x", ms=3, label="dequantized")
    ax2.set(xlabel="input index", ylabel="weight value")
    ax2.set_title("row 0 (holds the outlier): dequantized vs original", fontsize=9)
    ax2.legend(fontsize=7)
    fig.suptitle(f"round-to-nearest error, outlier ×{outlier:g}: rms {rel:.1%} of the ordinary weights", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    bytes_per = qw.nbytes / w.numel()
    text = (
        f"{cfg.name}: {bytes_per:.3f} bytes/weight ({4 / bytes_per:.1f}x fewer than fp32); "
        f"rms error of the ordinary weights = {rel:.2%} of their rms"
    )
    return fig, text


def quant_explorer():
    """ipywidgets: bits, group size, symmetric, outlier size → the error of round-to-nearest."""
    import ipywidgets as widgets

    controls = {
        "bits": widgets.ToggleButtons(options=list(BITS), value=4, description="bits"),
        "group": widgets.Dropdown(options=list(GROUPS), value="channel", description="scale per"),
        "symmetric": widgets.Checkbox(value=True, description="symmetric"),
        "outlier": widgets.SelectionSlider(options=list(OUTLIERS), value=1.0, description="outlier ×"),
    }
    out = widgets.Output()

    def refresh(_change=None) -> None:
        out.outputs = as_outputs(*draw_quant_error(**{k: w.value for k, w in controls.items()}))

    for w in controls.values():
        w.observe(refresh, names="value")
    refresh()
    return widgets.VBox([*controls.values(), out])


__all__ = ["draw_quant_error", "quant_explorer"]
