"""PagedAttention: the KV cache as blocks of a shared pool, found through per-sequence block tables.

The contiguous cache reserves ``max_len`` slots per sequence when it starts; most stay empty (a request
rarely knows how long it will run). Here a sequence takes a block of ``block_size`` slots only when it
grows into it, so ``bytes_reserved`` exceeds ``bytes_used`` by at most one partly filled block per
sequence, and ``fork`` shares blocks by reference count instead of copying (parallel sampling, beam
search; the first write into a shared, partly filled block copies it). Kwon et al., "Efficient Memory
Management for Large Language Model Serving with PagedAttention" (vLLM, SOSP 2023).

Layout, per layer: K and V pools of shape ``(num_blocks, block_size, kv_heads, head_dim)`` (vLLM v1's
and FlashAttention's paged layout): a token's K is one contiguous ``(kv_heads, head_dim)`` row at flat
slot ``block · block_size + offset``, so writing a step's new K/V is one indexed copy of (N, Hkv, hd).

Attention, like the contiguous backend's kinds ("single", "decode", "mixed"): the torch path gathers
each sequence's blocks into a padded contiguous copy (B, Hkv, L, hd) and calls the same SDPA with the
same masks. That copy is the price of paging without a kernel: decode is bandwidth-bound, and the gather
writes and re-reads every cached byte once more. The Triton paged-decode kernel
(``course_lib.kernels.paged_decode``) reads the blocks in place instead. What paging saves on a request
mix (fragmentation, fork sharing) is counted in chapter 05's ``course_lib.kv.paged_memory``. Introduced in
05_attention_kv_cache.ipynb.

Chapter 06 adds two things the scheduler uses. Prefix caching (``prefix_caching=True``; vLLM's automatic
prefix caching): ``allocate_prefix(token_ids)`` starts a sequence on the cached full blocks its tokens
match, and ``cache_prefix`` names a sequence's computed full blocks (the names live in ``BlockManager``).
Swapping: ``swap_out(handle)`` copies a sequence's blocks to host memory and frees them, ``swap_in(host)``
copies them back into fresh blocks; both are bandwidth-bound copies over PCIe on a GPU (on a CPU, one
more copy in the same memory), counted in ``swapped_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    StoredKV,
    key_mask,
    mark_single,
    ragged_index,
    sdpa,
    split_mixed,
)
from course_lib.engine.attention.block_manager import BlockManager, OutOfBlocks, cdiv
from course_lib.measure.costs import check_positive_int

DECODE_PATHS = ("auto", "gather", "kernel")


@dataclass
class SwappedKV:
    """A swapped-out sequence: its blocks' K/V on the host, per layer (num_blocks, bs, Hkv, hd)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    length: int  # tokens stored
    num_bytes: int  # bytes copied out (whole blocks, K and V, every layer); the same again to copy back


