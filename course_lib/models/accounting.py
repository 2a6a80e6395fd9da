"""Model accounting: parameters, weight bytes, FLOPs and KV-cache bytes from a config alone.

Every later chapter predicts a time from these numbers before measuring it: decode reads every
weight matrix once per step (bandwidth-bound), prefill does ~2·params FLOPs per token (compute-bound).
Two byte counts differ on purpose: ``weight_bytes`` is what the weights occupy (memory capacity),
``weights_read_per_step`` what one forward pass streams (only the looked-up rows of the embedding table).
Works for any Llama-family ``transformers`` config and for named presets without weights.
Introduced in 01_bottlenecks_1_roofline_overhead.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from course_lib.core.dtypes import dtype_bytes
from course_lib.measure.costs import check_positive_int


@dataclass(frozen=True)
class ModelShape:
    """The numbers that fix a Llama-style decoder's cost. Validated on construction."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_embeddings: bool = False
    max_position: int = 4096

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"ModelShape.{f.name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    @property
    def gqa_group(self) -> int:
        """Query heads sharing one KV head (1 = MHA, num_heads = MQA)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_config(cls, config, name: str | None = None) -> "ModelShape":
        """From a ``transformers`` config (LlamaConfig, Qwen2Config, MistralConfig, ...)."""
        needed = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [k for k in needed if getattr(config, k, None) is None]
        if missing:
            raise ValueError(f"config lacks {missing}; expected a Llama-family decoder config")
        heads = config.num_attention_heads
        return cls(
            name=name or getattr(config, "_name_or_path", "") or getattr(config, "model_type", "model"),
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position=getattr(config, "max_position_embeddings", 4096),
        )

    @classmethod
    def from_embedded(cls, name: str = "tiny-target") -> "ModelShape":
        """The shape of a model the course ships in ``data/models`` (read from its config.json)."""
        from transformers import AutoConfig

        from course_lib.models.load import EMBEDDED, embedded_dir

        if name not in EMBEDDED:
            raise ValueError(f"name must be one of the embedded models {EMBEDDED}, got {name!r}")
        return cls.from_config(AutoConfig.from_pretrained(embedded_dir(name)), name=name)

    @classmethod
    def from_name(cls, name: str) -> "ModelShape":
        """A preset: ``llama-2-7b``, ``llama-2-13b``, ``llama-2-70b``, ``llama-3-8b``, ``llama-3-70b``."""
        key = name.strip().lower()
        if key not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; valid: {sorted(PRESETS)}")
        return PRESETS[key]


PRESETS: dict[str, ModelShape] = {
    # Shapes from the models' published config.json files (Meta Llama 2 / Llama 3 releases).
    "llama-2-7b": ModelShape("llama-2-7b", 32000, 4096, 11008, 32, 32, 32, 128, False, 4096),
    "llama-2-13b": ModelShape("llama-2-13b", 32000, 5120, 13824, 40, 40, 40, 128, False, 4096),
    "llama-2-70b": ModelShape("llama-2-70b", 32000, 8192, 28672, 80, 64, 8, 128, False, 4096),
    "llama-3-8b": ModelShape("llama-3-8b", 128256, 4096, 14336, 32, 32, 8, 128, False, 8192),
    "llama-3-70b": ModelShape("llama-3-70b", 128256, 8192, 28672, 80, 64, 8, 128, False, 8192),
    # mistralai/Mistral-7B-v0.1 config.json (its 4096-token sliding window is not modelled: the KV cache
    # is counted for the whole context).
    "mistral-7b": ModelShape("mistral-7b", 32000, 4096, 14336, 32, 32, 8, 128, False, 32768),
    # Qwen/Qwen2.5-7B and Qwen/Qwen2.5-72B config.json (the q/k/v biases, 0.01% of the weights, are not counted).
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 152064, 3584, 18944, 28, 28, 4, 128, False, 131072),
    "qwen2.5-72b": ModelShape("qwen2.5-72b", 152064, 8192, 29568, 80, 64, 8, 128, False, 131072),
}


def as_shape(model) -> ModelShape:
    """``model`` itself if it is a ``ModelShape``, else the preset it names (``ModelShape.from_name``)."""
    return model if isinstance(model, ModelShape) else ModelShape.from_name(model)


def layer_params(shape: ModelShape) -> int:
    """Weights of one decoder layer: q,k,v,o projections + SwiGLU MLP + two RMSNorm vectors."""
    attn = shape.hidden_size * shape.head_dim * (2 * shape.num_heads + 2 * shape.num_kv_heads)
    mlp = 3 * shape.hidden_size * shape.intermediate_size
    return attn + mlp + 2 * shape.hidden_size


def param_count(shape: ModelShape, include_embeddings: bool = True) -> int:
    """Total parameters, matching ``sum(p.numel() for p in model.parameters())`` of the HF model."""
    body = shape.num_layers * layer_params(shape) + shape.hidden_size  # + final norm
    if not include_embeddings:
        return body
    head = 0 if shape.tie_embeddings else shape.vocab_size * shape.hidden_size
    return body + shape.vocab_size * shape.hidden_size + head


def matmul_params(shape: ModelShape) -> int:
    """Parameters that take part in a matmul per token (everything but embedding lookup and norms)."""
    return shape.num_layers * (layer_params(shape) - 2 * shape.hidden_size) + shape.vocab_size * shape.hidden_size


def weight_bytes(shape: ModelShape, dtype: str = "bf16") -> float:
    """Bytes all weights occupy in ``dtype``: the memory they need, not what a step reads
    (for that see ``weights_read_per_step``)."""
    return param_count(shape) * dtype_bytes(dtype)


def weights_read_per_step(shape: ModelShape, tokens: int = 1, dtype: str = "bf16") -> float:
    """Weight bytes one forward pass over ``tokens`` tokens streams (a decode step: ``tokens`` = batch;
    a prefill: batch × prompt length). An embedding lookup reads only its tokens' rows, not the table
    (one row per token, at most the vocabulary); every matrix and the LM head are read whole. Tied
    embeddings: the table is read whole as the LM head anyway and the looked-up rows are that same
    memory, so it counts once. Llama-2-7B bf16 at batch 1: ``weight_bytes`` − (32000 − 1) · 4096 · 2."""
    check_positive_int("tokens", tokens)
    head = shape.vocab_size * shape.hidden_size  # the LM head (the embedding table itself when tied)
    rows = 0 if shape.tie_embeddings else min(tokens, shape.vocab_size) * shape.hidden_size
    return (param_count(shape, include_embeddings=False) + head + rows) * dtype_bytes(dtype)


def kv_bytes_per_token(shape: ModelShape, dtype: str = "bf16") -> float:
    """2 (K and V) · layers · kv_heads · head_dim · bytes. Llama-2-7B fp16: 512 KiB."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * dtype_bytes(dtype)


