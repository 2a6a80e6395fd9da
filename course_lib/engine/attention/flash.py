"""FlashBackend: the contiguous KV cache, with attention computed by the Triton FlashAttention kernel.

Storage is ContiguousBackend's, unchanged (one slab of ``max_len`` slots per sequence); only the maths
differs: instead of SDPA over a padded view, ``flash_attention_fwd`` reads the cached K/V in tiles and
never materialises the (T, L) scores. Each kind of step takes one launch where it can: a single
sequence (prefill, chunk, decode, γ+1 verify tokens) with an end-aligned causal mask; a decode batch
(B, H, 1, d) over its rows at once, with per-row key counts when lengths differ; a mixed step as one
launch for its decode tokens plus one per multi-token chunk. On a CPU the kernel runs in the Triton
interpreter (slow; for correctness), or through its SDPA fallback with ``path='torch'``.
Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.engine.attention.base import AttentionMetadata
from course_lib.engine.attention.contiguous import ContiguousBackend
from course_lib.kernels.flash_attention import HEAD_DIMS, PATHS, flash_attention_fwd


class FlashBackend(ContiguousBackend):
    """ContiguousBackend's K/V slabs; attention by ``flash_attention_fwd`` (``path``: 'auto', 'triton', 'torch')."""

    name = "flash"

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        max_seqs: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        path: str = "auto",
    ) -> None:
        if head_dim not in HEAD_DIMS:
            raise ValueError(
                f"FlashBackend needs head_dim in {HEAD_DIMS} (the flash kernel's), got head_dim={head_dim}"
            )
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        super().__init__(num_layers, num_kv_heads, head_dim, max_len, max_seqs, dtype, device)
        self.path = path

    @classmethod
    def from_model(cls, model, max_len: int, max_seqs: int, path: str = "auto") -> FlashBackend:
        """Sized for a ``LlamaEngineModel`` (its layers, KV heads, head_dim, dtype and device)."""
        return cls(
            model.num_layers, model.num_kv_heads, model.head_dim, max_len, max_seqs, model.dtype, model.device, path
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

    def _flash(self, q, keys, values, kv_lens=None) -> torch.Tensor:
        return flash_attention_fwd(q, keys, values, True, kv_lens=kv_lens, path=self.path)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        K, V = self.k[layer], self.v[layer]  # (rows, Hkv, max_len, hd)
        L = max(meta.context_lens)
        if meta.kind == "single":  # prefill, chunk after a cached prefix, decode: one end-aligned causal launch
            row, s, T = meta.handles[0], meta.start_lens[0], meta.query_lens[0]
            K[row, :, s : s + T] = k.transpose(0, 1)  # (Hkv, T, hd)
            V[row, :, s : s + T] = v.transpose(0, 1)
            o = self._flash(q.transpose(0, 1)[None], K[row : row + 1, :, :L], V[row : row + 1, :, :L])  # (1, H, T, hd)
            return o[0].transpose(0, 1)  # (T, H, hd)
        first, rows = meta.extra["first_row"], meta.extra["rows"]
        B = meta.num_seqs
        if meta.kind == "decode":
            p = meta.extra["write_pos"]
            if first is not None and p is not None:  # a static batch: rows first..first+B, all at position p
                K[first : first + B, :, p] = k  # (B, Hkv, hd)
                V[first : first + B, :, p] = v
            else:
                K[rows, :, meta.positions] = k
                V[rows, :, meta.positions] = v
            keys, values = self._rows(K, V, first, rows, B, L)  # (B, Hkv, L, hd)
            return self._flash(q[:, :, None], keys, values, meta.extra.get("kv_lens"))[:, :, 0]  # (B, H, hd)
        out = q.new_empty(q.shape)  # (N, H, hd)
        d = meta.extra["decode"]
        if d is not None:
            idx, drows = d["index"], d["rows"]
            K[drows, :, d["pos"]] = k[idx]  # (Nd, Hkv, hd)
            V[drows, :, d["pos"]] = v[idx]
            keys, values = K[:, :, : d["L"]].index_select(0, drows), V[:, :, : d["L"]].index_select(0, drows)
            out[idx] = self._flash(q[idx][:, :, None], keys, values, d.get("kv_lens"))[:, :, 0]
        for row, s, a, b, _mask in meta.extra["chunks"]:
            T = b - a
            K[row, :, s : s + T] = k[a:b].transpose(0, 1)  # (Hkv, T, hd)
            V[row, :, s : s + T] = v[a:b].transpose(0, 1)
            o = self._flash(q[a:b].transpose(0, 1)[None], K[row : row + 1, :, : s + T], V[row : row + 1, :, : s + T])
            out[a:b] = o[0].transpose(0, 1)  # (T, H, hd)
        return out


__all__ = ["FlashBackend"]
