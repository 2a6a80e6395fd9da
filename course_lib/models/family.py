"""The embedded model family: small Llama-architecture checkpoints the course trains and ships.

Real ``transformers`` Llama configs (RoPE, RMSNorm, SwiGLU, grouped-query attention), so every
technique measured on them transfers to hub models of the same family. Add a variant (a distilled
draft, a model with Medusa heads) by adding a spec here: the loader needs no change.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TinySpec:
    """Shape of one embedded model; ``to_config`` turns it into a ``LlamaConfig``."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position: int = 1024
    description: str = ""

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_position"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"TinySpec.{field} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    def to_config(self, vocab_size: int, eos_token_id: int, pad_token_id: int):
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.hidden_size // self.num_heads,
            max_position_embeddings=self.max_position,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=True,
            bos_token_id=eos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            hidden_act="silu",
        )


SPECS: dict[str, TinySpec] = {
    "tiny-target": TinySpec(
        "tiny-target", 256, 6, 8, 2, 640, description="target model: 6 layers, GQA 8 query heads / 2 KV heads"
    ),
    "tiny-draft": TinySpec(
        "tiny-draft",
        96,
        2,
        3,
        1,
        256,
        description="draft model for speculative decoding: ~8x fewer parameters, same tokenizer",
    ),
    # random weights only: speed does not depend on weight values (benchmarks/engine_vs_hf.py)
    "bench-80m": TinySpec(
        "bench-80m",
        768,
        12,
        12,
        4,
        2048,
        description="~79M parameters (314 MB fp32, ten times a 32 MB L3): decode speed on "
        "a model that does not fit in cache; random weights, never trained",
    ),
    # smoke: used by the tests to train a few steps in seconds
    "smoke": TinySpec("smoke", 32, 1, 2, 1, 64, max_position=128, description="a few-second smoke-test model"),
}
