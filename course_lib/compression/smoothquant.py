"""Activation outliers and SmoothQuant: why int8 *activations* are harder than int8 weights.

Weight-only quantization (the rest of this package) leaves activations in float. Quantizing them too
(W8A8) lets a GPU use int8 tensor cores, but LLM activations have a few input channels whose values
are far larger than the rest, in every token. One per-token scale must then stretch to cover the
outliers, and every ordinary value lands on few grid steps. SmoothQuant (Xiao et al., 2023) moves the
difficulty from activations to weights: divide channel j of X by s_j and multiply column j of W by
s_j (X·Wᵀ is unchanged), with s_j = max|X_j|^α / max|W_j|^(1−α). ``channel_absmax`` finds the
outliers in a real model; ``w8a8_error`` measures the output error of per-token × per-channel int8
with and without smoothing. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.compression.quantize import QuantConfig, dequantize, quantize

INT8_ROWS = QuantConfig(8, True, "channel")


class _Recorder:
    """Wraps an engine Linear: records the per-input-channel max |x| (and a sample of rows), then calls it."""

    def __init__(self, inner, keep_rows: int) -> None:
        self.inner, self.keep_rows = inner, keep_rows
        self.absmax: torch.Tensor | None = None
        self.rows: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).float()  # (rows, in)
        m = x2.abs().amax(dim=0)
        self.absmax = m if self.absmax is None else torch.maximum(self.absmax, m)
        if sum(r.shape[0] for r in self.rows) < self.keep_rows:
            self.rows.append(x2[: self.keep_rows].clone())
        return self.inner.forward(x)

    __call__ = forward


@torch.inference_mode()
def channel_absmax(engine, windows: list[list[int]], names: list[str] | None = None, keep_rows: int = 512):
    """Run ``windows`` (token id lists) through ``engine.model`` and return, for each linear layer in
    ``names`` (default: every qkv and gate_up, the layers that read normalised activations),
    ``(absmax per input channel (in,), a sample of input rows (≤ keep_rows, in))``."""
    from course_lib.compression.calibrate import record_linear_inputs

    if names is None:
        names = [n for n, _ in engine.model.linears() if n.endswith(("qkv", "gate_up"))]
    batches = [torch.tensor([list(ids)], device=engine.device) for ids in windows]  # (1, T) each
    recorders = record_linear_inputs(engine, names, batches, lambda layer: _Recorder(layer, keep_rows))
    return {n: (rec.absmax, torch.cat(rec.rows)[:keep_rows]) for n, rec in recorders.items()}


def outlier_ratio(absmax: torch.Tensor) -> float:
    """How far the largest channel sits above a typical one: max / median of the per-channel max |x|."""
    return float(absmax.max() / absmax.median().clamp(min=1e-12))


def smooth_scales(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """SmoothQuant's s_j = max|X_j|^α / max|W_j|^(1−α), per input channel j (clamped away from 0)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    w_absmax = weight.float().abs().amax(dim=0).clamp(min=1e-5)  # (in,)
    return (act_absmax.float().clamp(min=1e-5) ** alpha / w_absmax ** (1 - alpha)).clamp(min=1e-5)


def _int8_rows(t: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 with one scale per row, returned dequantized (per-token for X, per-channel for W)."""
    return dequantize(quantize(t, INT8_ROWS))


@dataclass(frozen=True)
class W8A8Error:
    """Relative output error ‖XWᵀ − Q(X)Q(W)ᵀ‖ / ‖XWᵀ‖ of int8 activations × int8 weights."""

    plain: float  # per-token X, per-channel W
    smoothed: float  # the same after SmoothQuant's rescaling
    weight_only: float  # int8 W, float X: the reference point of weight-only quantization


def w8a8_error(x: torch.Tensor, weight: torch.Tensor, act_absmax: torch.Tensor | None = None, alpha: float = 0.5):
    """Output error of W8A8 on rows ``x`` (rows, in) through ``weight`` (out, in), with and without smoothing."""
    x, w = x.detach().float(), weight.detach().float()
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(
            f"x (rows, in) and weight (out, in) must agree on in, got {tuple(x.shape)} and {tuple(w.shape)}"
        )
    ref = x @ w.T
    norm = ref.norm().clamp(min=1e-12)
    s = smooth_scales(x.abs().amax(dim=0) if act_absmax is None else act_absmax, w, alpha)
    plain = (_int8_rows(x) @ _int8_rows(w).T - ref).norm() / norm
    smoothed = (_int8_rows(x / s) @ _int8_rows(w * s).T - ref).norm() / norm
    weight_only = (x @ _int8_rows(w).T - ref).norm() / norm
    return W8A8Error(float(plain), float(smoothed), float(weight_only))


def ordinary_channel_error(
    x: torch.Tensor, outliers, weight: torch.Tensor, alpha: float = 0.5, act_absmax: torch.Tensor | None = None
) -> tuple[float, float]:
    """Relative error of per-token int8 on the *ordinary* channels of ``x`` (all but ``outliers``), plain
    and after SmoothQuant's rescaling (quantize X/s, multiply back by s): how much the outliers' share
    of one per-token scale costs everyone else. ``act_absmax``: the per-channel max |x| the scales are
    calibrated on (another split's); by default ``x``'s own."""
    x = x.detach().float()
    keep = torch.ones(x.shape[1], dtype=torch.bool)
    keep[list(outliers)] = False
    if not keep.any():
        raise ValueError("outliers lists every channel: nothing ordinary is left to measure")
    s = smooth_scales(x.abs().amax(dim=0) if act_absmax is None else act_absmax, weight.detach().float(), alpha)
    norm = x[:, keep].norm().clamp(min=1e-12)
    plain = (_int8_rows(x) - x)[:, keep].norm() / norm
    smoothed = (_int8_rows(x / s) * s - x)[:, keep].norm() / norm
    return float(plain), float(smoothed)


__all__ = ["W8A8Error", "ordinary_channel_error", "channel_absmax", "outlier_ratio", "smooth_scales", "w8a8_error"]
