"""The course's one way to time things: ``benchmark(fn, flops=..., bytes=...)``.

Warm-up calls are run and thrown away (first calls pay for allocation, page faults, autotuning and
lazy initialisation); the device is synchronised before the clock is read (a GPU launch returns
before the work is done); the result keeps every sample and reports the median with its spread,
and — because FLOPs and bytes are counted explicitly — GB/s, TFLOP/s and % of the measured and
datasheet peaks come out together. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from course_lib.core.dtypes import canonical
from course_lib.core.mode import pick
from course_lib.measure.hardware.device import detect_device, spec_for_device
from course_lib.measure.hardware.peaks_cache import cached_peaks


def _quantile(sorted_samples: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list."""
    if len(sorted_samples) == 1:
        return sorted_samples[0]
    pos = q * (len(sorted_samples) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


@dataclass(frozen=True)
class Timing:
    """Samples of one benchmark and what follows from them. Times in seconds."""

    label: str
    device: str
    samples_s: tuple[float, ...]
    flops: float | None = None
    bytes: float | None = None
    measured_peak_flops: float | None = None  # FLOP/s
    measured_peak_bw: float | None = None  # bytes/s
    datasheet_peak_flops: float | None = None
    datasheet_peak_bw: float | None = None

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def best_s(self) -> float:
        """Fastest sample: STREAM-style "best rate" for peak measurements (noise only slows things down)."""
        return min(self.samples_s)

    def rate(self, amount: float, *, best: bool = False) -> float:
        """``amount`` per second at the median (or best) sample time, e.g. ``t.rate(t.bytes)``."""
        return amount / (self.best_s if best else self.median_s)

    @property
    def p10_s(self) -> float:
        return _quantile(sorted(self.samples_s), 0.10)

    @property
    def p90_s(self) -> float:
        return _quantile(sorted(self.samples_s), 0.90)

    @property
    def iqr_s(self) -> float:
        s = sorted(self.samples_s)
        return _quantile(s, 0.75) - _quantile(s, 0.25)

    @property
    def spread(self) -> float:
        """(p90 − p10) / median: 0.05 means the middle 80% of samples lie within ±2.5%."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else float("nan")

    @property
    def gbps(self) -> float | None:
        return None if self.bytes is None else self.bytes / self.median_s / 1e9

    @property
    def tflops(self) -> float | None:
        return None if self.flops is None else self.flops / self.median_s / 1e12

    @property
    def gflops(self) -> float | None:
        return None if self.flops is None else self.flops / self.median_s / 1e9

    @property
    def intensity(self) -> float | None:
        """FLOP per byte, from the counted (not measured) FLOPs and bytes."""
        if self.flops is None or not self.bytes:
            return None
        return self.flops / self.bytes

    def _pct(self, rate: float | None, peak: float | None) -> float | None:
        return None if rate is None or not peak else 100.0 * rate / peak

    @property
    def pct_measured_bw(self) -> float | None:
        return self._pct(self.bytes and self.bytes / self.median_s, self.measured_peak_bw)

    @property
    def pct_measured_flops(self) -> float | None:
        return self._pct(self.flops and self.flops / self.median_s, self.measured_peak_flops)

    @property
    def pct_datasheet_bw(self) -> float | None:
        return self._pct(self.bytes and self.bytes / self.median_s, self.datasheet_peak_bw)

    @property
    def pct_datasheet_flops(self) -> float | None:
        return self._pct(self.flops and self.flops / self.median_s, self.datasheet_peak_flops)

    def __str__(self) -> str:
        def t(x: float) -> str:
            return f"{x * 1e3:.3g} ms" if x >= 1e-3 else f"{x * 1e6:.3g} us"

        def pct(measured: float | None, datasheet: float | None) -> str:
            parts = [
                (
                    f"{measured:.0f}% of measured peak"
                    + (": above it, a probe error or a cache" if measured > 100 else "")
                )
                if measured is not None
                else "",
                f"{datasheet:.0f}% of datasheet" if datasheet is not None else "",
            ]
            parts = [p for p in parts if p]
            return f" ({', '.join(parts)})" if parts else ""

        out = (
            f"{self.label or 'fn'}: median {t(self.median_s)} [p10 {t(self.p10_s)}, p90 {t(self.p90_s)}, "
            f"n={len(self.samples_s)}]"
        )
        if self.gbps is not None:
            out += f" | {self.gbps:.3g} GB/s" + pct(self.pct_measured_bw, self.pct_datasheet_bw)
        if self.flops:
            out += f" | {self.gflops:.3g} GFLOP/s" + pct(self.pct_measured_flops, self.pct_datasheet_flops)
        return out


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_amount(name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative finite number or None, got {value!r}")
    return float(value)


def _device_kind(device) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or None, got {device!r}")
    return kind


def _peaks_for(kind: str, dtype: str | None, peaks) -> tuple[float | None, float | None, float | None, float | None]:
    """(measured FLOP/s, measured B/s, datasheet FLOP/s, datasheet B/s) where known; never measures."""
    mf = mb = df = db = None
    measured = cached_peaks(kind) if peaks is None else (peaks or None)
    if measured is not None:
        mb = measured.bandwidth
        try:
            mf = measured.peak_flops(dtype)
        except ValueError:
            mf = None
    if peaks is not False and kind == "cuda":
        spec = spec_for_device(detect_device("cuda"), quiet=True)
        if spec is not None:
            db = spec.bandwidth
            try:
                df = spec.peak_flops(dtype or "bf16")
            except ValueError:
                df = None
    return mf, mb, df, db


def benchmark(
    fn: Callable[[], object],
    *,
    flops: float | None = None,
    bytes: float | None = None,
    warmup: int | None = None,
    repeats: int | None = None,
    device=None,
    label: str = "",
    dtype: str | None = None,
    peaks=None,
    sync: Callable[[], None] | None = None,
    timer: Callable[[], float] | None = None,
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed ones, each bracketed by a
    device synchronisation. ``flops``/``bytes`` are what one call does (counted by you, e.g. with
    ``course_lib.measure.costs``); ``dtype`` picks which FLOP/s peak the %-of-peak columns use.

    GPU: CUDA events recorded around each call, one synchronisation at the end (what
    ``triton.testing.do_bench`` does). CPU, or when ``sync``/``timer`` are given (tests pass stubs):
    ``sync(); t0 = timer(); fn(); sync(); t1 = timer()``. ``peaks``: a ``MeasuredPeaks`` to compare
    with, None for those already measured this session (never triggers a measurement), False for none.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a zero-argument callable, got {type(fn).__name__}")
    warmup = _check_count("warmup", pick(2, 5) if warmup is None else warmup, 0)
    repeats = _check_count("repeats", pick(7, 25) if repeats is None else repeats, 1)
    flops = _check_amount("flops", flops)
    bytes = _check_amount("bytes", bytes)
    if dtype is not None:
        dtype = canonical(dtype)
    kind = _device_kind(device)

    if kind == "cuda" and sync is None and timer is None:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for start, end in zip(starts, ends):
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]  # ms -> s
    else:
        sync = sync or (torch.cuda.synchronize if kind == "cuda" else torch.cpu.synchronize)
        timer = timer or time.perf_counter
        for _ in range(warmup):
            fn()
        sync()
        samples = []
        for _ in range(repeats):
            sync()
            t0 = timer()
            fn()
            sync()
            samples.append(timer() - t0)
    mf, mb, df, db = _peaks_for(kind, dtype, peaks)
    return Timing(label, kind, tuple(samples), flops, bytes, mf, mb, df, db)


def time_unsynchronised(fn: Callable[[], object], *, repeats: int = 10, device=None, label: str = "") -> Timing:
    """THE WRONG WAY, kept for one lesson: read the clock around ``fn()`` without synchronising.

    On a GPU this measures how long it takes to *enqueue* the work, not to do it, so it reports
    impossible speeds. On a CPU torch runs each op to completion before returning, so this is
    equivalent to ``benchmark`` (minus warm-up) and the lesson needs a GPU to show.
    """
    repeats = _check_count("repeats", repeats, 1)
    kind = _device_kind(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    if kind == "cuda":
        torch.cuda.synchronize()  # only so the next cell starts clean; the samples above are wrong
    return Timing(label or "unsynchronised (wrong)", kind, tuple(samples))
