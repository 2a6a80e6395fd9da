"""What paging saves in KV memory: slots reserved but empty on a request mix, and blocks shared by forks.

``request_mix`` draws a seeded ShareGPT-like mix of (prompt, output) lengths; ``fragmentation`` counts,
over every decode step, the slots a max-length slab, an oracle slab and paged blocks reserve against
those holding tokens (Kwon et al. 2023: 60–80 % waste vs under 4 %); ``sharing`` forks each prompt into n
samples through the real ``BlockManager``; ``beam_memory`` records the paged engine's pool during a beam
search against what copied beams would hold. Counting only (the pool is pure Python), except
``beam_memory``, which runs the engine. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from course_lib.engine.attention.block_manager import BlockManager, cdiv
from course_lib.measure.costs import check_positive_int


def request_mix(
    n: int = 1000,
    prompt_mean: float = 200.0,
    output_mean: float = 200.0,
    sigma: float = 1.0,
    max_model_len: int = 2048,
    seed: int = 0,
) -> list[tuple[int, int]]:
    """(prompt_len, output_len) of ``n`` requests, lognormal with these means (ShareGPT-like: heavy right
    tail), seeded; each request fits in ``max_model_len``."""
    for name, value in (("n", n), ("max_model_len", max_model_len)):
        check_positive_int(name, value)
    if prompt_mean <= 0 or output_mean <= 0 or sigma < 0:
        raise ValueError(f"means must be > 0 and sigma >= 0, got {prompt_mean}, {output_mean}, {sigma}")
    rng = random.Random(seed)
    mix = []
    for _ in range(n):
        p = max(1, min(max_model_len - 1, round(rng.lognormvariate(_mu(prompt_mean, sigma), sigma))))
        o = max(1, min(max_model_len - p, round(rng.lognormvariate(_mu(output_mean, sigma), sigma))))
        mix.append((p, o))
    return mix


def _mu(mean: float, sigma: float) -> float:
    return math.log(mean) - sigma**2 / 2  # E[lognormal(mu, sigma)] = exp(mu + sigma²/2)


@dataclass(frozen=True)
class Fragmentation:
    """Token slots summed over every decode step of every request: holding tokens vs reserved."""

    used: int
    reserved: dict  # scheme → slots reserved

    def waste(self, scheme: str) -> float:
        """1 − used / reserved: the fraction of reserved KV memory holding nothing."""
        return 1 - self.used / self.reserved[scheme]


def fragmentation(request_mix: list[tuple[int, int]], max_model_len: int = 2048, block_size: int = 16) -> Fragmentation:
    """Reserved vs used KV slots over each request's life (the cache after each decode step holds p + i
    tokens, i = 1 … o), for three schemes: "max_len" (a contiguous slab of ``max_model_len``, what
    ``ContiguousBackend`` does), "oracle" (a slab of exactly p + o, knowing the output length in advance)
    and "paged" (blocks of ``block_size`` taken as the sequence grows). Averaging over steps weights each
    request by how long it occupies the cache, as a serving snapshot would."""
    check_positive_int("max_model_len", max_model_len)
    check_positive_int("block_size", block_size)
    used = 0
    reserved = {"max_len": 0, "oracle": 0, "paged": 0}
    for p, o in request_mix:
        if p + o > max_model_len or p < 1 or o < 1:
            raise ValueError(f"request ({p}, {o}) must have p, o >= 1 and p + o <= max_model_len={max_model_len}")
        for t in range(p + 1, p + o + 1):
            used += t
            reserved["paged"] += cdiv(t, block_size) * block_size
        reserved["max_len"] += o * max_model_len
        reserved["oracle"] += o * (p + o)
    return Fragmentation(used, reserved)


@dataclass(frozen=True)
class Sharing:
    """Peak KV blocks of parallel sampling: forked sequences sharing the prompt vs each with its own copy."""

    shared_blocks: int
    copied_blocks: int
    copy_on_write: int  # partly filled prompt blocks copied at a child's first write

    @property
    def saving(self) -> float:
        return 1 - self.shared_blocks / self.copied_blocks


def sharing(request_mix: list[tuple[int, int]], n: int = 4, block_size: int = 16) -> Sharing:
    """For each request: prefill the prompt once, ``fork`` it into ``n`` samples, let each generate the
    request's output length, and count the blocks held at the end, through the real ``BlockManager``."""
    check_positive_int("n", n)
    shared = copied = cow = 0
    for p, o in request_mix:
        bm = BlockManager(n * cdiv(p + o, block_size) + 1, block_size)
        root = bm.new_seq()
        bm.append(root, p)
        seqs = [root] + [bm.fork(root) for _ in range(n - 1)]
        for s in seqs:
            cow += len(bm.append(s, o))
        st = bm.stats()
        shared, copied = shared + st.used, copied + st.logical
    return Sharing(shared, copied, cow)


