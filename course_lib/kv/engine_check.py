"""The KV size formula against the bytes the engine's cache tensors really hold, contiguous or paged.

``engine_kv_check`` sums ``.nbytes`` of every layer's K and V tensor, divides by the slots they have
(rows · max_len for the contiguous slab, blocks · block_size for the paged pool) and sets that beside
``accounting.kv_bytes_per_token``: 2 · layers · kv_heads · head_dim · bytes per element. The two must be
equal, in any dtype. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from course_lib.core.dtypes import canonical
from course_lib.models.accounting import ModelShape, kv_bytes_per_token


@dataclass(frozen=True)
class KvCheck:
    """KV bytes per token from the formula and from the engine's cache tensors (``.nbytes`` / slots)."""

    model: str
    dtype: str
    formula_bytes_per_token: float  # accounting.kv_bytes_per_token
    tensor_bytes_per_token: float  # Σ nbytes of every layer's K and V / (rows · max_len)
    tensor_bytes: int  # Σ nbytes
    rows: int  # contiguous: rows (sequences); paged: blocks
    max_len: int  # contiguous: slots per row; paged: block_size
    backend: str = "contiguous"

    @property
    def matches(self) -> bool:
        return self.formula_bytes_per_token == self.tensor_bytes_per_token

    def __str__(self) -> str:
        unit = "row(s)" if self.backend == "contiguous" else "block(s)"
        return (
            f"{self.model} {self.dtype}: formula 2·layers·kv_heads·head_dim·bytes = {self.formula_bytes_per_token:,.0f} "
            f"B/token; the engine's tensors hold {self.tensor_bytes:,} B for {self.rows} {unit} × {self.max_len} "
            f"slots = {self.tensor_bytes_per_token:,.0f} B/token ({'match' if self.matches else 'MISMATCH'})"
        )


def engine_kv_check(engine) -> KvCheck:
    """Compare ``accounting.kv_bytes_per_token`` with the bytes the engine's cache really holds: the
    contiguous slab (rows · max_len slots) or the paged pool (blocks · block_size slots).

    Both allocate on first use; if the cache holds no tensors yet, one sequence of one token is allocated
    and freed again (the tensors stay, as they do after any request). Introduced in 05_attention_kv_cache.ipynb."""
    from course_lib.engine.attention.contiguous import ContiguousBackend
    from course_lib.engine.attention.paged import PagedBackend
    from course_lib.engine.engine import Engine

    if not isinstance(engine, Engine):
        raise ValueError(f"engine must be a course_lib.engine.Engine, got {type(engine).__name__}")
    backend = engine.backend
    if not isinstance(backend, (ContiguousBackend, PagedBackend)):
        raise ValueError(f"engine must use the contiguous or the paged KV cache, it uses {type(backend).__name__}")
    if not backend.k:
        h = backend.allocate()
        backend.append(h, 1)
        backend.free(h)
    tensors = backend.k + backend.v
    if isinstance(backend, ContiguousBackend):
        rows, _, max_len, _ = tensors[0].shape  # per layer (rows, kv_heads, max_len, head_dim)
    else:
        rows, max_len, _, _ = tensors[0].shape  # per layer (blocks, block_size, kv_heads, head_dim)
    nbytes = sum(t.nbytes for t in tensors)
    config = engine.hf_model.config
    shape = ModelShape.from_config(config, name=Path(getattr(config, "_name_or_path", "") or "engine").name)
    dtype = canonical(backend.dtype)
    return KvCheck(
        shape.name,
        dtype,
        kv_bytes_per_token(shape, dtype),
        nbytes / (rows * max_len),
        nbytes,
        rows,
        max_len,
        "contiguous" if isinstance(backend, ContiguousBackend) else "paged",
    )