def attention_flops(shape: ModelShape, n_query: int, n_context: int) -> float:
    """QK^T and PV for ``n_query`` tokens attending to ``n_context`` keys each: 4·layers·heads·hd·q·k."""
    return 4.0 * shape.num_layers * shape.num_heads * shape.head_dim * n_query * n_context


def prefill_flops(shape: ModelShape, n_tokens: int, batch: int = 1) -> float:
    """Forward FLOPs of a causal prefill of ``n_tokens`` per sequence: 2·P per token + attention
    (each token attends to itself and those before it: on average (n+1)/2 keys)."""
    check_positive_int("n_tokens", n_tokens)
    check_positive_int("batch", batch)
    dense = 2.0 * matmul_params(shape) * n_tokens
    attn = attention_flops(shape, n_tokens, 1) * (n_tokens + 1) / 2
    return batch * (dense + attn)


def decode_flops(shape: ModelShape, context_len: int, batch: int = 1) -> float:
    """FLOPs of one decode step: every sequence adds one token that attends to ``context_len`` keys."""
    check_positive_int("context_len", context_len)
    check_positive_int("batch", batch)
    return batch * (2.0 * matmul_params(shape) + attention_flops(shape, 1, context_len))


def decode_step_bytes(
    shape: ModelShape, context_len: int, batch: int = 1, dtype: str = "bf16", kv_dtype: str | None = None
) -> float:
    """Minimum bytes one decode step moves: the weights it streams (``weights_read_per_step``: only
    ``batch`` embedding rows) + each sequence's KV cache of ``context_len`` tokens."""
    check_positive_int("context_len", context_len)
    check_positive_int("batch", batch)
    kv = kv_bytes_per_token(shape, kv_dtype or dtype) * context_len * batch
    return weights_read_per_step(shape, batch, dtype) + kv


def prefill_step_bytes(
    shape: ModelShape, n_tokens: int, batch: int = 1, dtype: str = "bf16", kv_dtype: str | None = None
) -> float:
    """Minimum bytes a prefill of ``batch`` × ``n_tokens`` moves: the weights it streams (embedding
    rows for its tokens) + the KV cache it writes."""
    check_positive_int("n_tokens", n_tokens)
    check_positive_int("batch", batch)
    kv = kv_bytes_per_token(shape, kv_dtype or dtype) * n_tokens * batch
    return weights_read_per_step(shape, n_tokens * batch, dtype) + kv


def decode_intensity(
    shape: ModelShape, context_len: int, batch: int = 1, dtype: str = "bf16", kv_dtype: str | None = None
) -> float:
    """Arithmetic intensity (FLOP/byte) of a decode step: ≈ batch / bytes-per-param for short contexts."""
    return decode_flops(shape, context_len, batch) / decode_step_bytes(shape, context_len, batch, dtype, kv_dtype)


def prefill_intensity(
    shape: ModelShape, n_tokens: int, batch: int = 1, dtype: str = "bf16", kv_dtype: str | None = None
) -> float:
    """Arithmetic intensity of a prefill: weights read once, reused by every token (grows with n)."""
    return prefill_flops(shape, n_tokens, batch) / prefill_step_bytes(shape, n_tokens, batch, dtype, kv_dtype)


def prefill_cost(shape: ModelShape, n_tokens: int, batch: int = 1, dtype: str = "bf16") -> tuple[float, float]:
    """(FLOPs, minimum bytes) of a prefill of ``batch`` × ``n_tokens``: a point for the roofline."""
    return prefill_flops(shape, n_tokens, batch), prefill_step_bytes(shape, n_tokens, batch, dtype)


def decode_cost(shape: ModelShape, context_len: int, batch: int = 1, dtype: str = "bf16") -> tuple[float, float]:
    """(FLOPs, minimum bytes) of one decode step of ``batch`` sequences at ``context_len``."""
    return decode_flops(shape, context_len, batch), decode_step_bytes(shape, context_len, batch, dtype)
