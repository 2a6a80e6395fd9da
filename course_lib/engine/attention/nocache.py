"""No KV cache: nothing is stored, so every step runs the whole sequence again from position 0.

Each new token costs a forward over all the tokens before it: total work grows with the square of the
length instead of linearly. Chapter 05 measures exactly that against the contiguous cache.
"""

from __future__ import annotations

import itertools

import torch

from course_lib.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    pad_tokens,
    ragged_index,
    ragged_mask,
    sdpa,
    unpad_tokens,
)


class NoCacheBackend(AttentionBackend):
    """Attention over the step's own tokens only. Storage methods keep lengths for bookkeeping, no tensors."""

    name = "none"
    stores_kv = False

    def __init__(self, max_len: int, use_sdpa: bool = True) -> None:
        self.max_len = max_len
        self.use_sdpa = use_sdpa
        self._ids = itertools.count()
        self._len: dict[int, int] = {}

    def max_tokens_per_seq(self) -> int:
        return self.max_len

    def can_allocate(self, num_tokens: int) -> bool:
        return num_tokens <= self.max_len

    def allocate(self) -> int:
        h = next(self._ids)
        self._len[h] = 0
        return h

    def can_append(self, handle, num_tokens: int) -> bool:
        return num_tokens <= self.max_len

    def append(self, handle, num_tokens: int) -> None:
        self._len[handle] = num_tokens  # the step holds exactly the tokens it processes

    def truncate(self, handle, length: int) -> None:
        self._len[handle] = min(self._len[handle], length)

    def fork(self, handle) -> int:
        h = self.allocate()
        self._len[h] = self._len[handle]
        return h

    def free(self, handle) -> None:
        self._len.pop(handle, None)

    def length(self, handle) -> int:
        return 0  # nothing survives a step

    def bytes_used(self) -> int:
        return 0

    def bytes_reserved(self) -> int:
        return 0

    def prepare(self, handles, query_lens, positions) -> AttentionMetadata:
        meta = AttentionMetadata(list(query_lens), list(query_lens), list(handles), positions)
        if len(handles) == 1:
            meta.kind, meta.is_causal = "single", query_lens[0] > 1
            return meta
        seq, offset = ragged_index(query_lens, positions.device)
        meta.extra["seq"], meta.extra["offset"] = seq, offset
        meta.mask = ragged_mask(query_lens, [0] * len(query_lens), query_lens, positions.device)
        return meta

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        if meta.kind == "single":
            o = sdpa(
                q.transpose(0, 1)[None],
                k.transpose(0, 1)[None],
                v.transpose(0, 1)[None],
                None,
                meta.is_causal,
                self.use_sdpa,
            )  # (1, H, T, hd)
            return o[0].transpose(0, 1)
        seq, offset = meta.extra["seq"], meta.extra["offset"]
        B, T = meta.num_seqs, max(meta.query_lens)
        o = sdpa(
            pad_tokens(q, seq, offset, B, T),
            pad_tokens(k, seq, offset, B, T),
            pad_tokens(v, seq, offset, B, T),
            meta.mask,
            False,
            self.use_sdpa,
        )  # (B, H, T, hd)
        return unpad_tokens(o, seq, offset)
