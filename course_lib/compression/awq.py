"""AWQ (Lin et al., 2023, *Activation-aware Weight Quantization*): scale the input channels that meet large
activations up before rounding, then round to nearest.

A weight's rounding error reaches the output multiplied by its input: channels whose activations are
large matter most. AWQ multiplies each input channel j of W by s_j = (mean |x_j|)^α, rounds W·diag(s) to
nearest in the usual grid (the salient channels now span more levels of their group), and divides the
input by s (folded into the previous op: a norm's weight, the previous projection's rows; or kept as an
input scale, as here, ``ScaledInputLinear``). W·x = (W·diag(s))·(x/s), so only the rounding changes.
α is searched on a grid (AutoAWQ's: 0, 0.05, …, 0.95) to minimise the layer's output error on
calibration inputs, ‖X(W − Ŵ)ᵀ‖² / ‖XWᵀ‖², computed from H = 2XᵀX/n (``gptq.relative_output_error``),
so no activations are stored: the calibration pass records H and mean|x| per layer (``AwqRecorder``).
s is normalised by √(max·min) as AutoAWQ does. α = 0 is plain RTN, so AWQ's error is never above RTN's
on its calibration inputs; held text is the real test. A calibration pass (bandwidth-bound forward
passes) and small products per α (compute-bound). Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import time

import torch

from course_lib.compression.calibrate import HessianRecorder, calibration_windows, layer_names, record_linear_inputs
from course_lib.compression.gptq import relative_output_error
from course_lib.compression.linear import WeightOnlyLinear
from course_lib.compression.quantize import QuantConfig, QuantizedWeight, dequantize, quantize

GRID = tuple(i / 20 for i in range(20))  # AutoAWQ's n_grid = 20


class AwqRecorder(HessianRecorder):
    """``HessianRecorder`` that also sums |x| per input channel (AWQ's activation statistic)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.abs_sum = torch.zeros(inner.weight.shape[1], dtype=torch.float32, device=inner.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.abs_sum += x.detach().reshape(-1, x.shape[-1]).float().abs().sum(0)
        return super().forward(x)

    __call__ = forward

    def mean_abs(self) -> torch.Tensor:
        if self.rows == 0:
            raise RuntimeError("this layer saw no input during calibration")
        return self.abs_sum / self.rows


def collect_awq_stats(engine, names=None, n_samples: int = 32, seq_len: int = 256, *, batch: int = 8, data=None):
    """{layer name: (H, mean|x|)} from ``n_samples`` calibration windows (train split, or ``data``)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    names = layer_names(engine, names)
    windows = calibration_windows(engine, n_samples, seq_len, "train", 0, data)
    batches = [windows[i : i + batch] for i in range(0, len(windows), batch)]
    recs = record_linear_inputs(engine, names, batches, AwqRecorder)
    return {n: (r.hessian(), r.mean_abs()) for n, r in recs.items()}


def awq_scales(mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = mean|x|^α, normalised so that √(max·min) = 1 (AutoAWQ), never below 1e-4."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if mean_abs.ndim != 1 or not bool((mean_abs >= 0).all()):
        raise ValueError(f"mean_abs must be a 1-D tensor of non-negative values, got shape {tuple(mean_abs.shape)}")
    s = mean_abs.float().clamp(min=1e-4).pow(alpha)
    return (s / (s.max() * s.min()).sqrt()).clamp(min=1e-4)


def awq_search(weight: torch.Tensor, H: torch.Tensor, mean_abs: torch.Tensor, config: QuantConfig, grid=GRID) -> dict:
    """Search α on ``grid``: {"alpha", "scales", "qweight" (of W·diag(s)), "w_hat" (dequantized ÷ s: what
    the layer computes with), "errors" {α: relative output error}, "rtn_error" (α = 0 without scaling)}."""
    if not isinstance(config, QuantConfig) or config.granularity == "tensor":
        raise ValueError(f"config must be a QuantConfig with granularity 'channel' or 'group', got {config!r}")
    W = weight.detach().float()
    k = W.shape[1]
    if H.shape != (k, k) or mean_abs.shape != (k,):
        raise ValueError(f"H must be ({k}, {k}) and mean_abs ({k},) for a weight {tuple(W.shape)}")
    if not grid or any(not 0 <= a <= 1 for a in grid):
        raise ValueError(f"grid must be a non-empty sequence of α in [0, 1], got {grid!r}")
    best, errors = None, {}
    for alpha in grid:
        s = awq_scales(mean_abs, alpha)
        qw = quantize(W * s, config)
        w_hat = dequantize(qw) / s
        errors[alpha] = relative_output_error(W, w_hat, H)
        if best is None or errors[alpha] < best[0]:
            best = (errors[alpha], alpha, s, qw, w_hat)
    rtn = relative_output_error(W, dequantize(quantize(W, config)), H)
    _, alpha, s, qw, w_hat = best
    return {"alpha": alpha, "scales": s, "qweight": qw, "w_hat": w_hat, "errors": errors, "rtn_error": rtn}


class ScaledInputLinear(torch.nn.Module):
    """y = Q(W·diag(s)) · (x / s): AWQ's layer with the input scale kept (not folded into the previous
    op), on the same quantized kernel as RTN (``WeightOnlyLinear``)."""

    def __init__(self, qw: QuantizedWeight, scales: torch.Tensor, bias=None, **kwargs) -> None:
        super().__init__()
        if scales.shape != (qw.shape[1],):
            raise ValueError(f"scales must have shape ({qw.shape[1]},), got {tuple(scales.shape)}")
        self.inner = WeightOnlyLinear(qw, bias, **kwargs)
        self.inv_s = (1.0 / scales).float()

    @property
    def weight(self) -> torch.Tensor:
        """The float matrix this layer computes with, Q(W·diag(s))·diag(1/s) (built on each access)."""
        return self.inner.weight * self.inv_s

    @property
    def nbytes(self) -> int:
        return int(self.inner.nbytes) + self.inv_s.numel() * 2  # + one bf16 scale per input channel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x * self.inv_s.to(x.dtype))


@torch.no_grad()
def awq_layers(engine, config: QuantConfig, stats: dict, *, names=None, grid=GRID, **kwargs) -> tuple[dict, dict]:
    """({name: ScaledInputLinear}, report) for the engine's layers in ``stats`` (``collect_awq_stats``) or
    ``names``, without touching the engine. report: {"layers": {name: alpha, awq_error, rtn_error}, "seconds"}.
    ``kwargs`` go to ``WeightOnlyLinear`` (e.g. ``max_rows``)."""
    if not isinstance(stats, dict) or not stats:
        raise ValueError("stats must be a non-empty dict {layer name: (H, mean|x|)} (see collect_awq_stats)")
    layers = dict(engine.model.linears())
    names = layer_names(engine, list(stats) if names is None else names)
    missing = [n for n in names if n not in stats]
    if missing:
        raise ValueError(f"stats has no entry for layers {missing}; calibrate them with collect_awq_stats")
    start, out, report = time.perf_counter(), {}, {}
    for n in names:
        lin = layers[n]
        if isinstance(lin, WeightOnlyLinear):
            raise ValueError(f"layer {n!r} is already quantized: give the float engine")
        r = awq_search(lin.weight, *stats[n], config, grid)
        out[n] = ScaledInputLinear(r["qweight"], r["scales"], lin.bias, **kwargs)
        report[n] = {"alpha": r["alpha"], "awq_error": r["errors"][r["alpha"]], "rtn_error": r["rtn_error"]}
    return out, {"layers": report, "seconds": time.perf_counter() - start}


__all__ = [
    "GRID",
    "AwqRecorder",
    "ScaledInputLinear",
    "awq_layers",
    "awq_scales",
    "awq_search",
    "collect_awq_stats",
]
