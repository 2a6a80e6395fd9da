"""The KV cache: keys and values of every token already processed, so decode never recomputes them.

Decode reads the whole cache once per step (bandwidth-bound, like the weights): its size,
2 · layers · kv_heads · head_dim · bytes per token, is what limits batch size and context.
This is the *contiguous* cache: each sequence owns a slab of ``max_len`` slots reserved up front
(the waste that PagedAttention removes in chapter 05). The engine talks to a cache only through
``positions_for`` / ``update`` / ``lengths``, so a paged cache plugs in without touching the model.
Introduced in 04 (engine) and 05_attention_kv_cache.ipynb.
"""
from __future__ import annotations

import torch


class ContiguousKVCache:
    """Per layer, K and V tensors of shape (B, kv_heads, max_len, head_dim); row b holds ``lengths[b]`` tokens."""

    def __init__(self, num_layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        for name, value in (("num_layers", num_layers), ("batch", batch), ("max_len", max_len),
                            ("kv_heads", kv_heads), ("head_dim", head_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        shape = (batch, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # tokens stored per row
        self.max_len = max_len
        self._write_idx: torch.Tensor | None = None  # (B, T) slots written by the step in flight
        self._rows = torch.arange(batch, device=device)[:, None]  # (B, 1)

    @property
    def batch(self) -> int:
        return self.lengths.numel()

    def nbytes(self) -> int:
        """Bytes reserved (not used): what a contiguous cache costs whatever the sequences' lengths."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def positions_for(self, n_new: int) -> torch.Tensor:
        """Begin a step of ``n_new`` tokens per row; returns their absolute positions (B, n_new)."""
        if n_new <= 0:
            raise ValueError(f"n_new must be positive, got {n_new}")
        pos = self.lengths[:, None] + torch.arange(n_new, device=self.lengths.device)  # (B, T)
        if int(pos.max()) >= self.max_len:
            raise ValueError(f"KV cache full: a row would reach position {int(pos.max())} >= max_len {self.max_len}")
        self._write_idx = pos
        return pos

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's k, v (B, kv_heads, T, head_dim); return all keys/values (B, kv_heads, L, head_dim)
        where L covers the longest row. Slots past a row's own length are masked by position."""
        idx = self._write_idx
        if idx is None:
            raise RuntimeError("call positions_for() before update()")
        # advanced indices (B,1) and (B,T) around a slice: the value is laid out (B, T, kv_heads, head_dim)
        self.k[layer][self._rows, :, idx] = k.transpose(1, 2)
        self.v[layer][self._rows, :, idx] = v.transpose(1, 2)
        end = int(idx[:, -1].max()) + 1
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, n_real: torch.Tensor | int) -> None:
        """Commit the step: row b keeps ``n_real[b]`` of the tokens just written (padding is dropped)."""
        self.lengths += n_real if isinstance(n_real, torch.Tensor) else torch.full_like(self.lengths, n_real)
        self._write_idx = None

    def truncate(self, lengths: torch.Tensor) -> None:
        """Forget tokens past ``lengths`` (B,) — e.g. rejected speculative tokens; later writes overwrite them."""
        if (lengths > self.lengths).any() or (lengths < 0).any():
            raise ValueError("truncate lengths must be between 0 and the current lengths")
        self.lengths = lengths.clone()

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep/duplicate rows (beam search): row i becomes old row ``rows[i]``."""
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]
        self.lengths = self.lengths.index_select(0, rows)
        self._rows = torch.arange(rows.numel(), device=rows.device)[:, None]

    def reset(self) -> None:
        self.lengths.zero_()
        self._write_idx = None
