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


ROPE_TABLE_MAX = 16_384


@dataclass
class LayerWeights:
    """One decoder layer's tensors. q/k/v and gate/up are fused: one matmul reads them all."""

    attn_norm: torch.Tensor  # (D,)
    w_qkv: torch.Tensor  # ((H + 2·Hkv)·hd, D)
    b_qkv: torch.Tensor | None  # Qwen2 has q/k/v biases, Llama does not
    wo: torch.Tensor  # (D, H*hd)
    mlp_norm: torch.Tensor  # (D,)
    w_gate_up: torch.Tensor  # (2F, D)
    w_down: torch.Tensor  # (D, F)


def fuse_linears(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack the weights (and biases) of linears that read the same input into one tensor, then make
    the modules' parameters views of it: one big matmul instead of several small ones, no extra memory."""
    weight = torch.cat([lin.weight.data for lin in linears], dim=0)
    has_bias = [lin.bias is not None for lin in linears]
    bias = torch.cat([lin.bias.data for lin in linears], dim=0) if all(has_bias) else None
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight.data = weight[start: start + rows]  # the HF model keeps working, on shared storage
        if bias is not None:
            lin.bias.data = bias[start: start + rows]
        start += rows
    return weight, bias


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) · weight, computed in fp32 like the reference implementation."""
    if x.dtype == torch.float32 and hasattr(F, "rms_norm"):
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused op, the same maths
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


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, group: int) -> torch.Tensor:
    """Fused attention; with GQA each KV head serves ``group`` query heads (no copy where torch can)."""
    if group > 1:
        try:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        except TypeError:  # torch < 2.5 has no enable_gqa: materialise the repeated heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, L, hd)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


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
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        # cos/sin for every position, computed once: a decode step only indexes the table
        # (capped: a 128k-context model would need hundreds of MB; past the cap we compute on the fly)
        all_pos = torch.arange(min(self.max_position, ROPE_TABLE_MAX), device=self.device)[None]  # (1, P)
        self._cos, self._sin = (t[0, 0] for t in self._rope_compute(all_pos))  # (P, hd) each
        self.layers = []
        with torch.no_grad():
            for layer in base.layers:
                a, m = layer.self_attn, layer.mlp
                w_qkv, b_qkv = fuse_linears(a.q_proj, a.k_proj, a.v_proj)
                w_gate_up, _ = fuse_linears(m.gate_proj, m.up_proj)
                self.layers.append(LayerWeights(layer.input_layernorm.weight, w_qkv, b_qkv, a.o_proj.weight,
                                                layer.post_attention_layernorm.weight, w_gate_up,
                                                m.down_proj.weight))
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.ffn_size = base.layers[0].mlp.down_proj.weight.shape[1]
        self.use_sdpa = True  # False: the spelled-out attention_ref (same maths, slower)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (B, 1, T, hd) for absolute ``positions`` (B, T), looked up in the table."""
        if self.max_position > self._cos.shape[0]:
            return self._rope_compute(positions)
        return self._cos[positions][:, None], self._sin[positions][:, None]

    def _rope_compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE angles: position · inv_freq, as cos/sin (B, 1, T, hd) — what the table stores."""
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
        group = self.num_heads // self.num_kv_heads
        for i, w in enumerate(self.layers):
            h = rms_norm(x, w.attn_norm, self.eps)
            qkv = F.linear(h, w.w_qkv, w.b_qkv)  # (B, T, (H + 2·Hkv)·hd): one matmul for q, k and v
            qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
            qk = qk.view(B, T, self.num_heads + self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, H+Hkv, T, hd)
            qk = qk * cos + rotate_half(qk) * sin  # RoPE on queries and keys in one pass
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)  # (B, H, T, hd), (B, Hkv, T, hd)
            v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
            if cache is not None:
                k, v = cache.update(i, k, v)  # (B, Hkv, L, hd): everything this row has seen
            if mask is None and not (T == 1 and (cache is None or cache.uniform_step)):
                key_pos = torch.arange(k.shape[2], device=x.device)  # (L,)
                mask = (key_pos[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, T, L) causal
            # (one new token per row, all rows equally long: it may attend to every key — no mask at all)
            if self.use_sdpa:
                o = _sdpa(q, k, v, mask, group)  # (B, H, T, hd)
            else:
                full = torch.ones(B, 1, T, k.shape[2], dtype=torch.bool, device=x.device) if mask is None else mask
                o = attention_ref(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), full)
            x = x + F.linear(o.transpose(1, 2).reshape(B, T, -1), w.wo)  # (B, T, D)
            h = rms_norm(x, w.mlp_norm, self.eps)
            gate, up = F.linear(h, w.w_gate_up).split(self.ffn_size, dim=-1)  # (B, T, F) each
            x = x + F.linear(F.silu(gate) * up, w.w_down)  # SwiGLU
        if logits_at is not None:
            x = x.gather(1, logits_at[..., None].expand(-1, -1, x.shape[-1]))  # (B, K, D)
        x = rms_norm(x, self.final_norm, self.eps)
        return F.linear(x, self.lm_head)  # (B, T or K, V)

    __call__ = forward
