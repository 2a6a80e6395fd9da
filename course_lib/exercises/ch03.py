"""Exercises of 03_compression.ipynb: bytes of a quantized matrix, the RTN error bound, a re-measured
speed-up, and the weight-streaming floor on the learner's own bandwidth."""

from __future__ import annotations

from course_lib.compression.quantize import QuantConfig, expected_nbytes
from course_lib.exercises import check, check_measurement
from course_lib.measure.claims import Verdict


def check_int4_bytes(answer, shape: tuple[int, int] = (4096, 11008), group_size: int = 128) -> Verdict:
    """Exercise 1: bytes of an int4 asymmetric matrix with fp32 scale and zero per group."""
    return check(
        f"bytes of a {shape[0]}x{shape[1]} int4 matrix, groups of {group_size}",
        answer,
        expected_nbytes(shape, QuantConfig(4, False, "group", group_size)),
        rtol=1e-9,
        unit="B",
        hint="half a byte per weight, plus two 4-byte numbers (scale, zero) per group of inputs in every row.",
    )


def check_rtn_bound(answer, absmax: float = 0.5, bits: int = 8) -> Verdict:
    """Exercise 2: the largest round-to-nearest error with a symmetric per-tensor scale."""
    qmax = 2 ** (bits - 1) - 1
    return check(
        f"largest RTN error, int{bits} symmetric, max|w| = {absmax}",
        answer,
        absmax / qmax / 2,
        hint=f"scale = max|w| / {qmax}; rounding is off by at most half a step.",
    )


def check_remeasured_speedup(answer, n: int, batch: int = 16, device: str = "cpu") -> Verdict:
    """Exercise 3 (re-measure): int4 g128's speed-up over fp32 on an n×n product at ``batch`` rows."""
    from course_lib.compression.apply import gemv_speed

    def measure() -> float:
        rows = gemv_speed(n, n, [QuantConfig(4, False, "group", 128)], batch=batch, repeats=10, device=device)
        return rows[0].seconds / rows[1].seconds

    return check_measurement(
        f"int4 speed-up over fp32 at batch {batch}",
        answer,
        measure,
        unit="x",
        hint="rows[0].seconds / rows[-1].seconds from apply.gemv_speed(N, N, configs, batch=16).",
    )


def check_stream_ms(answer, bandwidth: float, model: str = "bench-80m", config: QuantConfig | None = None) -> Verdict:
    """Exercise 4 (your peaks): ms to stream ``model``'s quantized linear weights once at ``bandwidth``."""
    from course_lib.compression.apply import linear_bytes, quantize_engine
    from course_lib.engine import Engine
    from course_lib.models.load import random_model

    if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or bandwidth <= 0:
        raise ValueError(f"bandwidth must be a positive number of bytes/s, got {bandwidth!r}")
    if answer is None:
        return check("weight-streaming floor", None, 0.0)
    m, tok = random_model(model)
    eng = Engine(m, tok)
    quantize_engine(eng, config or QuantConfig(4, False, "group", 128))
    return check(
        f"{model} linear weights streamed once at this machine's bandwidth",
        answer,
        linear_bytes(eng) / bandwidth * 1e3,
        unit="ms",
        hint="apply.linear_bytes(quantized engine) / peaks.bandwidth * 1e3",
    )
