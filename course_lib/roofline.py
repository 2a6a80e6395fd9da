"""The roofline model: attainable FLOP/s = min(peak FLOP/s, intensity × bandwidth).

An operation whose arithmetic intensity (FLOP per byte moved) lies left of the ridge point
(peak ÷ bandwidth, Xiao & Zhu's "hardware arithmetic intensity") is bandwidth-bound: its speed is set
by bytes/s and extra compute is free. Right of the ridge it is compute-bound. ``llm_phases`` places
an LLM's decode step and prefill on a GPU's roofline from the model's shape alone, and
``prefill_time`` / ``decode_time`` / ``output_input_ratio`` / ``generation_flops`` turn the same
accounting into the times a measured prefill (TTFT) and decode step (TPOT) should not beat.
Introduced in 00_setup_and_hardware.ipynb; LLM phases in 01_bottlenecks.ipynb; time predictions in
02_metrics.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from course_lib.costs import check_positive_int
from course_lib.models.accounting import (
    ModelShape,
    decode_flops,
    decode_intensity,
    decode_step_bytes,
    kv_bytes_per_token,
    prefill_flops,
    weight_bytes,
)


def _positive(name: str, value) -> float:
    arr = np.asarray(value, dtype=float)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def arithmetic_intensity(flops: float, bytes: float) -> float:
    """FLOP per byte moved. ``flops`` may be 0 (a copy); ``bytes`` must be > 0."""
    if not math.isfinite(flops) or flops < 0:
        raise ValueError(f"flops must be a non-negative finite number, got {flops!r}")
    _positive("bytes", bytes)
    return flops / bytes


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Intensity (FLOP/byte) where the bandwidth slope meets the compute roof."""
    _positive("peak_flops", peak_flops)
    _positive("bandwidth", bandwidth)
    return peak_flops / bandwidth


def attainable(intensity, peak_flops: float, bandwidth: float):
    """Best FLOP/s an operation of ``intensity`` can reach: min(peak, intensity · bandwidth).
    Works on scalars and numpy arrays."""
    _positive("peak_flops", peak_flops)
    _positive("bandwidth", bandwidth)
    arr = np.asarray(intensity, dtype=float)
    if np.any(arr < 0) or not np.all(np.isfinite(arr)):
        raise ValueError(f"intensity must be non-negative and finite, got {intensity!r}")
    out = np.minimum(peak_flops, arr * bandwidth)
    return float(out) if out.ndim == 0 else out


def bound(intensity: float, peak_flops: float, bandwidth: float) -> str:
    """'memory-bound' left of the ridge point, 'compute-bound' at or right of it."""
    return "memory-bound" if intensity < ridge_point(peak_flops, bandwidth) else "compute-bound"


def min_time(flops: float, bytes: float, peak_flops: float, bandwidth: float) -> float:
    """Roofline lower bound on run time: max(FLOPs / peak, bytes / bandwidth) seconds."""
    _positive("peak_flops", peak_flops)
    _positive("bandwidth", bandwidth)
    return max(flops / peak_flops, bytes / bandwidth)


@dataclass(frozen=True)
class Roof:
    """One roofline: a compute ceiling (FLOP/s) and a bandwidth slope (bytes/s)."""

    label: str
    peak_flops: float
    bandwidth: float
    kind: str = "datasheet"  # or "measured"

    def __post_init__(self) -> None:
        _positive("peak_flops", self.peak_flops)
        _positive("bandwidth", self.bandwidth)
        if self.kind not in ("datasheet", "measured"):
            raise ValueError(f"kind must be 'datasheet' or 'measured', got {self.kind!r}")

    @property
    def ridge(self) -> float:
        return ridge_point(self.peak_flops, self.bandwidth)

    def attainable(self, intensity):
        return attainable(intensity, self.peak_flops, self.bandwidth)

    def bound(self, intensity: float) -> str:
        return bound(intensity, self.peak_flops, self.bandwidth)

    @classmethod
    def from_spec(cls, gpu: str, dtype: str = "bf16") -> "Roof":
        """The datasheet roof of a GPU from ``data/gpu_specs.json``."""
        from course_lib.hardware import gpu_spec

        spec = gpu_spec(gpu)
        return cls(f"{spec.name} {dtype} (datasheet)", spec.peak_flops(dtype), spec.bandwidth, "datasheet")

    @classmethod
    def from_measured(cls, peaks, dtype: str | None = None, label: str | None = None) -> "Roof":
        """The roof of this machine from ``hardware.measured_peaks()``."""
        name = label or f"this machine {dtype or 'best dtype'} (measured)"
        return cls(name, peaks.peak_flops(dtype), peaks.bandwidth, "measured")


