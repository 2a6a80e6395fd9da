"""Where an LLM's two phases land on a GPU's roofline, predicted from the model's shape alone.

A decode step adds one token per sequence: every weight is read for ~2 FLOPs per sequence, so at small
batch it sits far left of the ridge (bandwidth-bound) and batching moves it right. A prefill pushes
the whole prompt through each weight at once (compute-bound). ``llm_phases`` places both on a
datasheet roof with their FLOPs, bytes, time floor and whether they fit in memory; ``batch_to_reach``
finds the batch at which decode meets the ridge. Introduced in 01_bottlenecks_2_prefill_decode.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.bottlenecks.capacity import Capacity, fits_in_memory
from course_lib.measure.costs import check_positive_int
from course_lib.measure.roofline import Roof, check_positive, min_time
from course_lib.models.accounting import as_shape, decode_cost, decode_intensity, prefill_cost


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
    """Decode and prefill of ``model`` on ``gpu`` at ``batch``: what the explorer shows. ``dtype`` sizes
    the weights and KV cache; ``compute_dtype`` picks the roof (the same unless the chip lacks ``dtype``)."""

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
    capacity: Capacity
    compute_dtype: str = ""

    @property
    def weights_gb(self) -> float:
        return self.capacity.weights_bytes / 1e9

    @property
    def fits_in_memory(self) -> bool:
        return self.capacity.fits

    def __str__(self) -> str:
        roof_dtype = f" ({self.compute_dtype} roof)" if self.compute_dtype not in ("", self.dtype) else ""
        lines = [
            f"{self.model} {self.dtype} on {self.gpu}{roof_dtype}: ridge {self.roof.ridge:.0f} FLOP/byte",
            f"  memory: {self.capacity}",
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
    check_positive("ridge", ridge)
    shape = as_shape(model)
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
    gpu: str,
    model: str,
    *,
    batch: int = 1,
    dtype: str = "bf16",
    prompt_len: int = 512,
    context_len: int = 512,
    compute_dtype: str | None = None,
) -> PhaseReport:
    """Predict where ``model``'s decode step (batch sequences each adding one token to a
    ``context_len`` cache) and prefill (batch × prompt_len tokens) land on ``gpu``'s datasheet roof.
    Weights and KV cache are stored in ``dtype``; the roof is that of ``compute_dtype`` (default:
    ``dtype``; e.g. fp8 weights on an A100, which computes them in bf16)."""
    check_positive_int("batch", batch)
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("context_len", context_len)
    compute_dtype = compute_dtype or dtype
    roof = Roof.from_spec(gpu, compute_dtype)
    shape = as_shape(model)
    decode = _estimate("decode", *decode_cost(shape, context_len, batch, dtype), batch, roof)
    prefill = _estimate("prefill", *prefill_cost(shape, prompt_len, batch, dtype), batch * prompt_len, roof)
    capacity = fits_in_memory(shape, gpu, batch, max(context_len, prompt_len), dtype)
    return PhaseReport(
        capacity.gpu,
        shape.name,
        dtype,
        batch,
        prompt_len,
        context_len,
        roof,
        decode,
        prefill,
        batch_to_reach(roof.ridge, shape, context_len=context_len, dtype=dtype),
        capacity,
        compute_dtype,
    )
