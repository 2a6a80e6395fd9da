"""Exercises of 00_setup_and_hardware.ipynb: ridge points and bandwidth arithmetic."""

from __future__ import annotations

from course_lib.exercises import check, check_measurement
from course_lib.measure.claims import Verdict
from course_lib.measure.costs import triad_cost
from course_lib.measure.hardware.datasheet import gpu_spec
from course_lib.models.accounting import ModelShape, weights_read_per_step


def ridge_expected(gpu: str = "H100 SXM", dtype: str = "bf16") -> float:
    return gpu_spec(gpu).ridge(dtype)


def check_ridge(answer, gpu: str = "H100 SXM", dtype: str = "bf16") -> Verdict:
    """Exercise 1: the ridge point (FLOP/byte) of ``gpu`` in ``dtype`` from its datasheet."""
    return check(
        f"ridge point of {gpu} ({dtype})",
        answer,
        ridge_expected(gpu, dtype),
        unit="FLOP/byte",
        hint="peak FLOP/s divided by bytes/s — mind the units: TFLOP/s = 1e12, TB/s = 1e12.",
    )


def check_triad_bytes(answer, n: int) -> Verdict:
    """Exercise 2: bytes a STREAM triad a = b + s·c over n fp32 elements moves (as STREAM counts)."""
    return check(
        f"bytes moved by a triad over {n:,} fp32 elements",
        answer,
        triad_cost(n, "fp32").bytes,
        rtol=1e-9,
        unit="B",
        hint="two arrays are read and one is written; 4 bytes each.",
    )


def weight_read_ms(model: str = "llama-2-7b", gpu: str = "H200 SXM", dtype: str = "bf16") -> float:
    return weights_read_per_step(ModelShape.from_name(model), 1, dtype) / gpu_spec(gpu).bandwidth * 1e3


def check_weight_read_ms(answer, model: str = "llama-2-7b", gpu: str = "H200 SXM", dtype: str = "bf16") -> Verdict:
    """Exercise 3: the least time (ms) ``gpu`` needs to read the weights one batch-1 decode step reads —
    every matrix and the LM head, and of the embedding table only the one row looked up."""
    return check(
        f"time to read {model} {dtype} weights once on {gpu}",
        answer,
        weight_read_ms(model, gpu, dtype),
        unit="ms",
        hint="weight bytes one step reads (accounting.weights_read_per_step) / datasheet bandwidth, in ms.",
    )


def check_cache_speedup(answer, n_bytes: int = 2**20) -> Verdict:
    """Exercise 4 (re-measure): the triad over cache-sized arrays (``n_bytes`` each) vs the
    machine's DRAM triad, as a ratio of GB/s. The check measures both again."""
    from course_lib.measure.microbench import machine_peaks, measure_bandwidth

    def measure() -> float:
        small = measure_bandwidth("triad", n_bytes=n_bytes)
        return small.rate(small.bytes, best=True) / (machine_peaks().triad_gbs * 1e9)

    return check_measurement(
        f"triad speed-up with {n_bytes / 2**20:g} MiB arrays (in cache) over DRAM",
        answer,
        measure,
        # an in-cache rate varies about 2x between runs (turbo, what else shares the cache): within a factor
        # of 2 (isclose's rtol is relative to the larger value), still far tighter than a units slip
        rtol=0.5,
        unit="x",
        hint="compare best rates (t.rate(t.bytes, best=True)) with peaks.triad_gbs, in the same units.",
    )


def check_stream_time_ms(answer, bandwidth: float, n_bytes: float = 1e9) -> Verdict:
    """Exercise 5 (your peaks): the least time, in ms, this machine needs to read ``n_bytes`` at its
    measured ``bandwidth`` (bytes/s)."""
    if not isinstance(bandwidth, (int, float)) or bandwidth <= 0:
        raise ValueError(f"bandwidth must be a positive number of bytes/s, got {bandwidth!r}")
    return check(
        f"time to read {n_bytes / 1e9:g} GB at this machine's measured bandwidth",
        answer,
        n_bytes / bandwidth * 1e3,
        unit="ms",
        hint="bytes / (bytes per second), then × 1e3 for milliseconds; peaks.bandwidth is in bytes/s.",
    )
