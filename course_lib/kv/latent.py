"""KV bytes per token beyond fewer heads: Multi-head Latent Attention (MLA, DeepSeek-V2) caches one compressed
latent per token and layer instead of K and V per head, and Cross-Layer Attention (CLA, Brandon et al. 2024)
lets adjacent layers share one K/V. Pure accounting (no model runs): per token, MHA caches
2 · layers · heads · head_dim elements, GQA 2 · layers · kv_heads · head_dim, MLA layers · (kv_lora_rank +
qk_rope_head_dim) (the latent plus the one decoupled RoPE key all heads share), and CLA divides any of them by
the sharing factor. DeepSeek-V2's published config (arXiv:2405.04434, Table and its config.json): 60 layers,
128 heads, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, kv_lora_rank 512.
Introduced in 05_attention_kv_cache.ipynb."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MLAConfig:
    """The attention shape of an MLA model (DeepSeek-V2's names)."""

    name: str
    num_layers: int
    num_heads: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kv_lora_rank: int

    def __post_init__(self) -> None:
        for f in ("num_layers", "num_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MLAConfig.{f} must be an int ≥ 1, got {v!r}")


#: DeepSeek-V2 (236B total, 21B active), as its config.json publishes it
DEEPSEEK_V2 = MLAConfig("DeepSeek-V2", 60, 128, 128, 64, 128, 512)


def mla_elements_per_token(cfg: MLAConfig) -> int:
    """Elements MLA caches per token: one latent (kv_lora_rank) and one shared RoPE key per layer."""
    return cfg.num_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)


def mha_elements_per_token(cfg: MLAConfig) -> int:
    """Elements the same attention would cache as plain MHA: each head's K (nope + rope dims) and V."""
    return cfg.num_layers * cfg.num_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)


def gqa_equivalent_groups(cfg: MLAConfig) -> float:
    """The number of KV heads a GQA model with head_dim = qk_nope_head_dim would need to cache as much:
    (kv_lora_rank + qk_rope_head_dim) / (2 · head_dim) (DeepSeek-V2's paper: 2.25 groups)."""
    return (cfg.kv_lora_rank + cfg.qk_rope_head_dim) / (2 * cfg.qk_nope_head_dim)


def cross_layer_bytes(bytes_per_token: float, share: int) -> float:
    """KV bytes per token when every ``share`` adjacent layers use one K/V (CLA): divided by ``share``."""
    if isinstance(share, bool) or not isinstance(share, int) or share < 1:
        raise ValueError(f"share must be an int ≥ 1 (layers per shared K/V), got {share!r}")
    return bytes_per_token / share
