"""A Llama-family forward pass written to be read: embed → N × (attention + SwiGLU MLP) → head.

It borrows the weight tensors of a loaded ``transformers`` model (Llama, Mistral, Qwen2 shapes; no
copy) and runs them through our own code over a *flat ragged batch*: ``input_ids (N,)`` and
``positions (N,)`` hold every new token of every scheduled sequence back to back (a 300-token prefill
chunk next to seven decode tokens, no padding), and the attention backend's metadata says which
sequence each belongs to. Three seams keep the chapters out of this file:
- every projection is a ``layers.Linear`` (chapter 03 quantizes it, chapter 07 splits it);
- attention and KV storage are the backend's (chapter 05 pages them, adds Triton kernels);
- ``embed`` / ``run_layers`` / ``head`` are separate, so a pipeline stage runs a slice of layers (chapter 07).
Per decode step every weight is read once for one token per sequence: ~2 FLOPs per weight read, far
below any machine's ridge point, so decode is memory-bandwidth-bound. Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from course_lib.engine.layers import Linear
from course_lib.kernels import cpu_gemv

ROPE_TABLE_MAX = 16_384
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass
class DecoderLayer:
    """One decoder layer: two norms and four linear layers (q/k/v and gate/up fused: one matmul reads them all)."""

    attn_norm: torch.Tensor  # (D,)
    qkv: Linear  # D → (H + 2·Hkv)·hd
    o: Linear  # H·hd → D
    mlp_norm: torch.Tensor  # (D,)
    gate_up: Linear  # D → 2F
    down: Linear  # F → D


LINEAR_NAMES = ("qkv", "o", "gate_up", "down")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) · weight, computed in fp32 like the reference implementation. A decode step's few fp32
    rows on a CPU go to ``kernels.cpu_gemv.rms_norm`` (the same maths in one C loop: torch's fused op costs
    20-30 µs a call on a 2-core VM, 60 calls a SmolLM2 step), when nothing needs a gradient."""
    if (
        x.dim() == 2
        and x.shape[0] <= cpu_gemv.MAX_ROWS
        and x.dtype == weight.dtype == torch.float32
        and x.device.type == "cpu"
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and x.is_contiguous()
        and weight.is_contiguous()
        and cpu_gemv.available()
        and not torch.compiler.is_compiling()
    ):
        return cpu_gemv.run_rms_norm(x, weight, eps)
    if x.dtype == torch.float32 and hasattr(F, "rms_norm"):
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused op, the same maths
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) → (−x2, x1) on the last dim: RoPE rotates each pair (x1[i], x2[i]) by its angle."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x · cos + rotate_half(x) · sin in three ops: ``roll`` swaps the halves and the sign of the first
    half lives in ``signed_sin`` = (−sin, sin). The same maths as the textbook form, to fp rounding."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def check_supported(config) -> None:
    """Raise a clear error for a checkpoint this forward does not implement."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {kind!r} is not supported by the course engine; supported: "
            f"{list(SUPPORTED_MODEL_TYPES)} (Llama-family decoders with RoPE, RMSNorm and SwiGLU)"
        )
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported: the engine's MLP is SwiGLU (silu)")


class LlamaEngineModel:
    """``forward(input_ids (N,), positions (N,), meta, backend)`` → hidden (N, D); ``head`` → logits."""

    def __init__(self, hf_model) -> None:
        cfg = hf_model.config
        check_supported(cfg)
        base = hf_model.model
        self.config = cfg
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.eps = cfg.rms_norm_eps
        self.vocab_size = cfg.vocab_size
        self.max_position = cfg.max_position_embeddings
        self.embed_weight = base.embed_tokens.weight  # (V, D)
        self.final_norm = base.norm.weight  # (D,)
        self.lm_head = Linear(hf_model.lm_head.weight)  # (V, D); the same tensor as the embedding when tied
        # RoPE frequencies from the HF module itself, so every rope_type (llama3, yarn, ...) is right
        self.inv_freq = base.rotary_emb.inv_freq.float()  # (hd/2,)
        self.rope_scale = float(base.rotary_emb.attention_scaling)
        self.dtype = self.embed_weight.dtype
        self.device = self.embed_weight.device
        # cos/sin for every position, computed once: a step only indexes the table
        # (capped: a 128k-context model would need hundreds of MB; past the cap we compute on the fly)
        all_pos = torch.arange(min(self.max_position, ROPE_TABLE_MAX), device=self.device)
        self._cos, self._sin = self._rope_compute(all_pos)  # (P, hd) each
        self.layers: list[DecoderLayer] = []
        with torch.no_grad():
            for layer in base.layers:
                a, m = layer.self_attn, layer.mlp
                self.layers.append(
                    DecoderLayer(
                        layer.input_layernorm.weight,
                        Linear.fuse(a.q_proj, a.k_proj, a.v_proj),
                        Linear.fuse(a.o_proj),
                        layer.post_attention_layernorm.weight,
                        Linear.fuse(m.gate_proj, m.up_proj),
                        Linear.fuse(m.down_proj),
                    )
                )
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.ffn_size = base.layers[0].mlp.down_proj.weight.shape[1]

    # ------------------------------------------------------------ the linear seam
    def linears(self) -> Iterator[tuple[str, Linear]]:
        """Every projection in forward order, named ``layers.{i}.{qkv|o|gate_up|down}``, then ``lm_head``."""
        for i, layer in enumerate(self.layers):
            for name in LINEAR_NAMES:
                yield f"layers.{i}.{name}", getattr(layer, name)
        yield "lm_head", self.lm_head

    def set_linear(self, name: str, new) -> None:
        """Replace one projection (e.g. by a quantized or tensor-parallel layer with the same ``forward``)."""
        old = dict(self.linears()).get(name)
        if old is None:
            raise ValueError(f"no linear layer named {name!r}; names look like 'layers.0.qkv' or 'lm_head'")
        if not callable(getattr(new, "forward", None)):
            raise ValueError(f"the replacement for {name!r} must have a forward(x) method, got {type(new).__name__}")
        if name == "lm_head":
            self.lm_head = new
        else:
            _, i, attr = name.split(".")
            setattr(self.layers[int(i)], attr, new)

    # ------------------------------------------------------------ RoPE
    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (N, hd) for absolute ``positions`` (N,), looked up in the table."""
        if self.max_position > self._cos.shape[0]:
            return self._rope_compute(positions)
        return self._cos[positions], self._sin[positions]

    def _signed(self, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    def _rope_compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE angles: position · inv_freq, as cos/sin (N, hd) — what the table stores."""
        freqs = positions[:, None].float() * self.inv_freq  # (N, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (N, hd)
        return (emb.cos() * self.rope_scale).to(self.dtype), (emb.sin() * self.rope_scale).to(self.dtype)

    # ------------------------------------------------------------ forward, in three parts
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(N,) ids → (N, D): reads only N rows of the embedding table."""
        return F.embedding(input_ids, self.embed_weight)

    def run_layers(
        self, x: torch.Tensor, positions: torch.Tensor, meta, backend, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        """Decoder layers ``start..stop`` over the flat batch x (N, D); a pipeline stage runs a slice."""
        N = x.shape[0]
        H, Hkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        cos, sin = self.rope(positions)
        cos, sin = cos[:, None], self._signed(sin)[:, None]  # (N, 1, hd): broadcast over heads
        for i in range(start, self.num_layers if stop is None else stop):
            w = self.layers[i]
            h = rms_norm(x, w.attn_norm, self.eps)
            qkv = w.qkv(h)  # (N, (H + 2·Hkv)·hd): one matmul for q, k and v
            qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
            qk = qk.view(N, H + Hkv, hd)
            qk = apply_rope(qk, cos, sin)  # RoPE on queries and keys in one pass: qk·cos + rotate_half(qk)·sin
            q, k = qk.split([H, Hkv], dim=1)  # (N, H, hd), (N, Hkv, hd)
            o = backend.forward(i, q, k, v.view(N, Hkv, hd), meta)  # (N, H, hd): stores k/v, attends
            x = x + w.o(o.reshape(N, H * hd))  # (N, D)
            h = rms_norm(x, w.mlp_norm, self.eps)
            gate, up = w.gate_up(h).split(self.ffn_size, dim=-1)  # (N, F) each
            x = x + w.down(F.silu(gate) * up)  # SwiGLU
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (M, D) → logits (M, V): final norm + LM head (read whole, tied or not)."""
        return self.lm_head(rms_norm(x, self.final_norm, self.eps))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta,
        backend,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Flat ids and positions (N,) → logits (N, V), or (M, V) only at the flat ``logits_indices`` (M,)."""
        x = self.run_layers(self.embed(input_ids), positions, meta, backend)
        if logits_indices is not None and logits_indices.numel() == 0:  # a prefill chunk that samples nothing
            return x.new_empty(0, self.vocab_size)
        if logits_indices is not None:
            x = x[logits_indices]  # (M, D): a prefill needs only its last token's logits
        return self.head(x)

    __call__ = forward

    def dense_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids, each row a whole sequence from position 0 → (B, T, V) logits, no cache: the
        reference for tests and for HF comparisons."""
        from course_lib.engine.attention import NoCacheBackend

        B, T = input_ids.shape
        backend = NoCacheBackend(max(T, 1))
        positions = torch.arange(T, device=input_ids.device).repeat(B)  # (B·T,)
        meta = backend.prepare([backend.allocate() for _ in range(B)], [T] * B, positions)
        return self.forward(input_ids.reshape(-1), positions, meta, backend).view(B, T, -1)
