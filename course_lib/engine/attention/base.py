"""What every attention backend implements, and the helpers they share (masks, padding a ragged step, SDPA)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """How one flat step's N new tokens split into sequences; built once per step, read by every layer.

    Sequence i owns the tokens ``cu_query_lens[i]:cu_query_lens[i+1]`` of the flat batch; they sit at
    positions ``start_lens[i] ... context_lens[i] - 1`` and attend to keys ``0 ... their own position``.
    """

    query_lens: list[int]  # new tokens per sequence this step (prompt, chunk, 1 for decode, γ+1 to verify)
    context_lens: list[int]  # tokens each sequence holds after this step: cached + new
    handles: list[Any]  # each sequence's KV storage handle (backend-specific)
    positions: torch.Tensor  # (N,) absolute position of every new token
    kind: str = "general"  # "single" (one sequence), "decode" (one token each), "mixed" or "general" (padded)
    mask: torch.Tensor | None = None  # bool, broadcastable to (B, 1, T_max, L_max); None = no mask needed
    is_causal: bool = False  # "single" with no cached prefix: SDPA's built-in causal mask
    extra: dict = field(default_factory=dict)  # backend-specific: where new K/V go, gather indices, ...

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def start_lens(self) -> list[int]:
        """Tokens already cached before this step, per sequence."""
        return [c - q for c, q in zip(self.context_lens, self.query_lens)]


class AttentionBackend:
    """KV storage + attention. Subclasses implement every method; the scheduler and model use only these."""

    name = "abstract"
    stores_kv = True  # False: nothing survives a step, the engine recomputes whole sequences

    # ------------------------------------------------------------ storage
    def max_tokens_per_seq(self) -> int:
        """The most tokens one sequence can ever hold here (a longer request is rejected up front)."""
        raise NotImplementedError

    def can_allocate(self, num_tokens: int) -> bool:
        """Could a new sequence start now and store its first ``num_tokens`` tokens?"""
        raise NotImplementedError

    def allocate(self) -> Any:
        """Storage for a new, empty sequence; returns its handle."""
        raise NotImplementedError

    def can_append(self, handle: Any, num_tokens: int) -> bool:
        raise NotImplementedError

    def append(self, handle: Any, num_tokens: int) -> None:
        """Make room for ``num_tokens`` more tokens; the next forward writes their K/V there."""
        raise NotImplementedError

    def truncate(self, handle: Any, length: int) -> None:
        """Forget every token past ``length`` (speculative rollback); later writes overwrite them."""
        raise NotImplementedError

    def fork(self, handle: Any) -> Any:
        """A new sequence holding a copy of this one's K/V (parallel sampling, beam search)."""
        raise NotImplementedError

    def free(self, handle: Any) -> None:
        raise NotImplementedError

    def length(self, handle: Any) -> int:
        raise NotImplementedError

    def bytes_used(self) -> int:
        """Bytes of K/V actually holding tokens of live sequences."""
        raise NotImplementedError

    def bytes_reserved(self) -> int:
        """Bytes set aside for live sequences (used + what they reserved but do not fill yet)."""
        raise NotImplementedError

    # ------------------------------------------------------------ compute
    def prepare(self, handles: list[Any], query_lens: list[int], positions: torch.Tensor) -> AttentionMetadata:
        """Metadata for a step in which sequence i processes ``query_lens[i]`` new tokens (after ``append``)."""
        raise NotImplementedError

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Store this step's k, v (N, kv_heads, hd) for ``layer``; return attention of q (N, heads, hd) → (N, heads, hd)."""
        raise NotImplementedError


class StoredKV:
    """What the backends that keep K/V tensors share: per layer a K and a V tensor of shape
    (capacity, *row_shape), grown on demand, and the bytes one cached token costs. The class using it sets
    ``num_layers``, ``num_kv_heads``, ``head_dim``, ``dtype``, ``device``, ``k``, ``v`` and ``_capacity``."""

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) · layers · kv_heads · head_dim · bytes per element."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    def _grow(self, rows: int, limit: int, row_shape: tuple) -> None:
        """Room for ``rows`` leading rows (sequences or blocks): double the capacity, at most ``limit``, and
        copy the old rows over."""
        if rows <= self._capacity:
            return
        new = min(limit, max(rows, 2 * self._capacity))
        shape = (new, *row_shape)
        # zeros, not empty: a masked slot still multiplies its (zero) weight by V, and 0 · NaN would be NaN
        k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        for old, fresh in zip(self.k + self.v, k + v):
            fresh[: self._capacity] = old
        self.k, self.v, self._capacity = k, v, new


