"""The roofline model: attainable FLOP/s = min(peak FLOP/s, intensity × bandwidth).

An operation whose arithmetic intensity (FLOP per byte moved) lies left of the ridge point
(peak ÷ bandwidth, Xiao & Zhu's "hardware arithmetic intensity") is bandwidth-bound: its speed is set
by bytes/s and extra compute is free. Right of the ridge it is compute-bound. ``llm_phases`` places
an LLM's decode step and prefill on a GPU's roofline from the model's shape alone, and
``prefill_time`` / ``decode_time`` / ``output_input_ratio`` / ``generation_flops`` turn the same
accounting into the times a measured prefill (TTFT) and decode step (TPOT) should not beat.
"Memory-bound" has a second meaning, capacity: ``fits_in_memory`` says whether weights + KV cache fit
in a GPU at all. ``training_vs_inference`` and ``decode_time_options`` are first-principles predictions
for two questions chapter 02 asks (why training reaches a higher MFU; more chips or faster memory?).
Introduced in 00_setup_and_hardware.ipynb; LLM phases in 01_bottlenecks.ipynb; time predictions in
02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from course_lib.core.dtypes import dtype_bytes
from course_lib.measure.costs import check_positive_int
from course_lib.models.accounting import (
    ModelShape,
    decode_flops,
    decode_intensity,
    decode_step_bytes,
    kv_bytes_per_token,
    param_count,
    prefill_flops,
    prefill_step_bytes,
    weight_bytes,
    weights_read_per_step,
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
        from course_lib.measure.hardware import gpu_spec

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


# ----------------------------------------------------------------------------- capacity
def _shape(model) -> ModelShape:
    return model if isinstance(model, ModelShape) else ModelShape.from_name(model)


def _spec(gpu):
    from course_lib.measure.hardware import gpu_spec

    return gpu if hasattr(gpu, "memory_gb") else gpu_spec(gpu)


def device_bytes(gpu) -> float:
    """Bytes of memory on ``gpu`` (a name or a ``GpuSpec``). Datasheets say "GB" but GPU memory comes
    in binary units: an H100's "80GB" is 80 GiB = 85.9e9 bytes (torch sees ≈79 GiB of it after the
    driver's and ECC's reserve), so this is ``memory_gb`` × 2**30, an upper bound on what is usable."""
    return _spec(gpu).memory_gb * 2**30


@dataclass(frozen=True)
class Capacity:
    """Whether ``batch`` sequences of ``context_len`` tokens fit in one GPU's memory: weights + KV cache
    (activations, the CUDA context and allocator slack are not counted). Sizes are printed in GB = 1e9
    bytes, the device's datasheet size also in GiB = 2**30 bytes."""

    model: str
    gpu: str
    batch: int
    context_len: int
    weights_bytes: float
    kv_bytes: float
    device_bytes: float  # the datasheet memory
    max_batch: int  # most sequences of context_len tokens that fit beside the weights (0 if none)
    usable: float = 1.0  # fraction of device_bytes the engine may fill

    @property
    def usable_bytes(self) -> float:
        return self.device_bytes * self.usable

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    @property
    def overflow(self) -> str | None:
        """'weights' if they alone exceed the memory, else 'kv cache' if weights + KV do, else None."""
        if self.weights_bytes > self.usable_bytes:
            return "weights"
        return None if self.fits else "kv cache"

    def __str__(self) -> str:
        sizes = (
            f"weights {self.weights_bytes / 1e9:.1f} GB + KV cache {self.kv_bytes / 1e9:.1f} GB = "
            f"{self.total_bytes / 1e9:.1f} GB {'<=' if self.fits else '>'} {self.usable_bytes / 1e9:.1f} GB "
            f"({self.usable:.0%} of the {self.gpu}'s {self.device_bytes / 2**30:g} GiB)"
        )
        seqs = f"{self.max_batch} sequences of {self.context_len} tokens fit"
        if self.overflow == "weights":
            return f"{sizes}: the weights alone overflow; no sequence fits on one GPU"
        if self.overflow == "kv cache":
            return f"{sizes}: the KV cache overflows; " + (
                f"at most {seqs}" if self.max_batch else f"not even one sequence of {self.context_len} tokens fits"
            )
        return (
            f"{sizes}: fits, {self.total_bytes / self.usable_bytes:.0%} full (activations not counted); at most {seqs}"
        )


