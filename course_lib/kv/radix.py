"""A radix (prefix) tree over token ids, as SGLang's RadixAttention keeps its KV cache, and the engine's
hash-block prefix cache beside it on one request stream.

The KV cache is a data structure (Xiao & Zhu, *Foundations of LLMs*): the question "which of this prompt's
tokens already have K/V?" is a longest-prefix match. vLLM answers it with a hash per *full block* (a block's
name hashes its parent's name and its tokens: ``engine.attention.block_manager``), so the tail of a prompt
that does not fill a block is never shared. SGLang (Zheng et al., 2024) stores every cached sequence in a
radix tree whose edges are runs of tokens: a match is token-granular, and eviction drops the least recently
used *leaves* (a shared prefix outlives its branches). :class:`RadixCache` does ``insert`` / ``match`` /
``evict`` with a capacity in tokens (``peek`` matches without touching the LRU clock); :func:`hit_rates`
replays a stream through it and through a ``BlockManager`` of the same capacity; :func:`multi_turn_stream`
draws conversations that share a system prompt, each turn resending the whole history.
Introduced in 05_attention_kv_cache.ipynb."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from course_lib.kv.checks import check_int


@dataclass(eq=False)
class _Node:
    key: tuple = ()  # the run of tokens on the edge into this node
    parent: _Node | None = None
    children: dict = field(default_factory=dict)  # first token → child
    last: int = 0  # logical clock of the last match or insert through this node


class RadixCache:
    """Cached token sequences in a radix tree holding at most ``capacity`` tokens (None: unbounded)."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None:
            check_int("capacity", capacity, 1)
        self.capacity = capacity
        self.root = _Node()
        self.tokens = 0  # tokens stored: Σ edge lengths
        self._clock = itertools.count(1)
        self.evicted = 0

    def _walk(self, ids, touch: bool) -> tuple[_Node, int, int]:
        """(deepest node fully matched, tokens matched there, tokens matched into its next edge)."""
        node, n, now = self.root, 0, next(self._clock)
        while n < len(ids):
            child = node.children.get(ids[n])
            if child is None:
                return node, n, 0
            k = 0
            while k < len(child.key) and n + k < len(ids) and child.key[k] == ids[n + k]:
                k += 1
            if touch:
                child.last = now
            if k < len(child.key):
                return node, n, k
            node, n = child, n + k
        return node, n, 0

    def match(self, ids) -> int:
        """Length of the longest cached prefix of ``ids``; marks the path used (LRU)."""
        _, n, k = self._walk(tuple(ids), touch=True)
        return n + k

    def peek(self, ids) -> int:
        """Like :meth:`match`, but leaves the LRU clock alone: a scheduler ranking its queue only looks."""
        _, n, k = self._walk(tuple(ids), touch=False)
        return n + k

    def insert(self, ids) -> None:
        """Cache ``ids`` (its K/V are computed), splitting an edge where it diverges; then evict to capacity."""
        ids = tuple(ids)
        node, n, k = self._walk(ids, touch=True)
        if k:  # split the edge into `child` after k tokens
            child = node.children[ids[n]]
            mid = _Node(child.key[:k], node, {child.key[k]: child}, child.last)
            child.key, child.parent = child.key[k:], mid
            node.children[ids[n]] = mid
            node, n = mid, n + k
        if n < len(ids):
            node.children[ids[n]] = _Node(ids[n:], node, {}, next(self._clock))
            self.tokens += len(ids) - n
        if self.capacity is not None and self.tokens > self.capacity:
            self.evict(self.tokens - self.capacity)

    def _leaves(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root and not node.children:
                yield node
            stack.extend(node.children.values())

    def evict(self, num_tokens: int) -> int:
        """Drop least recently used leaves (a leaf's parent may become one) until ``num_tokens`` are freed."""
        check_int("num_tokens", num_tokens, 0)
        freed = 0
        while freed < num_tokens and self.tokens:
            leaf = min(self._leaves(), key=lambda nd: nd.last)
            del leaf.parent.children[leaf.key[0]]
            freed += len(leaf.key)
            self.tokens -= len(leaf.key)
        self.evicted += freed
        return freed


def brute_force_match(cached: list, ids) -> int:
    """The reference: longest common prefix of ``ids`` with any cached sequence."""
    best = 0
    for c in cached:
        n = 0
        while n < min(len(c), len(ids)) and c[n] == ids[n]:
            n += 1
        best = max(best, n)
    return best


def multi_turn_stream(num_convs: int = 24, system_len: int = 180, seed: int = 0, vocab: int = 49152) -> list:
    """Requests as (prompt, prompt + its answer) token lists: conversations sharing one system prompt, 1-5
    turns each (user 8-60 tokens, answer 16-160), each turn resending the history; the conversations'
    turns interleaved at random, each conversation's in order."""
    check_int("num_convs", num_convs, 1)
    check_int("system_len", system_len, 0)
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, system_len).tolist()
    convs = []
    for _ in range(num_convs):
        hist, pairs = list(system), []
        for _ in range(int(rng.integers(1, 6))):
            prompt = hist + rng.integers(0, vocab, int(rng.integers(8, 61))).tolist()
            hist = prompt + rng.integers(0, vocab, int(rng.integers(16, 161))).tolist()
            pairs.append((prompt, hist))
        convs.append(pairs)
    order = [i for i, pairs in enumerate(convs) for _ in pairs]
    rng.shuffle(order)
    cursor = [0] * num_convs
    stream = []
    for i in order:
        stream.append(convs[i][cursor[i]])
        cursor[i] += 1
    return stream


