"""Roofline floors of an LLM's times: the TTFT and TPOT a measured prefill and decode step cannot beat.

``prefill_time`` and ``decode_time`` are max(FLOPs ÷ peak, bytes ÷ bandwidth) of a prefill and of one
decode step, from the model's shape; at small batch the decode floor is the weights streamed once
(bandwidth-bound), the prefill floor its FLOPs (compute-bound). ``output_input_ratio`` is their
quotient per token (why output tokens are priced higher), ``generation_flops`` the FLOPs of one
``generate``, and ``decode_time_options`` asks chapter 02's question: more chips, or faster memory?
Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.bottlenecks.capacity import device_bytes
from course_lib.measure.costs import check_positive_int
from course_lib.measure.hardware.datasheet import as_spec
from course_lib.measure.roofline import min_time
from course_lib.models.accounting import (
    ModelShape,
    as_shape,
    decode_cost,
    decode_flops,
    kv_bytes_per_token,
    prefill_cost,
    prefill_flops,
    weight_bytes,
    weights_read_per_step,
)


def prefill_time(
    shape: ModelShape, n_tokens: int, peak_flops: float, bandwidth: float, dtype: str = "fp32", batch: int = 1
) -> float:
    """Roofline lower bound of a prefill: max(FLOPs / peak, (weights streamed + KV written) / bandwidth)."""
    return min_time(*prefill_cost(shape, n_tokens, batch, dtype), peak_flops, bandwidth)


def decode_time(
    shape: ModelShape, context_len: int, peak_flops: float, bandwidth: float, dtype: str = "fp32", batch: int = 1
) -> float:
    """Roofline lower bound of one decode step (= the TPOT floor): weights + KV caches over bandwidth,
    unless the batch is large enough to make the FLOPs dominate."""
    return min_time(*decode_cost(shape, context_len, batch, dtype), peak_flops, bandwidth)


def output_input_ratio(
    shape: ModelShape, peak_flops: float, bandwidth: float, dtype: str = "bf16", context_len: int = 1
) -> float:
    """The roofline's answer to "one output token costs as much as how many input tokens?":
    a batch-1 decode step (streams the weights: bytes / bandwidth) over one compute-bound prefill token
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


@dataclass(frozen=True)
class DecodeOption:
    """The roofline floor of one decode step on ``chips`` × ``gpu`` with tensor parallelism."""

    gpu: str
    chips: int
    batch: int
    bytes_per_chip: float  # read per step
    flops_per_chip: float
    seconds: float
    bound: str
    fits: bool  # weights / chips + this chip's KV cache within one chip's memory

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.seconds

    def __str__(self) -> str:
        return (
            f"{self.chips} x {self.gpu}: {self.bytes_per_chip / 1e9:.2f} GB per chip per step -> "
            f">= {self.seconds * 1e3:.2f} ms ({self.bound}), <= {self.tokens_per_s:,.0f} tok/s in all"
            + ("" if self.fits else "; does NOT fit in memory")
        )


def decode_time_options(
    model,
    gpus=("H100 SXM", "H200 SXM"),
    *,
    batch: int = 1,
    context_len: int = 512,
    chips=(1, 2, 4, 8),
    dtype: str = "bf16",
    kv_dtype: str | None = None,
) -> list[DecodeOption]:
    """More chips or faster-memory chips? The decode-step floor of ``model`` on n of each GPU in
    ``gpus``, for each n in ``chips``. Tensor parallelism splits every weight matrix and the KV heads n
    ways (a KV head is replicated when n > num_kv_heads), so each chip reads and computes its share.
    Communication (two all-reduces per layer) is ignored: real multi-chip steps are slower than this."""
    check_positive_int("batch", batch)
    check_positive_int("context_len", context_len)
    shape = as_shape(model)
    weights_read = weights_read_per_step(shape, batch, dtype)
    kv = kv_bytes_per_token(shape, kv_dtype or dtype) * context_len * batch
    flops = decode_flops(shape, context_len, batch)
    rows = []
    for gpu in [gpus] if isinstance(gpus, str) else gpus:
        spec = as_spec(gpu)
        peak, bw = spec.peak_flops(dtype), spec.bandwidth
        for n in chips:
            check_positive_int("chips", n)
            if shape.num_heads % n:
                raise ValueError(f"chips ({n}) must divide num_heads ({shape.num_heads}) for tensor parallelism")
            kv_share = -(-shape.num_kv_heads // n) / shape.num_kv_heads  # ceil(kv_heads / n) heads per chip
            moved = weights_read / n + kv * kv_share
            held = weight_bytes(shape, dtype) / n + kv * kv_share
            seconds = min_time(flops / n, moved, peak, bw)
            kind = "memory-bound" if moved / bw >= flops / n / peak else "compute-bound"
            rows.append(DecodeOption(spec.name, n, batch, moved, flops / n, seconds, kind, held <= device_bytes(spec)))
    return rows