@dataclass(frozen=True)
class Point:
    """An operation placed on a roofline: its counted FLOPs and bytes, and — if it was timed —
    the seconds it took (then ``achieved`` is a measurement, else None)."""

    label: str
    flops: float
    bytes: float
    seconds: float | None = None

    def __post_init__(self) -> None:
        arithmetic_intensity(self.flops, self.bytes)  # validates
        if self.seconds is not None:
            _positive("seconds", self.seconds)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def achieved(self) -> float | None:
        """Measured FLOP/s (None for a prediction-only point)."""
        return None if self.seconds is None else self.flops / self.seconds

    @classmethod
    def from_timing(cls, timing, label: str | None = None) -> "Point":
        """From a ``bench.Timing`` that was given ``flops`` and ``bytes``."""
        if timing.flops is None or not timing.bytes:
            raise ValueError("the timing needs flops and bytes to become a roofline point")
        return cls(label or timing.label, timing.flops, timing.bytes, timing.median_s)


# ----------------------------------------------------------------------------- LLM phases
@dataclass(frozen=True)
class PhaseEstimate:
    """Where one phase of LLM inference lands on a roof, predicted from the model's shape."""

    phase: str  # "decode" or "prefill"
    flops: float
    bytes: float
    intensity: float
    attainable_flops: float
    seconds: float  # roofline lower bound
    tokens_per_s: float
    bound: str


@dataclass(frozen=True)
class PhaseReport:
    """Decode and prefill of ``model`` on ``gpu`` at ``batch``: what the explorer shows."""

    gpu: str
    model: str
    dtype: str
    batch: int
    prompt_len: int
    context_len: int
    roof: Roof
    decode: PhaseEstimate
    prefill: PhaseEstimate
    batch_at_ridge: int | None
    weights_gb: float
    fits_in_memory: bool

    def __str__(self) -> str:
        lines = [
            f"{self.model} {self.dtype} on {self.gpu}: ridge {self.roof.ridge:.0f} FLOP/byte, "
            f"weights {self.weights_gb:.1f} GB" + ("" if self.fits_in_memory else " (do NOT fit in one GPU)")
        ]
        for est, what in (
            (self.decode, f"decode (batch {self.batch}, context {self.context_len})"),
            (self.prefill, f"prefill (batch {self.batch} x {self.prompt_len} tokens)"),
        ):
            lines.append(
                f"  {what}: intensity {est.intensity:.3g} FLOP/byte -> {est.bound}, at most "
                f"{est.attainable_flops / 1e12:.3g} TFLOP/s, >= {est.seconds * 1e3:.3g} ms, "
                f"<= {est.tokens_per_s:,.0f} tok/s"
            )
        if self.batch_at_ridge is not None:
            lines.append(f"  decode reaches the ridge at batch {self.batch_at_ridge}")
        return "\n".join(lines)


def _estimate(phase: str, flops: float, bytes: float, tokens: int, roof: Roof) -> PhaseEstimate:
    intensity = flops / bytes
    seconds = min_time(flops, bytes, roof.peak_flops, roof.bandwidth)
    return PhaseEstimate(
        phase, flops, bytes, intensity, roof.attainable(intensity), seconds, tokens / seconds, roof.bound(intensity)
    )