# ---------------------------------------------------------------- shared maths
def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d + mask) v, spelled out. q (B,H,T,d), k/v (B,H,L,d), mask (B,1,T,L) bool.
    Reads q, k, v once and writes (B,H,T,d); materialises the (B,H,T,L) score matrix (FlashAttention avoids it)."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, T, L)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v  # (B, H, T, d)


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool = False,
    use_sdpa: bool = True,
) -> torch.Tensor:
    """Attention of q (B,H,T,d) over k/v (B,Hkv,L,d); with GQA each KV head serves H/Hkv query heads.
    ``use_sdpa=False`` runs the spelled-out ``attention_ref`` (same maths, for tests and teaching)."""
    group = q.shape[1] // k.shape[1]
    if not use_sdpa:
        T, L = q.shape[2], k.shape[2]
        if mask is None:
            mask = torch.ones(T, L, dtype=torch.bool, device=q.device)
            if is_causal:
                mask = mask.tril()
        mask = mask.expand(q.shape[0], 1, T, L)
        return attention_ref(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), mask)
    if group > 1:
        try:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
        except TypeError:  # torch < 2.5 has no enable_gqa: materialise the repeated heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, L, d)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)


def key_mask(context_lens: list[int], device) -> torch.Tensor | None:
    """(B, 1, 1, L_max) bool: key j of row b is real iff j < context_lens[b]; None when no row is padded."""
    L = max(context_lens)
    if min(context_lens) == L:
        return None
    return (torch.arange(L, device=device)[None, :] < torch.tensor(context_lens, device=device)[:, None])[:, None, None]


def chunk_mask(start: int, T: int, ctx: int, device) -> torch.Tensor | None:
    """(T, ctx) causal mask of T new tokens after ``start`` cached ones; None when SDPA's is_causal fits."""
    if start == 0:
        return None
    return torch.arange(ctx, device=device)[None, :] <= start + torch.arange(T, device=device)[:, None]


def mark_single(meta: AttentionMetadata, device) -> AttentionMetadata:
    """A step of one sequence needs no padding: kind "single", SDPA's causal mask for a prefill, an
    end-aligned mask for a chunk after a cached prefix (or γ+1 tokens to verify), none for one token."""
    meta.kind = "single"
    T, s = meta.query_lens[0], meta.start_lens[0]
    if T > 1:
        meta.mask = chunk_mask(s, T, s + T, device)
        meta.is_causal = meta.mask is None
    return meta


def split_mixed(query_lens: list[int], start_lens: list[int], device) -> tuple[list[int], list[int], list[tuple]]:
    """A mixed step, split the way every backend runs it: decode tokens batched together, each multi-token
    sequence (a prefill or a chunk) on its own, so no decode row is padded up to a long prompt. Returns the
    one-token sequences, their rows in the flat batch, and per multi-token sequence i the tuple
    (i, cached tokens, first row, end row, its (T, ctx) causal mask or None)."""
    ends = list(itertools.accumulate(query_lens))
    dec = [i for i, q in enumerate(query_lens) if q == 1]
    chunks = [
        (i, s, ends[i] - q, ends[i], chunk_mask(s, q, s + q, device))
        for i, (q, s) in enumerate(zip(query_lens, start_lens))
        if q > 1
    ]
    return dec, [ends[i] - 1 for i in dec], chunks


def ragged_index(query_lens: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_seq, token_offset), each (N,): which sequence each flat token belongs to and its index there."""
    seq = torch.repeat_interleave(
        torch.arange(len(query_lens), device=device), torch.tensor(query_lens, device=device)
    )  # (N,)
    starts = torch.tensor([0] + query_lens[:-1], device=device).cumsum(0)  # (B,)
    offset = torch.arange(seq.shape[0], device=device) - starts[seq]  # (N,)
    return seq, offset


def ragged_mask(query_lens: list[int], start_lens: list[int], context_lens: list[int], device) -> torch.Tensor:
    """(B, 1, T_max, L_max) bool: query t of sequence b (at position start_b + t) sees key j iff
    j ≤ start_b + t and j < context_b. Padded query rows see key 0, so softmax never sees an all -inf row."""
    t_max, l_max = max(query_lens), max(context_lens)
    q_pos = torch.tensor(start_lens, device=device)[:, None] + torch.arange(t_max, device=device)  # (B, T)
    key = torch.arange(l_max, device=device)  # (L,)
    ctx = torch.tensor(context_lens, device=device)[:, None, None]  # (B, 1, 1)
    return ((key[None, None, :] <= q_pos[:, :, None]) & (key[None, None, :] < ctx))[:, None]  # (B, 1, T, L)


def pad_tokens(x: torch.Tensor, seq: torch.Tensor, offset: torch.Tensor, num_seqs: int, t_max: int) -> torch.Tensor:
    """Flat (N, heads, d) → padded (B, heads, T_max, d), zeros where a sequence has fewer tokens."""
    out = x.new_zeros(num_seqs, t_max, *x.shape[1:])  # (B, T, heads, d)
    out[seq, offset] = x
    return out.transpose(1, 2)  # (B, heads, T, d)


def unpad_tokens(x: torch.Tensor, seq: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Padded (B, heads, T_max, d) → flat (N, heads, d), the inverse of ``pad_tokens``."""
    return x.transpose(1, 2)[seq, offset]
