"""The KV cache as a data structure: what append, fork and free cost in the contiguous slab and the paged pool.

Xiao & Zhu (*Foundations of LLMs*) stress that the KV cache is not a hardware cache but a data structure the
server manages, and its operations have costs like any other's. The contiguous slab (``ContiguousBackend``)
finds token t of a sequence at ``row, t``: append is a counter, but fork (beam search, parallel sampling)
copies the parent's whole K/V, 2 · layers · tokens · kv_heads · head_dim · bytes, and a row is reserved for
``max_len`` tokens whatever the sequence uses. The paged pool (``PagedBackend``) finds it through a block
table, ``table[t // bs]``, one lookup per block; append takes a block every ``bs`` tokens, fork copies the
*table* and raises reference counts (copy-on-write defers the copy to the first write into a shared block),
and free returns blocks to a free list. :func:`op_times` times the three on both, with SmolLM2's shape.
Introduced in 05_attention_kv_cache.ipynb."""

from __future__ import annotations

import time
from dataclasses import dataclass

from course_lib.kv.checks import check_int


@dataclass(frozen=True)
class OpTimes:
    """Best-of-repeats seconds per operation on a sequence of ``tokens`` tokens (STREAM's convention), the
    bytes a contiguous fork copies, and the fork's spread over its repeats."""

    backend: str
    tokens: int
    append_s: float  # one more token
    fork_s: float
    free_s: float
    fork_bytes: int  # K/V bytes the fork copies now (0 for the paged pool: it shares blocks)
    fork_spread: float  # relative spread of the fork's repeats (for claim(spread=))


def _best(xs):
    return min(xs)  # best of the repeats: on a shared machine a neighbour's burst only ever slows a copy


def op_times(backend, tokens: int, repeats: int = 7) -> OpTimes:
    """Time append(1) / fork / free on ``backend`` (a fresh ContiguousBackend or PagedBackend with room for
    two sequences of ``tokens`` + 1) holding one sequence of ``tokens`` tokens."""
    from course_lib.engine.attention.contiguous import ContiguousBackend
    from course_lib.measure.claims import relative_spread

    check_int("tokens", tokens, 1)
    check_int("repeats", repeats, 2)
    h = backend.allocate()
    backend.append(h, tokens)
    if isinstance(backend, ContiguousBackend):  # touch the slab (first use allocates it)
        for t in backend.k + backend.v:
            t[h, :, :tokens] = 1.0
    backend.free(backend.fork(h))  # warm-up, untimed: the first fork grows the slab / touches fresh pages
    app, fk, fr = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        backend.append(h, 1)
        app.append(time.perf_counter() - t0)
        backend.truncate(h, tokens)
        t0 = time.perf_counter()
        child = backend.fork(h)
        fk.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        backend.free(child)
        fr.append(time.perf_counter() - t0)
    backend.free(h)
    contiguous = isinstance(backend, ContiguousBackend)
    return OpTimes(
        backend.name,
        tokens,
        _best(app),
        _best(fk),
        _best(fr),
        tokens * backend.bytes_per_token if contiguous else 0,
        relative_spread(fk),
    )


def smollm2_backends(tokens: int, block_size: int = 16):
    """A contiguous slab and a paged pool with SmolLM2's KV shape (30 layers, 3 KV heads of 64, fp32), each
    with room for exactly two sequences of ``tokens`` + 1 tokens."""
    from course_lib.engine.attention.block_manager import cdiv
    from course_lib.engine.attention.contiguous import ContiguousBackend
    from course_lib.engine.attention.paged import PagedBackend

    check_int("tokens", tokens, 1)
    shape = (30, 3, 64)
    return (
        ContiguousBackend(*shape, max_len=tokens + 1, max_seqs=2),
        PagedBackend(*shape, num_blocks=2 * cdiv(tokens + 1, block_size) + 1, block_size=block_size),
    )


def fork_verdict(contiguous: OpTimes, paged: OpTimes):
    """The chapter's claim: a paged fork (a table copy) costs < 1/10 of a contiguous one (a K/V copy)."""
    from course_lib.measure.claims import claim

    if contiguous.tokens != paged.tokens:
        raise ValueError(f"compare forks of one length, got {contiguous.tokens} and {paged.tokens} tokens")
    return claim(
        f"a paged fork costs < 1/10 of a contiguous fork at {contiguous.tokens} tokens",
        paged.fork_s / contiguous.fork_s,
        at_most=0.1,
        why_not="the slab's copy is so short here that Python's per-call overhead dominates both",
        spread=max(contiguous.fork_spread, paged.fork_spread),
    )
