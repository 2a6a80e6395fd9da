"""The block allocator behind PagedAttention: fixed-size KV blocks, a free list, reference counts, block tables.

A sequence's K/V no longer sits in one slab reserved for ``max_len`` tokens: it is cut into blocks of
``block_size`` token slots, taken from a shared pool only when the sequence grows into them. Sequence
*s* keeps a block table, ``table[j]`` = the physical block holding its tokens ``j·bs … (j+1)·bs − 1``,
so its waste is at most one partly filled block. Blocks carry reference counts: ``fork`` copies the
table, not the data (parallel sampling and beam search share the prompt), and the first write into a
shared, partly filled block copies it first (copy-on-write). Pure Python, no tensors: the backend
(``paged.py``) copies the K/V of the blocks this class tells it to. Shaped like nano-vllm's
``block_manager.py`` and vLLM's ``BlockSpaceManager``. Introduced in 05_attention_kv_cache.ipynb.

Prefix caching (chapter 06; vLLM's automatic prefix caching, the hash-based cousin of SGLang's
RadixAttention): a *full* block is named by ``hash((parent block's hash, its token ids))``, so a name
stands for the whole prefix up to that block. ``cache_blocks`` names a sequence's computed full blocks;
``new_seq_with_prefix`` starts a sequence on the named blocks its tokens match (reference count + 1, no
K/V computed again). A named block whose last holder leaves is not freed but kept, evictable, in an LRU
list: it still counts as free (``num_free``), and ``allocate`` recycles the least recently freed one only
when no never-named block is left. Blocks are checked by their (parent, tokens) key, not the hash alone.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from course_lib.measure.costs import check_positive_int


class OutOfBlocks(Exception):
    """Not enough free blocks. Raised before anything changes: the caller may preempt a sequence and retry."""


@dataclass(frozen=True)
class BlockStats:
    """A snapshot of the pool: distinct blocks held vs what unshared copies would hold."""

    num_blocks: int
    block_size: int
    used: int  # distinct blocks referenced by at least one holder
    free: int
    logical: int  # sum of block-table lengths: blocks needed if no block were shared
    tokens: int  # token slots holding live tokens, each physical slot counted once
    cached: int = 0  # free blocks still holding a named prefix (evictable, counted in ``free``)

    @property
    def utilisation(self) -> float:
        """Fraction of the pool's blocks in use."""
        return self.used / self.num_blocks

    @property
    def fill(self) -> float:
        """Fraction of the used blocks' slots holding tokens (1 − internal fragmentation)."""
        return self.tokens / (self.used * self.block_size) if self.used else 1.0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The name of a full block: its tokens and, through ``parent``, every token before them."""
    return hash((parent, tuple(tokens)))


class BlockManager:
    """``num_blocks`` blocks of ``block_size`` slots (a power of two: slot → (block, offset) is a shift and a
    mask in a kernel). Low-level: ``allocate`` / ``incref`` / ``decref`` / ``free`` on block ids. Sequence
    level: ``new_seq`` / ``append`` / ``truncate`` / ``fork`` / ``free_seq`` on block tables."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        check_positive_int("num_blocks", num_blocks)
        check_positive_int("block_size", block_size)
        if block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two (1, 2, 4, ..., 16, 32, ...), got {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.reset()

    def reset(self) -> None:
        """Forget every sequence and free every block."""
        self._free = list(range(self.num_blocks))  # a heap: the lowest free id first keeps the pool compact
        self._ref = [0] * self.num_blocks
        self.tables: dict[int, list[int]] = {}  # seq id → block table
        self.lengths: dict[int, int] = {}  # seq id → tokens stored
        self._ids = itertools.count()
        # prefix caching: names of full blocks, and free blocks that still hold a named prefix
        self.hashes: dict[int, list[int]] = {}  # seq id → names of its first len(...) full blocks
        self._cached: dict[int, int] = {}  # name → block
        self._key: dict[int, tuple] = {}  # block → (name, parent name, token ids) while it is named
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, still named; oldest first
        self.prefix_queries = 0  # tokens looked up by new_seq_with_prefix
        self.prefix_hits = 0  # of those, tokens found cached
        self.num_evictions = 0  # cached blocks recycled by allocate

    # ------------------------------------------------------------ blocks
    @property
    def num_free(self) -> int:
        """Blocks an ``allocate`` can hand out: never-named free ones plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Free blocks still holding a named prefix (a new sequence may reuse them)."""
        return len(self._evictable)

    def ref_count(self, block: int) -> int:
        return self._ref[self._check_block(block)]

    def _check_block(self, block) -> int:
        if not isinstance(block, int) or isinstance(block, bool) or not 0 <= block < self.num_blocks:
            raise ValueError(f"block must be an int in [0, {self.num_blocks}), got {block!r}")
        return block

    def allocate(self) -> int:
        """A free block with reference count 1: a never-named one, else the least recently freed cached one."""
        if self._free:
            block = heapq.heappop(self._free)
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)  # evict: its prefix is forgotten
            self._forget(block)
            self.num_evictions += 1
        else:
            raise OutOfBlocks(f"need 1 block, 0 of {self.num_blocks} free")
        self._ref[block] = 1
        return block

    def incref(self, block: int) -> None:
        """One more holder of an allocated block (a forked sequence), or of a cached free one (a prefix hit)."""
        if self._ref[self._check_block(block)] == 0:
            if block not in self._evictable:
                raise ValueError(f"incref of block {block}, which is free")
            del self._evictable[block]  # revived: no longer evictable
        self._ref[block] += 1

    def decref(self, block: int) -> bool:
        """Drop one holder; with none left the block is free again (kept, evictable, if it is named). True if so."""
        if self._ref[self._check_block(block)] == 0:
            raise ValueError(f"double free: block {block} is already free")
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if block in self._key:
                self._evictable[block] = None  # most recently freed: evicted last
            else:
                heapq.heappush(self._free, block)
            return True
        return False

    def _forget(self, block: int) -> None:
        """Drop the name of ``block`` (evicted, or about to be overwritten)."""
        name = self._key.pop(block)[0]
        if self._cached.get(name) == block:
            del self._cached[name]

    def free(self, block: int) -> None:
        """Give back a block its only holder owns. Use ``decref`` for a block that may be shared."""
        n = self._ref[self._check_block(block)]
        if n == 0:
            raise ValueError(f"double free: block {block} is already free")
        if n > 1:
            raise ValueError(f"block {block} is still referenced by {n} holders; decref it instead of freeing it")
        self.decref(block)

    # ------------------------------------------------------------ sequences
    def _check_seq(self, seq) -> int:
        if seq not in self.tables:
            raise ValueError(f"sequence {seq!r} is not live in this block manager")
        return seq

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Could a new sequence store ``num_tokens`` tokens now?"""
        return self.blocks_for(num_tokens) <= self.num_free

    def _blocks_needed(self, seq: int, num_tokens: int) -> int:
        """Fresh blocks ``append(seq, num_tokens)`` takes: new blocks, plus one if it must copy a shared block."""
        n, table = self.lengths[seq], self.tables[seq]
        needed = self.blocks_for(n + num_tokens) - len(table)
        if num_tokens > 0 and n % self.block_size and self._ref[table[-1]] > 1:
            needed += 1  # copy-on-write of the shared, partly filled last block
        return max(needed, 0)

    def can_append(self, seq: int, num_tokens: int) -> bool:
        return self._blocks_needed(self._check_seq(seq), num_tokens) <= self.num_free

    def new_seq(self) -> int:
        """An empty sequence (no blocks yet); returns its id."""
        seq = next(self._ids)
        self.tables[seq], self.lengths[seq], self.hashes[seq] = [], 0, []
        return seq

    def append(self, seq: int, num_tokens: int) -> list[tuple[int, int]]:
        """Room for ``num_tokens`` more tokens. Returns the (src, dst) blocks whose contents the caller must
        copy before writing (copy-on-write). Raises ``OutOfBlocks`` before changing anything."""
        self._check_seq(seq)
        if not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
        needed = self._blocks_needed(seq, num_tokens)
        if needed > self.num_free:
            raise OutOfBlocks(
                f"sequence {seq} needs {needed} blocks for {num_tokens} more tokens, "
                f"{self.num_free} of {self.num_blocks} free"
            )
        table, n, copies = self.tables[seq], self.lengths[seq], []
        if num_tokens > 0 and n % self.block_size and self._ref[table[-1]] > 1:
            src, dst = table[-1], self.allocate()
            self.decref(src)  # still held by the other sequence(s)
            table[-1] = dst
            copies.append((src, dst))
        while len(table) < self.blocks_for(n + num_tokens):
            table.append(self.allocate())
        self.lengths[seq] = n + num_tokens
        return copies

    def truncate(self, seq: int, length: int) -> None:
        """Keep the first ``length`` tokens; whole blocks past them go back (speculative rollback)."""
        n = self.lengths[self._check_seq(seq)]
        if not isinstance(length, int) or not 0 <= length <= n:
            raise ValueError(f"truncate length must be an int between 0 and {n}, got {length!r}")
        table = self.tables[seq]
        keep = self.blocks_for(length)
        for block in table[keep:]:
            self.decref(block)
        del table[keep:]
        self.lengths[seq] = length
        del self.hashes[seq][length // self.block_size :]
        if length % self.block_size and table[-1] in self._key and self._ref[table[-1]] == 1:
            self._forget(table[-1])  # its tail will be overwritten (a shared one is copied on write instead)

    def fork(self, seq: int) -> int:
        """A new sequence sharing every block of ``seq`` (reference counts + 1, no copy)."""
        table = self.tables[self._check_seq(seq)]
        child = self.new_seq()
        for block in table:
            self.incref(block)
        self.tables[child], self.lengths[child] = list(table), self.lengths[seq]
        self.hashes[child] = list(self.hashes[seq])
        return child

    def free_seq(self, seq: int) -> None:
        """Drop the sequence; its blocks go back unless another sequence still shares them. Named blocks
        are released tail first, so a prefix's last blocks are evicted before its first ones."""
        for block in reversed(self.tables[self._check_seq(seq)]):
            self.decref(block)
        del self.tables[seq], self.lengths[seq], self.hashes[seq]

    # ------------------------------------------------------------ prefix caching
    def match_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """Cached blocks holding the longest run of full blocks of ``token_ids``, leaving at least its
        last token out (it must be computed, for its logits). Changes nothing."""
        bs, parent, blocks = self.block_size, None, []
        for j in range((len(token_ids) - 1) // bs):
            tokens = tuple(token_ids[j * bs : (j + 1) * bs])
            name = block_hash(parent, tokens)
            block = self._cached.get(name)
            if block is None or self._key[block] != (name, parent, tokens):  # absent, or a hash collision
                break
            blocks.append(block)
            parent = name
        return blocks

    def blocks_to_start(self, token_ids: Sequence[int], num_tokens: int) -> int:
        """Free blocks ``new_seq_with_prefix(token_ids)`` followed by ``append(num_tokens)`` would take:
        the blocks past the match, plus the matched ones that are cached free blocks now."""
        matched = self.match_prefix(token_ids)
        revived = sum(1 for b in matched if self._ref[b] == 0)
        return self.blocks_for(len(matched) * self.block_size + num_tokens) - len(matched) + revived

    def new_seq_with_prefix(self, token_ids: Sequence[int]) -> tuple[int, int]:
        """A sequence starting on the cached blocks of its longest matched prefix. Returns (seq id, tokens
        it already holds); counts ``prefix_queries`` (all of ``token_ids``) and ``prefix_hits``."""
        matched = self.match_prefix(token_ids)
        seq = self.new_seq()
        for block in matched:
            self.incref(block)
        n = len(matched) * self.block_size
        self.tables[seq], self.lengths[seq] = list(matched), n
        self.hashes[seq] = [self._key[b][0] for b in matched]
        self.prefix_queries += len(token_ids)
        self.prefix_hits += n
        return seq, n

    def cache_blocks(self, seq: int, token_ids: Sequence[int], num_computed: int) -> None:
        """Name the full blocks among the first ``num_computed`` tokens of ``seq`` (their K/V are written),
        so later sequences can reuse them. A name already held by another block keeps that block."""
        names, table, bs = self.hashes[self._check_seq(seq)], self.tables[seq], self.block_size
        for j in range(len(names), min(num_computed, self.lengths[seq]) // bs):
            parent = names[-1] if names else None
            tokens = tuple(token_ids[j * bs : (j + 1) * bs])
            name = block_hash(parent, tokens)
            names.append(name)
            block = table[j]
            if name not in self._cached and block not in self._key:
                self._cached[name] = block
                self._key[block] = (name, parent, tokens)

    def slot(self, seq: int, position: int) -> int:
        """Flat slot (block · block_size + offset) of token ``position`` of ``seq``."""
        block = self.tables[seq][position // self.block_size]
        return block * self.block_size + position % self.block_size

    # ------------------------------------------------------------ accounting
    def stats(self) -> BlockStats:
        fill: dict[int, int] = {}  # physical block → slots holding tokens (max over the sequences sharing it)
        for seq, table in self.tables.items():
            n = self.lengths[seq]
            for j, block in enumerate(table):
                fill[block] = max(fill.get(block, 0), min(self.block_size, n - j * self.block_size))
        logical = sum(len(t) for t in self.tables.values())
        return BlockStats(
            self.num_blocks, self.block_size, self.num_used, self.num_free, logical, sum(fill.values()), self.num_cached
        )

    def check_no_leaks(self) -> None:
        """With no live sequence, every block must be free or cached-evictable, with reference count 0."""
        if self.tables:
            raise AssertionError(f"{len(self.tables)} sequences are still live")
        held = [b for b in range(self.num_blocks) if self._ref[b]]
        if held or self.num_free != self.num_blocks:
            raise AssertionError(f"blocks still referenced with no live sequence: {held[:10]}")

    def utilisation(self) -> float:
        """Fraction of the pool's blocks in use."""
        return self.num_used / self.num_blocks


__all__ = ["BlockManager", "BlockStats", "OutOfBlocks", "block_hash", "cdiv"]
