"""The KV cache: keys and values of every token already processed, so decode never recomputes them.

Decode reads the whole cache once per step (bandwidth-bound, like the weights): its size,
2 · layers · kv_heads · head_dim · bytes per token, is what limits batch size and context.
This is the *contiguous* cache: each sequence owns a slab of ``max_len`` slots reserved up front
(the waste that PagedAttention removes in chapter 05). The engine talks to a cache only through
``positions_for`` / ``update`` / ``lengths``, so a paged cache plugs in without touching the model.
Introduced in 02_metrics.ipynb; the subject of 05_attention_kv_cache.ipynb.
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
        self._host_lengths = [0] * batch  # the same numbers on the host: no device sync to read them
        self.max_len = max_len
        self._write_idx: torch.Tensor | None = None  # (B, T) slots written by the step in flight
        self._write_start: int | None = None  # when every row starts at the same slot: a plain slice write
        self._end = 0  # one past the last slot written by this step, over all rows
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
        self._end = max(self._host_lengths) + n_new
        if self._end > self.max_len:
            raise ValueError(f"KV cache full: a row would reach position {self._end - 1} >= max_len {self.max_len}")
        uniform = min(self._host_lengths) == max(self._host_lengths)
        self._write_start = self._host_lengths[0] if uniform else None
        pos = self.lengths[:, None] + torch.arange(n_new, device=self.lengths.device)  # (B, T)
        self._write_idx = pos
        return pos

    @property
    def uniform_step(self) -> bool:
        """True when every row of the step in flight starts at the same position (no ragged mask needed)."""
        return self._write_start is not None

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's k, v (B, kv_heads, T, head_dim); return all keys/values (B, kv_heads, L, head_dim)
        where L covers the longest row. Slots past a row's own length are masked by position."""
        idx = self._write_idx
        if idx is None:
            raise RuntimeError("call positions_for() before update()")
        if self._write_start is not None:  # all rows aligned: a slice copy
            start, stop = self._write_start, self._write_start + k.shape[2]
            self.k[layer][:, :, start:stop] = k
            self.v[layer][:, :, start:stop] = v
        else:  # ragged rows: advanced indices (B,1) and (B,T) around a slice; value laid out (B, T, kv_heads, hd)
            self.k[layer][self._rows, :, idx] = k.transpose(1, 2)
            self.v[layer][self._rows, :, idx] = v.transpose(1, 2)
        return self.k[layer][:, :, :self._end], self.v[layer][:, :, :self._end]

    def advance(self, n_real: torch.Tensor | int) -> None:
        """Commit the step: row b keeps ``n_real[b]`` of the tokens just written (padding is dropped)."""
        if isinstance(n_real, torch.Tensor):
            self.lengths += n_real
            self._host_lengths = [a + b for a, b in zip(self._host_lengths, n_real.tolist())]
        else:
            self.lengths += n_real
            self._host_lengths = [a + n_real for a in self._host_lengths]
        self._write_idx = None

    def truncate(self, lengths: torch.Tensor) -> None:
        """Forget tokens past ``lengths`` (B,) — e.g. rejected speculative tokens; later writes overwrite them."""
        if (lengths > self.lengths).any() or (lengths < 0).any():
            raise ValueError("truncate lengths must be between 0 and the current lengths")
        self.lengths = lengths.clone()
        self._host_lengths = lengths.tolist()

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep/duplicate rows (beam search): row i becomes old row ``rows[i]``."""
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]
        self.lengths = self.lengths.index_select(0, rows)
        self._host_lengths = self.lengths.tolist()
        self._rows = torch.arange(rows.numel(), device=rows.device)[:, None]

    def reset(self) -> None:
        self.lengths.zero_()
        self._host_lengths = [0] * self.batch
        self._write_idx = None
