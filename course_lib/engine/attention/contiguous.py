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

from course_lib.engine.attention.base import AttentionBackend, AttentionMetadata, sdpa


def _positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class ContiguousBackend(AttentionBackend):
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
            _positive_int(name, value)
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

    # ------------------------------------------------------------ sizes
    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) · layers · kv_heads · head_dim · bytes per element."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

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
        if rows <= self._capacity:
            return
        new = min(self.max_seqs, max(rows, 2 * self._capacity))
        shape = (new, self.num_kv_heads, self.max_len, self.head_dim)
        # zeros, not empty: a masked slot still multiplies its (zero) weight by V, and 0 · NaN would be NaN
        k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        for old, fresh in zip(self.k + self.v, k + v):
            fresh[: self._capacity] = old
        self.k, self.v, self._capacity = k, v, new

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
            meta.kind = "single"
            T, s = query_lens[0], starts[0]
            if T > 1 and s == 0:
                meta.is_causal = True
            elif T > 1:  # a chunk after a cached prefix (or γ+1 tokens to verify): query t sees keys ≤ s + t
                meta.mask = torch.arange(L, device=dev)[None, :] <= s + torch.arange(T, device=dev)[:, None]
            return meta
        rows = torch.tensor(handles, device=dev)  # (B,)
        consecutive = handles == list(range(handles[0], handles[0] + B))
        meta.extra["first_row"] = handles[0] if consecutive else None
        meta.extra["rows"] = rows
        if all(q == 1 for q in query_lens):  # pure decode: the queries already form (B, H, 1, hd)
            meta.kind = "decode"
            uniform = min(ctx) == L
            meta.extra["write_pos"] = starts[0] if uniform else None
            if not uniform:
                meta.mask = (torch.arange(L, device=dev)[None, :] < torch.tensor(ctx, device=dev)[:, None])[
                    :, None, None
                ]
            return meta
        # mixed: decode tokens batched together, each multi-token sequence (a prefill or a chunk) on its own,
        # so no decode row is padded up to a 300-token prompt
        meta.kind = "mixed"
        ends = [sum(query_lens[: i + 1]) for i in range(B)]
        dec = [i for i in range(B) if query_lens[i] == 1]
        meta.extra["decode"] = None
        if dec:
            meta.extra["decode"] = self._decode_group(
                [handles[i] for i in dec], [ctx[i] for i in dec], torch.tensor([ends[i] - 1 for i in dec], device=dev)
            )
            meta.extra["decode"]["pos"] = positions[meta.extra["decode"]["index"]]  # (Nd,)
        meta.extra["chunks"] = [
            (
                handles[i],
                starts[i],
                ends[i] - query_lens[i],
                ends[i],
                self._chunk_mask(starts[i], query_lens[i], ctx[i]),
            )
            for i in range(B)
            if query_lens[i] > 1
        ]
        return meta

    def _decode_group(self, rows: list[int], ctx: list[int], token_index: torch.Tensor) -> dict:
        """Gather indices and mask for the one-token sequences of a mixed step."""
        dev, L = self.device, max(ctx)
        mask = None
        if min(ctx) != L:
            mask = (torch.arange(L, device=dev)[None, :] < torch.tensor(ctx, device=dev)[:, None])[:, None, None]
        return {"rows": torch.tensor(rows, device=dev), "index": token_index, "L": L, "mask": mask}

    def _chunk_mask(self, start: int, T: int, ctx: int) -> torch.Tensor | None:
        """(T, ctx) causal mask of T new tokens after ``start`` cached ones; None when SDPA's is_causal fits."""
        if start == 0:
            return None
        dev = self.device
        return torch.arange(ctx, device=dev)[None, :] <= start + torch.arange(T, device=dev)[:, None]

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        K, V = self.k[layer], self.v[layer]  # (rows, Hkv, max_len, hd)
        L = max(meta.context_lens)
        if meta.kind == "single":
            row, s, T = meta.handles[0], meta.start_lens[0], meta.query_lens[0]
            K[row, :, s : s + T] = k.transpose(0, 1)  # (Hkv, T, hd)
            V[row, :, s : s + T] = v.transpose(0, 1)
            o = sdpa(
                q.transpose(0, 1)[None],
                K[row : row + 1, :, :L],
                V[row : row + 1, :, :L],
                meta.mask,
                meta.is_causal,
                self.use_sdpa,
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
            keys, values = self._rows(K, V, first, rows, B, L)
            return sdpa(q[:, :, None], keys, values, meta.mask, False, self.use_sdpa)[:, :, 0]  # (B, H, hd)
        out = q.new_empty(q.shape)  # (N, H, hd)
        d = meta.extra["decode"]
        if d is not None:
            idx, drows = d["index"], d["rows"]
            K[drows, :, d["pos"]] = k[idx]  # (Nd, Hkv, hd)
            V[drows, :, d["pos"]] = v[idx]
            keys, values = K[:, :, : d["L"]].index_select(0, drows), V[:, :, : d["L"]].index_select(0, drows)
            out[idx] = sdpa(q[idx][:, :, None], keys, values, d["mask"], False, self.use_sdpa)[:, :, 0]
        for row, s, a, b, mask in meta.extra["chunks"]:
            T = b - a
            K[row, :, s : s + T] = k[a:b].transpose(0, 1)  # (Hkv, T, hd)
            V[row, :, s : s + T] = v[a:b].transpose(0, 1)
            o = sdpa(
                q[a:b].transpose(0, 1)[None],
                K[row : row + 1, :, : s + T],
                V[row : row + 1, :, : s + T],
                mask,
                mask is None,
                self.use_sdpa,
            )  # (1, H, T, hd)
            out[a:b] = o[0].transpose(0, 1)
        return out

    @staticmethod
    def _rows(K, V, first, rows, B, L):
        """Keys/values (B, Hkv, L, hd) of the step's rows: a view when they are consecutive, else a gather."""
        if first is not None:
            return K[first : first + B, :, :L], V[first : first + B, :, :L]
        return K[:, :, :L].index_select(0, rows), V[:, :, :L].index_select(0, rows)
