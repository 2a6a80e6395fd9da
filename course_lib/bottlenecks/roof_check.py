"""Measured TTFT and TPOT set beside their roofline floors: how close each phase comes to its roof.

A prefill of n tokens does 2·(matmul parameters)·n FLOPs plus causal attention (``accounting.prefill_flops``)
and reads the weights once, so from a few dozen tokens on it is compute-bound: its floor is FLOPs ÷ the
measured matmul peak. A decode step at batch 1 does 2 FLOPs per weight it streams, so it is
bandwidth-bound: its floor is (weights + KV cache) ÷ the measured bandwidth. ``compare_prefill`` and
``compare_decode`` put each measurement beside the floor (``time_floors.prefill_time``/``decode_time``,
both max(FLOPs ÷ peak, bytes ÷ bandwidth)) and give the two readings a practitioner quotes: measured ÷
floor, and the share of the binding roof reached (MFU for a compute-bound phase, MBU for a
bandwidth-bound one). ``attention_share`` is the part of a prefill's FLOPs that the quadratic term
carries. Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from course_lib.bottlenecks.time_floors import decode_time, prefill_time
from course_lib.core.dtypes import dtype_bytes
from course_lib.measure.costs import check_positive_int
from course_lib.measure.metrics import mbu, mfu
from course_lib.models.accounting import (
    ModelShape,
    attention_flops,
    decode_flops,
    decode_step_bytes,
    kv_bytes_per_token,
    param_count,
    prefill_flops,
    prefill_step_bytes,
)


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class VsRoof:
    """One measured time beside its roofline floor."""

    size: int  # prompt tokens (prefill) or batch (decode)
    flops: float
    bytes: float
    floor_s: float  # max(flops / peak, bytes / bandwidth)
    measured_s: float
    bound: str  # "compute" or "memory": which term sets the floor

    @property
    def ratio(self) -> float:
        """measured ÷ floor (1.0 = on the roof)."""
        return self.measured_s / self.floor_s

    @property
    def share_of_roof(self) -> float:
        """floor ÷ measured: the MFU of a compute-bound point, the MBU of a memory-bound one."""
        return self.floor_s / self.measured_s


def _bound(flops: float, nbytes: float, peak: float, bandwidth: float) -> str:
    return "compute" if flops / peak >= nbytes / bandwidth else "memory"


def compare_prefill(
    shape: ModelShape, measured: Mapping[int, float], peak_flops: float, bandwidth: float, dtype: str = "fp32"
) -> list[VsRoof]:
    """{prompt length: measured TTFT (s)} → one ``VsRoof`` per length, sorted by length."""
    if not isinstance(measured, Mapping) or not measured:
        raise ValueError("measured must be a non-empty mapping {prompt_len: ttft_s}")
    peak, bw = _positive("peak_flops", peak_flops), _positive("bandwidth", bandwidth)
    rows = []
    for n in sorted(measured):
        check_positive_int("each prompt length", n)
        t = _positive(f"the TTFT at {n} tokens", measured[n])
        flops, nbytes = prefill_flops(shape, n), prefill_step_bytes(shape, n, 1, dtype)
        rows.append(
            VsRoof(n, flops, nbytes, prefill_time(shape, n, peak, bw, dtype), t, _bound(flops, nbytes, peak, bw))
        )
    return rows


def compare_decode(
    shape: ModelShape,
    measured: Mapping[int, float],
    peak_flops: float,
    bandwidth: float,
    dtype: str = "fp32",
    context_len: int = 64,
) -> list[VsRoof]:
    """{batch: measured TPOT (s)} at ``context_len`` keys per sequence → one ``VsRoof`` per batch."""
    if not isinstance(measured, Mapping) or not measured:
        raise ValueError("measured must be a non-empty mapping {batch: tpot_s}")
    check_positive_int("context_len", context_len)
    peak, bw = _positive("peak_flops", peak_flops), _positive("bandwidth", bandwidth)
    rows = []
    for b in sorted(measured):
        check_positive_int("each batch", b)
        t = _positive(f"the TPOT at batch {b}", measured[b])
        flops, nbytes = decode_flops(shape, context_len, b), decode_step_bytes(shape, context_len, b, dtype)
        floor = decode_time(shape, context_len, peak, bw, dtype, b)
        rows.append(VsRoof(b, flops, nbytes, floor, t, _bound(flops, nbytes, peak, bw)))
    return rows


def attention_share(shape: ModelShape, n_tokens: int) -> float:
    """Share of a causal prefill's FLOPs in QKᵀ and PV (on average (n + 1) / 2 keys per query)."""
    check_positive_int("n_tokens", n_tokens)
    return attention_flops(shape, n_tokens, 1) * (n_tokens + 1) / 2 / prefill_flops(shape, n_tokens)


def utilization(
    shape: ModelShape,
    *,
    prompt_len: int,
    ttft_s: float,
    context_len: int,
    tpot_by_batch: Mapping[int, float],
    peak_flops: float,
    bandwidth: float,
    dtype: str = "fp32",
) -> dict[str, dict[str, float]]:
    """Huyen's two utilizations of each phase: {"prefill": {"mfu", "mbu"}, "decode b=B": {...}, ...}.
    MFU = achieved FLOP/s ÷ ``peak_flops``; MBU = (every parameter + the KV cache read or written) per
    step × steps/s ÷ ``bandwidth`` (``metrics.mfu``/``metrics.mbu``). The prefill is one step of
    ``prompt_len`` tokens in ``ttft_s``; each decode step of batch B attends to ``context_len`` keys."""
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("context_len", context_len)
    t = _positive("ttft_s", ttft_s)
    if not isinstance(tpot_by_batch, Mapping) or not tpot_by_batch:
        raise ValueError("tpot_by_batch must be a non-empty mapping {batch: tpot_s}")
    peak, bw = _positive("peak_flops", peak_flops), _positive("bandwidth", bandwidth)
    n, per_param, kv_tok = param_count(shape), dtype_bytes(dtype), kv_bytes_per_token(shape, dtype)
    out = {
        "prefill": {
            "mfu": mfu(peak_flops_per_s=peak, flops_per_s=prefill_flops(shape, prompt_len) / t),
            "mbu": mbu(n, per_param, 1 / t, bw, kv_tok * prompt_len),
        }
    }
    for b in sorted(tpot_by_batch):
        check_positive_int("each batch", b)
        step = _positive(f"the TPOT at batch {b}", tpot_by_batch[b])
        out[f"decode b={b}"] = {
            "mfu": mfu(peak_flops_per_s=peak, flops_per_s=decode_flops(shape, context_len, b) / step),
            "mbu": mbu(n, per_param, 1 / step, bw, kv_tok * context_len * b),
        }
    return out


__all__ = ["VsRoof", "attention_share", "compare_decode", "compare_prefill", "utilization"]