def batch_to_reach(
    ridge: float, model: str, *, context_len: int = 1, dtype: str = "bf16", max_batch: int = 1 << 16
) -> int | None:
    """Smallest batch whose decode step intensity reaches ``ridge`` (None if not by ``max_batch``,
    e.g. when a long context's KV cache grows as fast as the FLOPs do)."""
    _positive("ridge", ridge)
    shape = model if isinstance(model, ModelShape) else ModelShape.from_name(model)
    if decode_intensity(shape, context_len, max_batch, dtype) < ridge:
        return None
    lo, hi = 1, max_batch  # intensity grows with batch: bisect
    while lo < hi:
        mid = (lo + hi) // 2
        if decode_intensity(shape, context_len, mid, dtype) >= ridge:
            hi = mid
        else:
            lo = mid + 1
    return lo


def llm_phases(
    gpu: str, model: str, *, batch: int = 1, dtype: str = "bf16", prompt_len: int = 512, context_len: int = 512
) -> PhaseReport:
    """Predict where ``model``'s decode step (batch sequences each adding one token to a
    ``context_len`` cache) and prefill (batch × prompt_len tokens) land on ``gpu``'s datasheet roof."""
    check_positive_int("batch", batch)
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("context_len", context_len)
    roof = Roof.from_spec(gpu, dtype)
    shape = ModelShape.from_name(model)
    decode = _estimate(
        "decode",
        decode_flops(shape, context_len, batch),
        decode_step_bytes(shape, context_len, batch, dtype),
        batch,
        roof,
    )
    prefill_bytes = weight_bytes(shape, dtype) + kv_bytes_per_token(shape, dtype) * prompt_len * batch
    prefill = _estimate("prefill", prefill_flops(shape, prompt_len, batch), prefill_bytes, batch * prompt_len, roof)
    from course_lib.hardware import gpu_spec

    spec = gpu_spec(gpu)
    weights = weight_bytes(shape, dtype)
    kv = kv_bytes_per_token(shape, dtype) * max(context_len, prompt_len) * batch
    return PhaseReport(
        spec.name,
        shape.name,
        dtype,
        batch,
        prompt_len,
        context_len,
        roof,
        decode,
        prefill,
        batch_to_reach(roof.ridge, shape, context_len=context_len, dtype=dtype),
        weights / 1e9,
        weights + kv <= spec.memory_gb * 1e9,
    )


# ----------------------------------------------------------------------------- time predictions
def prefill_time(
    shape: ModelShape, n_tokens: int, peak_flops: float, bandwidth: float, dtype: str = "fp32", batch: int = 1
) -> float:
    """Roofline lower bound of a prefill: max(FLOPs / peak, (weights + KV written) / bandwidth)."""
    moved = weight_bytes(shape, dtype) + kv_bytes_per_token(shape, dtype) * n_tokens * batch
    return min_time(prefill_flops(shape, n_tokens, batch), moved, peak_flops, bandwidth)


def decode_time(
    shape: ModelShape, context_len: int, peak_flops: float, bandwidth: float, dtype: str = "fp32", batch: int = 1
) -> float:
    """Roofline lower bound of one decode step (= the TPOT floor): weights + KV caches over bandwidth,
    unless the batch is large enough to make the FLOPs dominate."""
    return min_time(
        decode_flops(shape, context_len, batch),
        decode_step_bytes(shape, context_len, batch, dtype),
        peak_flops,
        bandwidth,
    )


def output_input_ratio(
    shape: ModelShape, peak_flops: float, bandwidth: float, dtype: str = "bf16", context_len: int = 1
) -> float:
    """The roofline's answer to "one output token costs as much as how many input tokens?":
    a batch-1 decode step (reads every weight: bytes / bandwidth) over one compute-bound prefill token
    (2 · params FLOPs / peak). About bytes-per-param / 2 × the ridge point."""
    per_input = prefill_flops(shape, 1) / peak_flops
    return decode_time(shape, context_len, peak_flops, bandwidth, dtype) / per_input


def generation_flops(shape: ModelShape, prompt_len: int, new_tokens: int, batch: int = 1) -> float:
    """FLOPs of one ``generate``: the prefill (which yields the first token) + ``new_tokens − 1`` decode steps."""
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("new_tokens", new_tokens)
    return prefill_flops(shape, prompt_len, batch) + sum(
        decode_flops(shape, prompt_len + i, batch) for i in range(1, new_tokens)
    )
