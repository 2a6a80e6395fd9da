"""A decode step as t = t₀ + bytes ÷ rate, with t₀ measured, not inferred: the Amdahl model of chapter 03.

Quantization shrinks only the weight bytes; the rest of the step (norms, attention, the KV cache, the
argmax over the vocabulary, Python and launches) stays. Earlier the chapter *inferred* that rest as
t₀ = t(fp32) − bytes(fp32) ÷ DRAM bandwidth. That lumps the fp32 kernels' own shortfall from the roof
into t₀: SmolLM2's small matrices (576 wide) do not stream at the bandwidth a large copy reaches, so
the inferred t₀ was several times the real one and the "prediction" held a byte-proportional cost fixed,
predicting far less than the formats delivered. Here t₀ is *measured*: the same engine, the same
``engine.step()`` timing, in the same interleaved repeats, with every linear layer replaced by a
``NullLinear`` (zero weight bytes, the right output shape). A format's step is then predicted from its
bytes, the measured bandwidth and that t₀ alone (``predicted_step_s``); no time of the format enters the
prediction. ``streamed_rate`` computes, after the measurement, the rate a format's kernels reached:
(t − t₀) ÷ bytes⁻¹. Bandwidth-bound (weights) plus overhead-bound (t₀). Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import math

import torch


class NullLinear(torch.nn.Module):
    """A linear layer with no weight: returns zeros of the layer's output width. Timing a step whose
    layers are all ``NullLinear`` measures everything in the step but the weights (t₀)."""

    nbytes = 0

    def __init__(self, out_features: int) -> None:
        super().__init__()
        if isinstance(out_features, bool) or not isinstance(out_features, int) or out_features < 1:
            raise ValueError(f"out_features must be a positive int, got {out_features!r}")
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(*x.shape[:-1], self.out_features)


def null_layers(layers: dict) -> dict:
    """{name: NullLinear} with each layer's output width (``weight.shape[0]``, also for a packed or
    quantized layer that keeps only the shape)."""
    out = {}
    for name, lin in layers.items():
        w = getattr(lin, "weight", None)
        n = w.shape[0] if w is not None else getattr(getattr(lin, "qw", None), "shape", (None,))[0]
        if n is None:
            raise ValueError(f"layer {name!r} ({type(lin).__name__}) has no weight shape to copy")
        out[name] = NullLinear(int(n))
    return out


def _positive(name: str, v, zero_ok: bool = False) -> float:
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or v < 0
        or (v == 0 and not zero_ok)
    ):
        raise ValueError(f"{name} must be a finite number {'>= 0' if zero_ok else '> 0'}, got {v!r}")
    return float(v)


def predicted_step_s(t0_s: float, nbytes: float, bandwidth: float) -> float:
    """The step time the model predicts: the measured fixed part plus the weight bytes at ``bandwidth``
    (bytes/s)."""
    return _positive("t0_s", t0_s, True) + _positive("nbytes", nbytes, True) / _positive("bandwidth", bandwidth)


def predicted_speedup(t0_s: float, bytes_before: float, bytes_after: float, bandwidth: float) -> float:
    """Amdahl's speed-up of a step whose weights shrink from ``bytes_before`` to ``bytes_after`` while
    the measured fixed part ``t0_s`` stays: (t₀ + B₀/bw) ÷ (t₀ + B₁/bw)."""
    before = predicted_step_s(t0_s, bytes_before, bandwidth)
    after = predicted_step_s(t0_s, bytes_after, bandwidth)
    if after == 0:
        raise ValueError("t0_s and bytes_after are both 0: the predicted step takes no time")
    return before / after


def speedup_cap(step_s: float, t0_s: float) -> float:
    """No format can beat t ÷ t₀, however few its bytes: the step's non-weight part remains."""
    return _positive("step_s", step_s) / _positive("t0_s", t0_s)


def streamed_rate(step_s: float, t0_s: float, nbytes: float) -> float:
    """Bytes/s the format's kernels streamed, once the measured fixed part is taken out: bytes ÷ (t − t₀)
    (inf where the step is no longer than t₀: noise, or no bytes to read)."""
    dt = _positive("step_s", step_s) - _positive("t0_s", t0_s, True)
    return _positive("nbytes", nbytes, True) / dt if dt > 0 else math.inf


__all__ = ["NullLinear", "null_layers", "predicted_speedup", "predicted_step_s", "speedup_cap", "streamed_rate"]
