"""The roofline model: attainable FLOP/s = min(peak FLOP/s, intensity × bandwidth).

An operation whose arithmetic intensity (FLOP per byte moved) lies left of the ridge point
(peak ÷ bandwidth, Xiao & Zhu's "hardware arithmetic intensity") is bandwidth-bound: its speed is set
by bytes/s and extra compute is free. Right of the ridge it is compute-bound. A ``Roof`` comes from a
datasheet or from this machine's measured peaks; a ``Point`` is an operation's counted FLOPs and bytes,
with its measured time if it was timed. Where an LLM's phases land on a roof is chapter 01's
``course_lib.bottlenecks.llm_phases``. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from course_lib.measure.hardware.datasheet import gpu_spec


def check_positive(name: str, value) -> float:
    """``value`` (a number or an array) if every element is positive and finite, else a ValueError naming ``name``."""
    arr = np.asarray(value, dtype=float)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def arithmetic_intensity(flops: float, bytes: float) -> float:
    """FLOP per byte moved. ``flops`` may be 0 (a copy); ``bytes`` must be > 0."""
    if not math.isfinite(flops) or flops < 0:
        raise ValueError(f"flops must be a non-negative finite number, got {flops!r}")
    check_positive("bytes", bytes)
    return flops / bytes


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Intensity (FLOP/byte) where the bandwidth slope meets the compute roof."""
    check_positive("peak_flops", peak_flops)
    check_positive("bandwidth", bandwidth)
    return peak_flops / bandwidth


def attainable(intensity, peak_flops: float, bandwidth: float):
    """Best FLOP/s an operation of ``intensity`` can reach: min(peak, intensity · bandwidth).
    Works on scalars and numpy arrays."""
    check_positive("peak_flops", peak_flops)
    check_positive("bandwidth", bandwidth)
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
    check_positive("peak_flops", peak_flops)
    check_positive("bandwidth", bandwidth)
    return max(flops / peak_flops, bytes / bandwidth)


@dataclass(frozen=True)
class Roof:
    """One roofline: a compute ceiling (FLOP/s) and a bandwidth slope (bytes/s)."""

    label: str
    peak_flops: float
    bandwidth: float
    kind: str = "datasheet"  # or "measured"

    def __post_init__(self) -> None:
        check_positive("peak_flops", self.peak_flops)
        check_positive("bandwidth", self.bandwidth)
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
        spec = gpu_spec(gpu)
        return cls(f"{spec.name} {dtype} (datasheet)", spec.peak_flops(dtype), spec.bandwidth, "datasheet")

    @classmethod
    def from_measured(cls, peaks, dtype: str | None = None, label: str | None = None) -> "Roof":
        """The roof of this machine from ``microbench.machine_peaks()``."""
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
            check_positive("seconds", self.seconds)

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