@dataclass(frozen=True)
class HitRates:
    """Share of prompt tokens found cached, by each structure, on one stream at one capacity."""

    prompt_tokens: int
    radix_hits: int
    block_hits: int
    block_size: int
    capacity: int
    tail_bound: int  # Σ over requests of the radix match's tokens past its last full block: what blocks cannot share
    radix_fill: float = 1.0  # the tree's mean tokens held after each insert / capacity (whole-leaf eviction)

    @property
    def radix(self) -> float:
        return self.radix_hits / self.prompt_tokens

    @property
    def block(self) -> float:
        return self.block_hits / self.prompt_tokens


def hit_rates(stream, capacity: int, block_size: int = 16) -> HitRates:
    """Replay ``stream`` ((prompt, served sequence) pairs) through a RadixCache and a BlockManager of
    ``capacity`` tokens (at least the longest sequence: each must fit to be served). Both leave the prompt's
    last token to compute (its logits are needed). With room for everything, block hits = radix hits −
    ``tail_bound`` exactly: the blocks hold every full block of every matched prefix."""
    from course_lib.engine.attention.block_manager import BlockManager

    longest = max(len(served) for _, served in stream)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < longest:
        raise ValueError(
            f"capacity must be an int >= the stream's longest sequence ({longest} tokens), got {capacity!r}"
        )
    radix, bm = RadixCache(capacity), BlockManager(capacity // block_size, block_size)
    total = r_hits = b_hits = tail = 0
    held = 0
    for prompt, served in stream:
        total += len(prompt)
        r = min(radix.match(prompt), len(prompt) - 1)
        r_hits += r
        tail += r % block_size
        seq, n = bm.new_seq_with_prefix(prompt)
        b_hits += n
        bm.append(seq, len(served) - n)
        bm.cache_blocks(seq, served, len(served))
        bm.free_seq(seq)
        radix.insert(served)
        held += radix.tokens
    return HitRates(total, r_hits, b_hits, block_size, capacity, tail, held / len(stream) / capacity)


def eviction_verdict(h: HitRates):
    """The claim at a capacity that forces eviction: the radix tree hits at least as often as hash blocks."""
    from course_lib.measure.claims import claim

    return claim(
        f"at {h.capacity:,} tokens of cache the radix tree hits at least as often as hash blocks",
        h.radix - h.block,
        at_least=0.0,
        why_not=f"the tree evicts whole leaves (a turn and its answer, hundreds of tokens) when it needs only a "
        f"few, so it held {h.radix_fill:.0%} of its capacity on average, where the block pool evicts 16 tokens at a time",
    )
