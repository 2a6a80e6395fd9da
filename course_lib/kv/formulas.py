"""The KV cache in numbers: the bytes it holds (per token, per batch, beside the weights on a GPU) and the FLOPs it saves.

Each token a sequence holds keeps 2 · layers · kv_heads · head_dim · bytes of K and V
(``accounting.kv_bytes_per_token``). ``kv_gb`` turns that into gigabytes for a batch at a context,
``fit_requests`` into how many requests fit beside the weights in a GPU's usable memory, and ``kv_table``
/ ``format_kv_table`` into one row per preset model. ``step_flops`` / ``total_flops`` are the work side:
without a cache each step is a compute-bound prefill of the whole sequence (total ∝ L²), with it one token
attending to the stored keys, a bandwidth-bound read of weights and cache (total ∝ L). Arithmetic only, no
tensors. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass

from course_lib.kv.checks import check_usable, resolve_dtype, resolve_gpu, resolve_shape
from course_lib.measure.costs import check_positive_int
from course_lib.models.accounting import PRESETS, ModelShape, decode_flops, kv_bytes_per_token, prefill_flops

#: vLLM's default gpu_memory_utilization (data/references.json: vllm_gpu_memory_utilization)
USABLE = 0.9


def attention_kind(shape: ModelShape) -> str:
    """'MHA' (a KV head per query head), 'MQA' (one KV head for all) or 'GQA' (groups in between)."""
    if shape.num_kv_heads == shape.num_heads:
        return "MHA"
    return "MQA" if shape.num_kv_heads == 1 else "GQA"


def step_flops(shape: ModelShape, length: int, prompt_len: int, use_kv_cache: bool) -> float:
    """FLOPs of the step whose token makes the sequence ``length`` tokens long (batch 1).

    The first step is the prefill of the prompt either way. After it, without a cache the step is a
    prefill of all ``length − 1`` tokens so far; with it, one token attending to ``length − 1`` keys."""
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("length", length)
    if length <= prompt_len:
        raise ValueError(f"length must exceed prompt_len ({prompt_len}): a step adds a token, got {length}")
    if length == prompt_len + 1 or not use_kv_cache:
        return prefill_flops(shape, length - 1)
    return decode_flops(shape, length - 1)


def total_flops(shape: ModelShape, length: int, prompt_len: int, use_kv_cache: bool) -> float:
    """FLOPs of generating from a ``prompt_len``-token prompt until the sequence is ``length`` tokens long:
    Σ prefill(n) for n < length without a cache (∝ L²), prefill + Σ decode with it (∝ L); the cached
    total equals ``bottlenecks.time_floors.generation_flops(shape, prompt_len, length − prompt_len)``."""
    check_positive_int("length", length)
    return sum(step_flops(shape, n, prompt_len, use_kv_cache) for n in range(prompt_len + 1, length + 1))


def kv_gb(model, dtype: str = "bf16", context: int = 4096, batch: int = 1) -> float:
    """GB (1e9 bytes) of KV cache for ``batch`` sequences of ``context`` tokens: Llama-2-7B fp16 at 4096 ×
    1 is 2.15 GB (2 GiB). ``model``: a preset name or a ``ModelShape``."""
    shape = resolve_shape(model)
    dtype = resolve_dtype("dtype", dtype)
    check_positive_int("context", context)
    check_positive_int("batch", batch)
    return kv_bytes_per_token(shape, dtype) * context * batch / 1e9


def fit_requests(
    model, gpu, dtype: str = "bf16", context: int = 4096, weights_dtype: str | None = None, usable: float = USABLE
) -> int:
    """How many concurrent requests of ``context`` tokens fit, KV cache in ``dtype``, beside the weights
    (in ``weights_dtype``, default ``dtype``) in ``usable`` of one GPU's memory (``hardware.gpu_spec``;
    0.9 is vLLM's default ``gpu_memory_utilization``). 0 when not even one does, or the weights alone
    overflow. Activations and the CUDA context are not counted: a real engine fits somewhat fewer."""
    from course_lib.bottlenecks.capacity import fits_in_memory

    shape, spec = resolve_shape(model), resolve_gpu(gpu)
    dtype = resolve_dtype("dtype", dtype)
    weights_dtype = dtype if weights_dtype is None else resolve_dtype("weights_dtype", weights_dtype)
    check_positive_int("context", context)
    usable = check_usable(usable)
    return fits_in_memory(shape, spec, 1, context, weights_dtype, kv_dtype=dtype, usable=usable).max_batch


@dataclass(frozen=True)
class KvRow:
    """One model's KV cache: bytes per token, GB at a context for one request, and its attention type."""

    model: str
    kv_bytes_per_token: float
    gb_at_context: float
    attention: str  # MHA / GQA / MQA
    num_heads: int
    num_kv_heads: int


def kv_table(models: Iterable | None = None, dtype: str = "bf16", context: int = 4096) -> list[KvRow]:
    """One ``KvRow`` per model (preset names or ``ModelShape``s; default: every preset), KV cache in
    ``dtype`` at ``context`` tokens for batch 1. ``format_kv_table`` prints it."""
    dtype = resolve_dtype("dtype", dtype)
    check_positive_int("context", context)
    if models is None:
        models = sorted(PRESETS)
    if isinstance(models, (str, ModelShape)) or not isinstance(models, Iterable):
        raise ValueError(f"models must be a list of preset names or ModelShapes, got {models!r}")
    shapes = [resolve_shape(m) for m in models]
    if not shapes:
        raise ValueError("models must hold at least one model")
    return [
        KvRow(
            s.name,
            kv_bytes_per_token(s, dtype),
            kv_gb(s, dtype, context, 1),
            attention_kind(s),
            s.num_heads,
            s.num_kv_heads,
        )
        for s in shapes
    ]


def format_kv_table(rows: SequenceABC[KvRow], context: int | None = None) -> str:
    """``kv_table``'s rows as an aligned text table."""
    head = f"GB @ {context:,}" if context else "GB @ context"
    lines = [f"{'model':<14} {'KiB/token':>10} {head:>12} {'attention':<18}"]
    for r in rows:
        att = f"{r.attention} ({r.num_heads}q/{r.num_kv_heads}kv)"
        lines.append(f"{r.model:<14} {r.kv_bytes_per_token / 1024:>10g} {r.gb_at_context:>12.2f} {att:<18}")
    return "\n".join(lines)