def fits_in_memory(
    model, gpu, batch: int, context_len: int, dtype: str = "bf16", kv_dtype: str | None = None, usable: float = 0.9
) -> Capacity:
    """Capacity check for ``batch`` sequences each holding ``context_len`` tokens of KV cache beside
    ``model``'s weights (a ``ModelShape`` or preset name) on one ``gpu`` (a name or ``GpuSpec``).
    Returns a ``Capacity``; its ``str`` says what overflows and how many sequences would fit.
    ``usable``: the share of the memory an engine may fill (vLLM's ``gpu_memory_utilization`` default,
    0.9, data/references.json: vllm_gpu_memory_utilization; the rest holds the CUDA context, activations
    and allocator slack)."""
    check_positive_int("batch", batch)
    if isinstance(usable, bool) or not isinstance(usable, (int, float)) or not 0 < usable <= 1:
        raise ValueError(f"usable must be a fraction in (0, 1], got {usable!r}")
    check_positive_int("context_len", context_len)
    shape, spec = _shape(model), _spec(gpu)
    weights = weight_bytes(shape, dtype)
    per_seq = kv_bytes_per_token(shape, kv_dtype or dtype) * context_len
    memory = device_bytes(spec)
    max_batch = max(0, int((memory * usable - weights) // per_seq))
    return Capacity(shape.name, spec.name, batch, context_len, weights, per_seq * batch, memory, max_batch, usable)


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
    _positive("ridge", ridge)
    shape = _shape(model)
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
    shape = _shape(model)
    decode = _estimate(
        "decode",
        decode_flops(shape, context_len, batch),
        decode_step_bytes(shape, context_len, batch, dtype),
        batch,
        roof,
    )
    prefill = _estimate(
        "prefill",
        prefill_flops(shape, prompt_len, batch),
        prefill_step_bytes(shape, prompt_len, batch, dtype),
        batch * prompt_len,
        roof,
    )
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


# ----------------------------------------------------------------------------- time predictions
def prefill_time(
    shape: ModelShape, n_tokens: int, peak_flops: float, bandwidth: float, dtype: str = "fp32", batch: int = 1
) -> float:
    """Roofline lower bound of a prefill: max(FLOPs / peak, (weights streamed + KV written) / bandwidth)."""
    return min_time(
        prefill_flops(shape, n_tokens, batch),
        prefill_step_bytes(shape, n_tokens, batch, dtype),
        peak_flops,
        bandwidth,
    )


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


# ----------------------------------------------------------------------------- training vs inference
ADAM_STATE_BYTES = 24.0  # per parameter: fp32 master weight, Adam m and v, each read and written once a step


def training_step_bytes(shape: ModelShape, dtype: str = "bf16") -> float:
    """Least bytes one mixed-precision Adam step moves, activations ignored: weights read in the forward
    and again in the backward pass, gradients written and read back by the optimizer, new weights
    written (5 × bytes per parameter), plus ``ADAM_STATE_BYTES``: 34 B/parameter in bf16."""
    return param_count(shape) * (5 * dtype_bytes(dtype) + ADAM_STATE_BYTES)


@dataclass(frozen=True)
class MfuBound:
    """A step's arithmetic intensity against a GPU's ridge: the highest MFU the roofline allows it."""

    phase: str
    flops: float
    bytes: float
    ridge: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def mfu_bound(self) -> float:
        """min(1, intensity / ridge): left of the ridge the step cannot keep the compute units busy."""
        return min(1.0, self.intensity / self.ridge)

    def __str__(self) -> str:
        return f"{self.phase}: {self.intensity:,.1f} FLOP/byte vs ridge {self.ridge:.0f} -> MFU <= {self.mfu_bound:.1%}"


def training_vs_inference(
    model,
    gpu,
    *,
    seq_len: int = 2048,
    seqs: int = 16,
    decode_batch: int = 1,
    context_len: int = 512,
    dtype: str = "bf16",
) -> tuple[MfuBound, MfuBound]:
    """Why training reaches a higher MFU than inference: the MFU ceiling of one training step over
    ``seqs`` × ``seq_len`` tokens (forward + backward = 3 × a prefill's FLOPs, i.e. 6·N per token plus
    attention, over ``training_step_bytes``) and of one decode step at ``decode_batch``, on ``gpu``'s
    datasheet roof in ``dtype``. A training step reuses each weight for every token of the batch; a
    decode step for one token per sequence."""
    shape, spec = _shape(model), _spec(gpu)
    ridge = spec.ridge(dtype)
    train = MfuBound(
        f"training step ({seqs} x {seq_len} tokens)",
        3 * prefill_flops(shape, seq_len, seqs),
        training_step_bytes(shape, dtype),
        ridge,
    )
    decode = MfuBound(
        f"decode step (batch {decode_batch}, context {context_len})",
        decode_flops(shape, context_len, decode_batch),
        decode_step_bytes(shape, context_len, decode_batch, dtype),
        ridge,
    )
    return train, decode


# ----------------------------------------------------------------------------- more chips or faster memory
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
    shape = _shape(model)
    weights_read = weights_read_per_step(shape, batch, dtype)
    kv = kv_bytes_per_token(shape, kv_dtype or dtype) * context_len * batch
    flops = decode_flops(shape, context_len, batch)
    rows = []
    for gpu in [gpus] if isinstance(gpus, str) else gpus:
        spec = _spec(gpu)
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