@dataclass(frozen=True)
class BeamMemory:
    """Peak KV bytes of one beam search on the paged backend: blocks held with copy-on-write sharing vs
    what the same beams would hold if every fork copied its parent's blocks."""

    num_beams: int
    peak_shared: int
    peak_unshared: int

    @property
    def saving(self) -> float:
        return 1 - self.peak_shared / self.peak_unshared


def beam_memory(engine, prompt, num_beams: int = 4, max_new_tokens: int = 32) -> BeamMemory:
    """Run ``engine.beam_search`` on a paged engine (``Engine(..., kv_cache="paged")``) and record, after every
    append, the bytes its block pool holds (shared prompt and common prefixes counted once) and the bytes the
    beams would hold as separate copies (``bytes_unshared``)."""
    from course_lib.engine.attention.paged import PagedBackend

    kv = engine.backend
    if not isinstance(kv, PagedBackend):
        raise ValueError("engine must use the paged KV cache: Engine(..., kv_cache='paged')")
    check_positive_int("num_beams", num_beams)
    check_positive_int("max_new_tokens", max_new_tokens)
    peak = [0, 0]
    original = kv.append

    def append(handle, n):
        original(handle, n)
        peak[0] = max(peak[0], kv.bytes_reserved())
        peak[1] = max(peak[1], kv.bytes_unshared())

    kv.append = append  # an instance attribute: only this engine, only during this call
    try:
        engine.beam_search(prompt, num_beams=num_beams, max_new_tokens=max_new_tokens, ignore_eos=True)
    finally:
        del kv.append
    return BeamMemory(num_beams, peak[0], peak[1])


@dataclass(frozen=True)
class EngineWaste:
    """KV bytes a paged engine held over a run, summed over its steps: used vs reserved, read from the backend."""

    used: int
    reserved: int
    steps: int
    request_mix: list  # (prompt tokens, output tokens) of the requests run, for ``fragmentation``

    @property
    def waste(self) -> float:
        return 1 - self.used / self.reserved


def engine_waste(engine, prompts, params) -> EngineWaste:
    """Run ``prompts`` on a paged engine step by step and sum ``backend.bytes_used()`` and
    ``bytes_reserved()`` after every step: the waste measured on the engine's own blocks, to set beside the
    arithmetic of ``fragmentation`` on the same lengths."""
    from course_lib.engine.attention.paged import PagedBackend

    if not isinstance(engine.backend, PagedBackend):
        raise ValueError("engine must use the paged backend: Engine(..., kv_cache='paged')")
    seqs = [engine.add_request(p, params) for p in prompts]
    used = reserved = steps = 0
    while engine.has_unfinished():
        engine.step()
        used, reserved, steps = (
            used + engine.backend.bytes_used(),
            reserved + engine.backend.bytes_reserved(),
            steps + 1,
        )
    return EngineWaste(used, reserved, steps, [(s.num_prompt_tokens, s.num_output_tokens) for s in seqs])