class PagedBackend(StoredKV, AttentionBackend):
    """K/V pools (num_blocks, block_size, Hkv, hd) per layer; a sequence's handle is its id in ``self.blocks``.

    ``decode``: how one-token rows attend — "gather" (torch: gather the blocks, then SDPA), "kernel"
    (``paged_decode``: Triton on CUDA or under the interpreter, else its torch reference) or "auto"
    (the kernel on CUDA when Triton is installed and the head size is supported, else "gather").
    ``prefix_caching``: reuse cached full blocks of a matching prompt prefix (``allocate_prefix``)."""

    name = "paged"

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int = 16,
        max_len: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        use_sdpa: bool = True,
        decode: str = "auto",
        prefix_caching: bool = False,
    ) -> None:
        if not isinstance(prefix_caching, bool):
            raise ValueError(f"prefix_caching must be a bool, got {prefix_caching!r}")
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            check_positive_int(name, value)
        if max_len is not None:
            check_positive_int("max_len", max_len)
        if decode not in DECODE_PATHS:
            raise ValueError(f"decode must be one of {DECODE_PATHS}, got {decode!r}")
        self.blocks = BlockManager(num_blocks, block_size)  # checks num_blocks and block_size
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.block_size, self.num_blocks = block_size, num_blocks
        self.max_len = min(max_len or num_blocks * block_size, num_blocks * block_size)
        self.dtype, self.device = dtype, torch.device(device)
        self.use_sdpa = use_sdpa
        self.decode = self._resolve_decode(decode)
        self.prefix_caching = prefix_caching
        self.swapped_out_bytes = 0  # device → host, over all sequences
        self.swapped_in_bytes = 0  # host → device
        self.k: list[torch.Tensor] = []  # per layer (capacity, bs, Hkv, hd); grown on demand up to num_blocks
        self.v: list[torch.Tensor] = []
        self._capacity = 0

    @classmethod
    def for_model(cls, model, config, block_size: int = 16, **kwargs) -> PagedBackend:
        """A backend sized like the engine's default cache: ``config.max_kv_tokens`` (or max_num_seqs ×
        max_model_len) token slots in blocks. ``model``: a ``LlamaEngineModel``; ``config``: a
        ``SchedulerConfig`` with ``max_model_len`` set (``engine.config``)."""
        max_len = config.max_model_len or model.max_position
        tokens = config.max_kv_tokens or config.max_num_seqs * max_len
        return cls(
            model.num_layers,
            model.num_kv_heads,
            model.head_dim,
            cdiv(tokens, block_size),
            block_size,
            max_len,
            model.dtype,
            model.device,
            **kwargs,
        )

    def _resolve_decode(self, decode: str) -> str:
        from course_lib.kernels import HAS_TRITON
        from course_lib.kernels.paged_decode import HEAD_DIMS, MAX_BLOCK_SIZE

        fits = self.head_dim in HEAD_DIMS and self.block_size <= MAX_BLOCK_SIZE
        if decode == "kernel" and not fits:
            raise ValueError(
                f"decode='kernel' needs head_dim in {HEAD_DIMS} and block_size <= {MAX_BLOCK_SIZE}, "
                f"got head_dim={self.head_dim}, block_size={self.block_size}"
            )
        if decode == "auto":
            return "kernel" if fits and HAS_TRITON and self.device.type == "cuda" else "gather"
        return decode

    # ------------------------------------------------------------ sizes (bytes_per_token: StoredKV)
    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.bytes_per_token

    def bytes_used(self) -> int:
        """Slots holding tokens of live sequences; a slot shared by forked sequences counts once."""
        return self.blocks.stats().tokens * self.bytes_per_token

    def bytes_reserved(self) -> int:
        """Blocks held × block bytes: used + at most one partly filled block per sequence."""
        return self.blocks.num_used * self.bytes_per_block

    def bytes_unshared(self) -> int:
        """What the live sequences would reserve if ``fork`` copied instead of sharing."""
        return self.blocks.stats().logical * self.bytes_per_block

    def bytes_allocated(self) -> int:
        """Bytes of the pool tensors themselves (grown as blocks are first used, kept for reuse)."""
        return self._capacity * self.bytes_per_block

    # ------------------------------------------------------------ storage
    def max_tokens_per_seq(self) -> int:
        return self.max_len

    def can_allocate(self, num_tokens: int) -> bool:
        return num_tokens <= self.max_len and self.blocks.can_allocate(num_tokens)

    def allocate(self) -> int:
        return self.blocks.new_seq()

    def _check(self, handle) -> int:
        if handle not in self.blocks.tables:
            raise ValueError(f"KV handle {handle!r} is not a live sequence of this cache")
        return handle

    def length(self, handle) -> int:
        return self.blocks.lengths[self._check(handle)]

    def can_append(self, handle, num_tokens: int) -> bool:
        n = self.length(handle)
        return n + num_tokens <= self.max_len and self.blocks.can_append(handle, num_tokens)

    def append(self, handle, num_tokens: int) -> None:
        """Room for ``num_tokens`` more tokens; copies a shared last block first (copy-on-write). Raises
        ``OutOfBlocks`` (nothing changed) when the pool is short: preempt a sequence and retry."""
        n = self.length(handle)
        if n + num_tokens > self.max_len:
            raise ValueError(f"KV sequence {handle} is full: {n} + {num_tokens} tokens > max_len {self.max_len}")
        copies = self.blocks.append(handle, num_tokens)
        table = self.blocks.tables[handle]
        if table:
            self._ensure_capacity(max(table) + 1)
        for src, dst in copies:
            for t in self.k + self.v:
                t[dst] = t[src]  # (bs, Hkv, hd): the whole block; slots past the fill get overwritten

    def _ensure_capacity(self, blocks: int) -> None:
        self._grow(blocks, self.num_blocks, (self.block_size, self.num_kv_heads, self.head_dim))

    def truncate(self, handle, length: int) -> None:
        self.blocks.truncate(self._check(handle), length)

    def fork(self, handle) -> int:
        """A new sequence sharing every block of ``handle``: no K/V is copied until one of them writes."""
        return self.blocks.fork(self._check(handle))

    def free(self, handle) -> None:
        self.blocks.free_seq(self._check(handle))

    # ------------------------------------------------------------ prefix caching
    @property
    def prefix_hits(self) -> int:
        """Prompt tokens found in the cache by ``allocate_prefix`` (their K/V were not computed again)."""
        return self.blocks.prefix_hits

    @property
    def prefix_queries(self) -> int:
        """Tokens looked up by ``allocate_prefix``."""
        return self.blocks.prefix_queries

    def match_prefix(self, token_ids: list[int]) -> int:
        """Tokens of ``token_ids`` a new sequence would find cached now (0 without prefix caching)."""
        return len(self.blocks.match_prefix(token_ids)) * self.block_size if self.prefix_caching else 0

    def can_allocate_prefix(self, token_ids: list[int], num_tokens: int) -> bool:
        """Could a new sequence start on the cached prefix of ``token_ids`` and store ``num_tokens`` more?"""
        if not self.prefix_caching:
            return self.can_allocate(num_tokens)
        cached = self.match_prefix(token_ids)
        return cached + num_tokens <= self.max_len and self.blocks.blocks_to_start(token_ids, num_tokens) <= (
            self.blocks.num_free
        )

    def allocate_prefix(self, token_ids: list[int]) -> tuple[int, int]:
        """A new sequence holding the cached blocks of the longest matching prefix of ``token_ids`` (always
        leaving its last token to compute). Returns (handle, tokens already cached)."""
        if not self.prefix_caching:
            return self.allocate(), 0
        return self.blocks.new_seq_with_prefix(token_ids)

    def cache_prefix(self, handle, token_ids: list[int], num_computed: int) -> None:
        """Name the full blocks of the first ``num_computed`` tokens (K/V written) so others can reuse them."""
        if self.prefix_caching:
            self.blocks.cache_blocks(self._check(handle), token_ids, num_computed)

    # ------------------------------------------------------------ swapping
    def swap_out(self, handle) -> SwappedKV:
        """Copy the sequence's blocks to host memory and free them on the device; returns the host copy."""
        table = self.blocks.tables[self._check(handle)]
        idx = torch.tensor(table, dtype=torch.long, device=self.device)  # (nb,)
        host = torch.device("cpu")
        k = [t.index_select(0, idx).to(host) for t in self.k] if table else []  # per layer (nb, bs, Hkv, hd)
        v = [t.index_select(0, idx).to(host) for t in self.v] if table else []
        out = SwappedKV(k, v, self.length(handle), len(table) * self.bytes_per_block)
        self.free(handle)
        self.swapped_out_bytes += out.num_bytes
        return out

    def can_swap_in(self, host: SwappedKV, num_tokens: int = 0) -> bool:
        """Is there room to swap ``host`` back in and then store ``num_tokens`` more tokens?"""
        return self.can_allocate(host.length + num_tokens)

    def swap_in(self, host: SwappedKV) -> int:
        """Copy a swapped-out sequence back into fresh device blocks; returns its new handle. Raises
        ``OutOfBlocks`` (nothing changed) when the pool is short."""
        if not isinstance(host, SwappedKV):
            raise ValueError(f"swap_in takes what swap_out returned (a SwappedKV), got {type(host).__name__}")
        handle = self.blocks.new_seq()
        try:
            self.blocks.append(handle, host.length)
        except OutOfBlocks:
            self.blocks.free_seq(handle)
            raise
        table = self.blocks.tables[handle]
        if table:
            self._ensure_capacity(max(table) + 1)
            idx = torch.tensor(table, dtype=torch.long, device=self.device)  # (nb,)
            for t, saved in zip(self.k + self.v, host.k + host.v):
                t.index_copy_(0, idx, saved.to(self.device))  # (nb, bs, Hkv, hd)
        self.swapped_in_bytes += host.num_bytes
        return handle

    # ------------------------------------------------------------ compute
    def _tables(self, handles: list[int], num_blocks: int) -> torch.Tensor:
        """(B, num_blocks) int64 block tables, padded with block 0 (its slots are masked out)."""
        rows = [t + [0] * (num_blocks - len(t)) for t in (self.blocks.tables[h] for h in handles)]
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def prepare(self, handles: list[int], query_lens: list[int], positions: torch.Tensor) -> AttentionMetadata:
        ctx = [self.length(h) for h in handles]
        meta = AttentionMetadata(list(query_lens), ctx, list(handles), positions)
        dev, bs = self.device, self.block_size
        B, L = len(handles), max(ctx)
        starts = meta.start_lens
        tables = self._tables(handles, cdiv(L, bs))  # (B, nb)
        seq, offset = ragged_index(list(query_lens), dev)  # (N,), (N,)
        pos = torch.tensor(starts, device=dev)[seq] + offset  # (N,) position of each new token in its sequence
        meta.extra["slots"] = tables[seq, pos // bs] * bs + pos % bs  # (N,) flat slot of each new token
        meta.extra["tables"] = tables
        if B == 1:  # one sequence: no padding
            return mark_single(meta, dev)
        if all(q == 1 for q in query_lens):  # pure decode: the queries already form (B, H, 1, hd)
            meta.kind = "decode"
            meta.extra["decode"] = self._decode_group(list(range(B)), ctx, tables)
            return meta
        meta.kind = "mixed"  # decode tokens batched together, each multi-token sequence on its own
        dec, dec_rows, chunks = split_mixed(list(query_lens), starts, dev)
        meta.extra["decode"] = None
        if dec:
            d = self._decode_group(dec, [ctx[i] for i in dec], tables)
            d["index"] = torch.tensor(dec_rows, device=dev)  # (Nd,) their rows in the flat batch
            meta.extra["decode"] = d
        meta.extra["chunks"] = [(tables[i : i + 1, : cdiv(ctx[i], bs)], s, a, b, mask) for i, s, a, b, mask in chunks]
        return meta

    def _decode_group(self, rows: list[int], ctx: list[int], tables: torch.Tensor) -> dict:
        """Block tables, lengths and mask for the one-token sequences ``rows`` of a step."""
        dev, L = self.device, max(ctx)
        lens = torch.tensor(ctx, device=dev)  # (Nd,)
        mask = key_mask(ctx, dev)  # (Nd, 1, 1, L) or None
        nb = cdiv(L, self.block_size)
        sub = tables[:, :nb] if len(rows) == tables.shape[0] else tables[rows, :nb]  # (Nd, nb)
        if self.decode == "kernel":
            sub = sub.to(torch.int32).contiguous()  # the kernel's block-table type, converted once per step
        return {"tables": sub, "lens": lens.to(torch.int32), "L": L, "mask": mask}

    def gather(self, pool: torch.Tensor, tables: torch.Tensor, L: int) -> torch.Tensor:
        """(B, Hkv, L, hd) view of a copy of the blocks named by ``tables`` (B, nb): the torch path's extra
        bytes, B·nb·bs·Hkv·hd elements written and read again."""
        B, nb = tables.shape
        blocks = pool.index_select(0, tables.reshape(-1))  # (B·nb, bs, Hkv, hd)
        return blocks.view(B, nb * self.block_size, self.num_kv_heads, self.head_dim)[:, :L].transpose(1, 2)

    def _attend_decode(self, layer: int, q: torch.Tensor, d: dict) -> torch.Tensor:
        """q (Nd, H, hd), one token per sequence → (Nd, H, hd)."""
        K, V = self.k[layer], self.v[layer]
        if self.decode == "kernel":
            from course_lib.kernels.paged_decode import paged_decode

            return paged_decode(q.contiguous(), K, V, d["tables"], d["lens"], check_values=False)
        keys, values = self.gather(K, d["tables"], d["L"]), self.gather(V, d["tables"], d["L"])
        return sdpa(q[:, :, None], keys, values, d["mask"], False, self.use_sdpa)[:, :, 0]  # (Nd, H, hd)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        K, V = self.k[layer], self.v[layer]  # (capacity, bs, Hkv, hd)
        slots = meta.extra["slots"]
        K.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, slots, k)  # (N, Hkv, hd) into their slots
        V.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, slots, v)
        if meta.kind == "single":
            L, s = meta.context_lens[0], meta.start_lens[0]
            if s == 0:  # nothing cached before: the keys are exactly this step's k, v
                keys, values = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # (1, Hkv, T, hd)
            else:
                tables = meta.extra["tables"]
                keys, values = self.gather(K, tables, L), self.gather(V, tables, L)
            o = sdpa(q.transpose(0, 1)[None], keys, values, meta.mask, meta.is_causal, self.use_sdpa)  # (1, H, T, hd)
            return o[0].transpose(0, 1)  # (T, H, hd)
        if meta.kind == "decode":
            return self._attend_decode(layer, q, meta.extra["decode"])
        out = q.new_empty(q.shape)  # (N, H, hd)
        d = meta.extra["decode"]
        if d is not None:
            out[d["index"]] = self._attend_decode(layer, q[d["index"]], d)
        for tables, s, a, b, mask in meta.extra["chunks"]:
            L = s + b - a
            if s == 0:
                keys, values = k[a:b].transpose(0, 1)[None], v[a:b].transpose(0, 1)[None]  # (1, Hkv, T, hd)
            else:
                keys, values = self.gather(K, tables, L), self.gather(V, tables, L)
            o = sdpa(q[a:b].transpose(0, 1)[None], keys, values, mask, mask is None, self.use_sdpa)  # (1, H, T, hd)
            out[a:b] = o[0].transpose(0, 1)
        return out


__all__ = ["DECODE_PATHS", "OutOfBlocks", "PagedBackend", "SwappedKV"]
