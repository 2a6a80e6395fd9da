"""Exercises of 05_attention_kv_cache.ipynb: KV bytes per token of a real model, how many requests fit
beside the weights, a re-measured KV-cache speed-up, and the KV-streaming floor of a decode step on the
learner's own bandwidth."""

from __future__ import annotations

import math

from course_lib.exercises import check, check_measurement
from course_lib.measure.claims import Verdict


def check_kv_bytes_per_token(answer, model: str = "llama-3-8b", dtype: str = "bf16") -> Verdict:
    """Exercise 1: KV-cache bytes per token of a preset model."""
    from course_lib.models.accounting import ModelShape, kv_bytes_per_token

    shape = ModelShape.from_name(model)
    return check(
        f"KV bytes per token of {model} in {dtype}",
        answer,
        kv_bytes_per_token(shape, dtype),
        rtol=1e-9,
        unit="B",
        hint=f"2 (K and V) · {shape.num_layers} layers · {shape.num_kv_heads} KV heads · {shape.head_dim} · bytes per "
        "element: the KV heads, not the query heads.",
    )


def check_fit_requests(answer, model: str = "llama-3-8b", gpu: str = "H100 SXM", context: int = 8192) -> Verdict:
    """Exercise 2: requests of ``context`` tokens that fit in 90% of the GPU's memory beside bf16 weights."""
    from course_lib.kv.formulas import fit_requests

    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, int)):
        raise ValueError(f"answer must be an int (a number of requests), got {answer!r}")
    return check(
        f"{context}-token requests of {model} that fit on one {gpu}",
        answer,
        fit_requests(model, gpu, "bf16", context),
        rtol=0.0,
        atol=1.0,
        hint="(0.9 · GPU memory − weight bytes) // (KV bytes per token · context).",
    )


def check_kv_speedup(answer, length: int = 128) -> Verdict:
    """Exercise 3 (re-measure): how many times faster tiny-target reaches ``length`` tokens with the cache."""
    from course_lib.kv.on_off import kv_on_off

    def measure() -> float:
        return kv_on_off("tiny-target", lengths=[length], repeats=3).rows[0].speedup

    return check_measurement(
        f"KV-cache speed-up at {length} tokens",
        answer,
        measure,
        unit="x",
        hint=f"kv_on_off('tiny-target', lengths=[{length}]).rows[0].speedup",
    )


def check_kv_stream_ms(
    answer, bandwidth: float, model: str = "llama-2-7b", batch: int = 16, context: int = 4096
) -> Verdict:
    """Exercise 4 (your peaks): ms to read the whole fp16 KV cache of a decode batch once at ``bandwidth``."""
    from course_lib.kv.formulas import kv_gb

    if (
        isinstance(bandwidth, bool)
        or not isinstance(bandwidth, (int, float))
        or not math.isfinite(bandwidth)
        or bandwidth <= 0
    ):
        raise ValueError(f"bandwidth must be a positive number of bytes/s, got {bandwidth!r}")
    return check(
        f"ms to stream {model}'s fp16 KV cache (batch {batch}, {context} tokens) at your bandwidth",
        answer,
        kv_gb(model, "fp16", context, batch) * 1e9 / bandwidth * 1e3,
        rtol=0.02,
        unit="ms",
        hint="bytes = KV bytes per token · context · batch; time = bytes / bandwidth.",
    )
