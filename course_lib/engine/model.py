"""A Llama-family forward pass written to be read: embeddings → N × (attention + SwiGLU MLP) → logits.

It borrows the weight tensors of a loaded ``transformers`` model (Llama, Mistral, Qwen2 shapes;
no copy), and runs them through our own code so the KV cache, batching and attention are ours to
change. Per decode step every weight is read once for one token per sequence: ~2 FLOPs per
weight read, far below any machine's ridge point, so decode is memory-bandwidth-bound.
Introduced in 02_metrics.ipynb; changed piece by piece in chapters 04-07.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LayerWeights:
    """One decoder layer's tensors (views of the HF model's parameters)."""

    attn_norm: torch.Tensor  # (D,)
    wq: torch.Tensor  # (H*hd, D)
    wk: torch.Tensor  # (Hkv*hd, D)
    wv: torch.Tensor  # (Hkv*hd, D)
    wo: torch.Tensor  # (D, H*hd)
    bq: torch.Tensor | None  # Qwen2 has q/k/v biases, Llama does not
    bk: torch.Tensor | None
    bv: torch.Tensor | None
    mlp_norm: torch.Tensor  # (D,)
    w_gate: torch.Tensor  # (F, D)
    w_up: torch.Tensor  # (F, D)
    w_down: torch.Tensor  # (D, F)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) · weight, computed in fp32 like the reference implementation."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d + mask) v, spelled out. q (B,H,T,d), k/v (B,H,L,d), mask (B,1,T,L) bool.
    Reads q, k, v once and writes (B,H,T,d); materialises the (B,H,T,L) score matrix (FlashAttention avoids it)."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, T, L)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v  # (B, H, T, d)


class LlamaEngineModel:
    """Forward pass over an explicit KV cache. ``forward(ids, cache)`` → logits."""

    def __init__(self, hf_model) -> None:
        cfg = hf_model.config
        base = hf_model.model
        self.config = cfg
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.eps = cfg.rms_norm_eps
        self.vocab_size = cfg.vocab_size
        self.max_position = cfg.max_position_embeddings
        self.embed = base.embed_tokens.weight  # (V, D)
        self.final_norm = base.norm.weight  # (D,)
        self.lm_head = hf_model.lm_head.weight  # (V, D); the same tensor as embed when tied
        # RoPE frequencies from the HF module itself, so every rope_type (llama3, yarn, ...) is right
        self.inv_freq = base.rotary_emb.inv_freq.float()  # (hd/2,)
        self.rope_scale = float(base.rotary_emb.attention_scaling)
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(LayerWeights(
                layer.input_layernorm.weight, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight,
                a.q_proj.bias, a.k_proj.bias, a.v_proj.bias, layer.post_attention_layernorm.weight,
                m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight,
            ))
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self.use_sdpa = True  # False: the spelled-out attention_ref (same maths, slower)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (B, 1, T, hd) for absolute ``positions`` (B, T)."""
        freqs = positions[..., None].float() * self.inv_freq  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, hd)
        cos = (emb.cos() * self.rope_scale).to(self.dtype)[:, None]
        sin = (emb.sin() * self.rope_scale).to(self.dtype)[:, None]
        return cos, sin

    def forward(self, input_ids: torch.Tensor, cache=None, logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) → logits (B, T, V), or (B, K, V) at the positions ``logits_at`` (B, K).

        With a cache, the T tokens continue each row after the tokens it already holds; without
        one (the "no KV cache" path of chapter 05), they are the whole sequence from position 0.
        """
        B, T = input_ids.shape
        if cache is not None:
            positions = cache.positions_for(T)  # (B, T) absolute positions
        else:
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        cos, sin = self.rope(positions)
        x = F.embedding(input_ids, self.embed)  # (B, T, D)
        mask = None
        for i, w in enumerate(self.layers):
            h = rms_norm(x, w.attn_norm, self.eps)
            q = F.linear(h, w.wq, w.bq).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
            k = F.linear(h, w.wk, w.bk).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
            v = F.linear(h, w.wv, w.bv).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if cache is not None:
                k, v = cache.update(i, k, v)  # (B, Hkv, L, hd): everything this row has seen
            if mask is None:
                key_pos = torch.arange(k.shape[2], device=x.device)  # (L,)
                mask = (key_pos[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, T, L) causal
            group = self.num_heads // self.num_kv_heads
            if group > 1:  # GQA: each KV head serves `group` query heads
                k = k.repeat_interleave(group, dim=1)  # (B, H, L, hd)
                v = v.repeat_interleave(group, dim=1)
            if self.use_sdpa:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, hd)
            else:
                o = attention_ref(q, k, v, mask)
            x = x + F.linear(o.transpose(1, 2).reshape(B, T, -1), w.wo)  # (B, T, D)
            h = rms_norm(x, w.mlp_norm, self.eps)
            x = x + F.linear(F.silu(F.linear(h, w.w_gate)) * F.linear(h, w.w_up), w.w_down)  # SwiGLU
        if logits_at is not None:
            x = x.gather(1, logits_at[..., None].expand(-1, -1, x.shape[-1]))  # (B, K, D)
        x = rms_norm(x, self.final_norm, self.eps)
        return F.linear(x, self.lm_head)  # (B, T or K, V)

    __call__ = forward
