"""FlashBackend: the contiguous KV cache, with attention computed by the Triton FlashAttention kernel.

Storage and the step's layout are ContiguousBackend's, unchanged (one slab of ``max_len`` slots per
sequence; ``forward`` is inherited); only the maths differs (``_attend``): instead of SDPA over a padded
view, ``flash_attention_fwd`` reads the cached K/V in tiles and never materialises the (T, L) scores. Each
kind of step takes one launch where it can: a single sequence (prefill, chunk, decode, γ+1 verify tokens)
with an end-aligned causal mask; a decode batch (B, H, 1, d) over its rows at once, with per-row key
counts when lengths differ; a mixed step as one launch for its decode tokens plus one per multi-token
chunk. On a CPU the kernel runs in the Triton interpreter (slow; for correctness), or through its SDPA
fallback with ``path='torch'``. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.engine.attention.base import AttentionMetadata
from course_lib.engine.attention.contiguous import ContiguousBackend
from course_lib.kernels.flash_attention import HEAD_DIMS, flash_attention_fwd
from course_lib.kernels.launch import PATHS


class FlashBackend(ContiguousBackend):
    """ContiguousBackend's K/V slabs; attention by ``flash_attention_fwd`` (``path``: 'auto', 'triton', 'torch')."""

    name = "flash"

    def __init__(self, *args, path: str = "auto", **kwargs) -> None:
        """ContiguousBackend's arguments (layers, KV heads, head_dim, max_len, max_seqs, dtype, device), with
        a head_dim the kernel supports, and the kernel's ``path``."""
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        super().__init__(*args, **kwargs)
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(
                f"FlashBackend needs head_dim in {HEAD_DIMS} (the flash kernel's), got head_dim={self.head_dim}"
            )
        self.path = path

    @classmethod
    def from_model(cls, model, max_len: int, max_seqs: int, path: str = "auto") -> FlashBackend:
        """Sized for a ``LlamaEngineModel`` (its layers, KV heads, head_dim, dtype and device)."""
        return cls(
            model.num_layers,
            model.num_kv_heads,
            model.head_dim,
            max_len,
            max_seqs,
            model.dtype,
            model.device,
            path=path,
        )

    def prepare(self, handles: list[int], query_lens: list[int], positions: torch.Tensor) -> AttentionMetadata:
        """ContiguousBackend's metadata, plus the per-row key counts a ragged decode batch needs (built once)."""
        meta = super().prepare(handles, query_lens, positions)
        ctx = meta.context_lens
        if meta.kind == "decode" and min(ctx) != max(ctx):
            meta.extra["kv_lens"] = torch.tensor(ctx, device=self.device)  # (B,)
        elif meta.kind == "mixed" and meta.extra["decode"] is not None:
            lens = [c for c, q in zip(ctx, query_lens) if q == 1]
            meta.extra["decode"]["kv_lens"] = torch.tensor(lens, device=self.device) if min(lens) != max(lens) else None
        return meta

    def _attend(self, q, keys, values, mask, is_causal: bool, kv_lens=None) -> torch.Tensor:
        """``flash_attention_fwd`` instead of SDPA: one end-aligned causal launch (a decode row sees all its
        keys; a chunk's query t sees keys ≤ its position), per-row key counts for a ragged decode batch.
        ``mask`` and ``is_causal`` are the SDPA path's; the kernel derives the same from the shapes."""
        return flash_attention_fwd(q, keys, values, True, kv_lens=kv_lens, path=self.path)


__all__ = ["FlashBackend"]
