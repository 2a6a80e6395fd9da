"""The paged cache on an engine's own weights: the same tokens, and the bytes each cache holds while it serves.

``paged_vs_contiguous`` generates a batch with the engine's contiguous cache, then again with a
``PagedBackend`` pool swapped into the same engine (no second copy of the weights: for the chat model a
second engine would cost hundreds of MB), and records after every append the bytes each cache reserves:
the contiguous slab reserves ``max_model_len`` slots per live sequence, the pool only the blocks its
sequences have grown into. It also sets the slab beside what it would reserve at the model's whole
context window (the engine's ``max_model_len`` is usually set smaller to fit the machine). Counting the
engine's own ``bytes_reserved``; generation is the engine's. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from course_lib.kv.checks import check_int


@contextmanager
def with_backend(engine, backend):
    """Serve with ``backend`` inside the block, then restore the engine's own (the engine must be idle)."""
    if engine.has_unfinished():
        raise ValueError("engine has unfinished requests; swap its KV backend only when it is idle")
    saved = engine.backend
    engine.backend = engine.scheduler.backend = backend
    try:
        yield backend
    finally:
        engine.backend = engine.scheduler.backend = saved


@contextmanager
def _peak_bytes(kv, peak: list):
    """After every append, keep the largest ``kv.bytes_reserved()`` in ``peak[0]`` and ``bytes_used()`` in
    ``peak[1]`` (the wrapper is an instance attribute, removed after the block)."""
    original = kv.append

    def append(handle, n):
        original(handle, n)
        peak[0] = max(peak[0], kv.bytes_reserved())
        peak[1] = max(peak[1], kv.bytes_used())

    kv.append = append
    try:
        yield
    finally:
        del kv.append


@dataclass(frozen=True)
class PagedRun:
    """One batch served twice: tokens and peak bytes reserved, contiguous slab vs paged pool."""

    same_tokens: bool
    num_seqs: int
    max_tokens: int  # longest sequence reached (prompt + output)
    bytes_per_token: int
    max_model_len: int  # the engine's
    model_context: int  # the model's whole window
    contiguous_peak: int  # bytes reserved, the engine's contiguous cache
    paged_peak: int  # bytes reserved, the paged pool
    paged_used_peak: int  # bytes of those slots holding tokens
    block_size: int
    pool_blocks: int
    pool_check: object  # engine_check.KvCheck of the pool's tensors after the run

    @property
    def contiguous_at_context(self) -> int:
        """What the slab would reserve for the same sequences at the model's whole context window."""
        return self.num_seqs * self.model_context * self.bytes_per_token

    @property
    def paged_waste(self) -> float:
        return 1 - self.paged_used_peak / self.paged_peak

    def __str__(self) -> str:
        mb = 1e6
        return (
            f"{self.num_seqs} sequences, at most {self.max_tokens} tokens each, {self.bytes_per_token / 1e3:.1f} kB "
            f"per token; greedy tokens {'identical' if self.same_tokens else 'DIFFER'} with the two caches\n"
            f"  contiguous, max_model_len {self.max_model_len}: peak reserved {self.contiguous_peak / mb:8.1f} MB\n"
            f"  contiguous at the model's {self.model_context} context: {self.contiguous_at_context / mb:8.1f} MB "
            f"(the same rows, {self.model_context} slots each)\n"
            f"  paged, {self.pool_blocks} blocks of {self.block_size}: peak reserved {self.paged_peak / mb:8.1f} MB, "
            f"{self.paged_used_peak / mb:.1f} MB of it holding tokens ({self.paged_waste:.1%} waste)\n"
            f"  the pool's tensors: {self.pool_check}"
        )


def paged_vs_contiguous(engine, prompts, params, block_size: int = 16, pool_tokens: int | None = None) -> PagedRun:
    """Generate ``prompts`` with ``params`` on ``engine`` (its contiguous cache), then with a paged pool of
    ``pool_tokens`` slots (default: room for every sequence at its longest, rounded up to blocks) in blocks
    of ``block_size``, swapped into the same engine; compare tokens and peak bytes reserved."""
    from course_lib.engine.attention.block_manager import cdiv
    from course_lib.engine.attention.contiguous import ContiguousBackend
    from course_lib.engine.attention.paged import PagedBackend
    from course_lib.engine.engine import Engine
    from course_lib.kv.engine_check import engine_kv_check

    if not isinstance(engine, Engine):
        raise ValueError(f"engine must be a course_lib.engine.Engine, got {type(engine).__name__}")
    if not isinstance(engine.backend, ContiguousBackend):
        raise ValueError(f"engine must use the contiguous KV cache, it uses {type(engine.backend).__name__}")
    check_int("block_size", block_size)
    if isinstance(prompts, str) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of strings, got {prompts!r}")
    ids = engine.encode(list(prompts))
    longest = max(len(i) for i in ids) + params.max_new_tokens
    if pool_tokens is None:
        pool_tokens = len(ids) * cdiv(longest, block_size) * block_size
    check_int("pool_tokens", pool_tokens)
    m, kv = engine.model, engine.backend
    peak_c, peak_p = [0, 0], [0, 0]
    with _peak_bytes(kv, peak_c):
        ref = [r.output_ids for r in engine.generate(list(prompts), params)]
    pool = PagedBackend(
        m.num_layers,
        m.num_kv_heads,
        m.head_dim,
        cdiv(pool_tokens, block_size),
        block_size,
        engine.config.max_model_len,
        m.dtype,
        m.device,
    )
    with with_backend(engine, pool), _peak_bytes(pool, peak_p):
        out = [r.output_ids for r in engine.generate(list(prompts), params)]
        check = engine_kv_check(engine)
    blocks = pool.num_blocks
    del pool  # its tensors go with it
    return PagedRun(
        out == ref,
        len(ids),
        max(len(i) + len(o) for i, o in zip(ids, ref)),
        kv.bytes_per_token,
        engine.config.max_model_len,
        m.max_position,
        peak_c[0],
        peak_p[0],
        peak_p[1],
        block_size,
        blocks,
        check,
    )
