"""The contiguous KV cache: each sequence owns one slab of ``max_len`` slots, reserved when it starts.

Decode reads the whole cache of every sequence once per step (bandwidth-bound, like the weights). Its
size, 2 · layers · kv_heads · head_dim · bytes per token, is what limits batch size and context. A slab
is reserved for the longest possible sequence, so most of it sits empty: ``bytes_reserved`` vs
``bytes_used`` is the waste that PagedAttention removes in chapter 05. Attention is torch's SDPA over
a padded view of the step. Introduced in 02_metrics_1_latency.ipynb; the subject of 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import heapq

import torch

from course_lib.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    StoredKV,
    key_mask,
    mark_single,
    sdpa,
    split_mixed,
)
from course_lib.measure.costs import check_positive_int


class ContiguousBackend(StoredKV, AttentionBackend):
    """Per layer, K and V of shape (rows, kv_heads, max_len, head_dim); a sequence's handle is its row."""

    name = "contiguous"

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        max_seqs: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        use_sdpa: bool = True,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("max_len", max_len),
            ("max_seqs", max_seqs),
        ):
            check_positive_int(name, value)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.max_len, self.max_seqs = max_len, max_seqs
        self.dtype, self.device = dtype, torch.device(device)
        self.use_sdpa = use_sdpa  # False: the spelled-out attention_ref
        self.k: list[torch.Tensor] = []  # per layer (capacity, Hkv, max_len, hd); grown on demand
        self.v: list[torch.Tensor] = []
        self._capacity = 0
        self._free: list[int] = []  # a heap: the lowest free row first, so a batch gets consecutive rows
        self._next_row = 0
        self._len: dict[int, int] = {}  # live row → tokens stored

    # ------------------------------------------------------------ sizes (bytes_per_token: StoredKV)
    def bytes_used(self) -> int:
        return sum(self._len.values()) * self.bytes_per_token

    def bytes_reserved(self) -> int:
        return len(self._len) * self.max_len * self.bytes_per_token

    def bytes_allocated(self) -> int:
        """Bytes of the tensors themselves (rows are allocated as needed and kept for reuse)."""
        return self._capacity * self.max_len * self.bytes_per_token

    # ------------------------------------------------------------ storage
    def max_tokens_per_seq(self) -> int:
        return self.max_len

    def num_free_rows(self) -> int:
        return len(self._free) + (self.max_seqs - self._next_row)

    def can_allocate(self, num_tokens: int) -> bool:
        return num_tokens <= self.max_len and self.num_free_rows() > 0

    def allocate(self) -> int:
        if self._free:
            row = heapq.heappop(self._free)
        elif self._next_row < self.max_seqs:
            row, self._next_row = self._next_row, self._next_row + 1
        else:
            raise RuntimeError(f"KV cache full: all {self.max_seqs} rows are in use")
        self._ensure_capacity(row + 1)
        self._len[row] = 0
        return row

    def _ensure_capacity(self, rows: int) -> None:
        self._grow(rows, self.max_seqs, (self.num_kv_heads, self.max_len, self.head_dim))

    def _check(self, handle) -> int:
        if handle not in self._len:
            raise ValueError(f"KV handle {handle!r} is not a live sequence of this cache")
        return handle

    def length(self, handle) -> int:
        return self._len[self._check(handle)]

    def can_append(self, handle, num_tokens: int) -> bool:
        return self._len[self._check(handle)] + num_tokens <= self.max_len

    def append(self, handle, num_tokens: int) -> None:
        row = self._check(handle)
        if self._len[row] + num_tokens > self.max_len:
            raise ValueError(
                f"KV cache row {row} is full: {self._len[row]} + {num_tokens} tokens > max_len {self.max_len}"
            )
        self._len[row] += num_tokens

    def truncate(self, handle, length: int) -> None:
        row = self._check(handle)
        if not 0 <= length <= self._len[row]:
            raise ValueError(f"truncate length must be between 0 and {self._len[row]}, got {length}")
        self._len[row] = length

    def fork(self, handle) -> int:
        src = self._check(handle)
        dst = self.allocate()
        n = self._len[src]
        for t in self.k + self.v:
            t[dst, :, :n] = t[src, :, :n]
        self._len[dst] = n
        return dst

    def free(self, handle) -> None:
        row = self._check(handle)
        del self._len[row]
        heapq.heappush(self._free, row)

    # ------------------------------------------------------------ compute
    def prepare(self, handles: list[int], query_lens: list[int], positions: torch.Tensor) -> AttentionMetadata:
        ctx = [self._len[self._check(h)] for h in handles]
        meta = AttentionMetadata(list(query_lens), ctx, list(handles), positions)
        dev = self.device
        B, L = len(handles), max(ctx)
        starts = meta.start_lens
        if B == 1:  # one sequence: plain slices, no padding
            return mark_single(meta, dev)
        rows = torch.tensor(handles, device=dev)  # (B,)
        consecutive = handles == list(range(handles[0], handles[0] + B))
        meta.extra["first_row"] = handles[0] if consecutive else None
        meta.extra["rows"] = rows
        if all(q == 1 for q in query_lens):  # pure decode: the queries already form (B, H, 1, hd)
            meta.kind = "decode"
            uniform = min(ctx) == L
            meta.extra["write_pos"] = starts[0] if uniform else None
            meta.mask = key_mask(ctx, dev)
            return meta
        meta.kind = "mixed"  # decode tokens batched together, each multi-token sequence on its own
        dec, dec_rows, chunks = split_mixed(list(query_lens), starts, dev)
        meta.extra["decode"] = None
        if dec:
            index = torch.tensor(dec_rows, device=dev)  # (Nd,) their rows in the flat batch
            meta.extra["decode"] = {
                "rows": torch.tensor([handles[i] for i in dec], device=dev),
                "index": index,
                "L": max(ctx[i] for i in dec),
                "mask": key_mask([ctx[i] for i in dec], dev),
                "pos": positions[index],  # (Nd,)
            }
        meta.extra["chunks"] = [(handles[i], s, a, b, mask) for i, s, a, b, mask in chunks]
        return meta

    def _attend(self, q, keys, values, mask, is_causal: bool, kv_lens=None) -> torch.Tensor:
        """Attention of q (B, H, T, hd) over keys/values (B, Hkv, L, hd): SDPA (or ``attention_ref``) with
        ``mask``; ``kv_lens`` (per-row key counts) is for kernels that take lengths instead of a mask."""
        return sdpa(q, keys, values, mask, is_causal, self.use_sdpa)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        K, V = self.k[layer], self.v[layer]  # (rows, Hkv, max_len, hd)
        L = max(meta.context_lens)
        if meta.kind == "single":
            row, s, T = meta.handles[0], meta.start_lens[0], meta.query_lens[0]
            K[row, :, s : s + T] = k.transpose(0, 1)  # (Hkv, T, hd)
            V[row, :, s : s + T] = v.transpose(0, 1)
            o = self._attend(
                q.transpose(0, 1)[None], K[row : row + 1, :, :L], V[row : row + 1, :, :L], meta.mask, meta.is_causal
            )  # (1, H, T, hd)
            return o[0].transpose(0, 1)  # (T, H, hd)
        first, rows = meta.extra["first_row"], meta.extra["rows"]
        B = meta.num_seqs
        if meta.kind == "decode":
            p = meta.extra["write_pos"]
            if first is not None and p is not None:  # a static batch: rows first..first+B, all at position p
                K[first : first + B, :, p] = k  # (B, Hkv, hd)
                V[first : first + B, :, p] = v
            else:
                K[rows, :, meta.positions] = k  # advanced indices (B,), (B,) around a slice → (B, Hkv, hd)
                V[rows, :, meta.positions] = v
            keys, values = self._rows(K, V, first, rows, B, L)  # (B, Hkv, L, hd)
            return self._attend(q[:, :, None], keys, values, meta.mask, False, meta.extra.get("kv_lens"))[:, :, 0]
        out = q.new_empty(q.shape)  # (N, H, hd)
        d = meta.extra["decode"]
        if d is not None:
            idx, drows = d["index"], d["rows"]
            K[drows, :, d["pos"]] = k[idx]  # (Nd, Hkv, hd)
            V[drows, :, d["pos"]] = v[idx]
            keys, values = K[:, :, : d["L"]].index_select(0, drows), V[:, :, : d["L"]].index_select(0, drows)
            out[idx] = self._attend(q[idx][:, :, None], keys, values, d["mask"], False, d.get("kv_lens"))[:, :, 0]
        for row, s, a, b, mask in meta.extra["chunks"]:
            T = b - a
            K[row, :, s : s + T] = k[a:b].transpose(0, 1)  # (Hkv, T, hd)
            V[row, :, s : s + T] = v[a:b].transpose(0, 1)
            o = self._attend(
                q[a:b].transpose(0, 1)[None],
                K[row : row + 1, :, : s + T],
                V[row : row + 1, :, : s + T],
                mask,
                mask is None,
            )  # (1, H, T, hd)
            out[a:b] = o[0].transpose(0, 1)
        return out

    @staticmethod
    def _rows(K, V, first, rows, B, L):
        """Keys/values (B, Hkv, L, hd) of the step's rows: a view when they are consecutive, else a gather."""
        if first is not None:
            return K[first : first + B, :, :L], V[first : first + B, :, :L]
        return K[:, :, :L].index_select(0, rows), V[:, :, :L].index_select(0, rows)
