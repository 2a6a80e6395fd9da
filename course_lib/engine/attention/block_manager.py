"""The block allocator behind PagedAttention: fixed-size KV blocks, a free list, reference counts, block tables.

A sequence's K/V no longer sits in one slab reserved for ``max_len`` tokens: it is cut into blocks of
``block_size`` token slots, taken from a shared pool only when the sequence grows into them. Sequence
*s* keeps a block table, ``table[j]`` = the physical block holding its tokens ``j·bs … (j+1)·bs − 1``,
so its waste is at most one partly filled block. Blocks carry reference counts: ``fork`` copies the
table, not the data (parallel sampling and beam search share the prompt), and the first write into a
shared, partly filled block copies it first (copy-on-write). Pure Python, no tensors: the backend
(``paged.py``) copies the K/V of the blocks this class tells it to. Shaped like nano-vllm's
``block_manager.py`` and vLLM's ``BlockSpaceManager``. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass


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

    @property
    def utilisation(self) -> float:
        """Fraction of the pool's blocks in use."""
        return self.used / self.num_blocks

    @property
    def fill(self) -> float:
        """Fraction of the used blocks' slots holding tokens (1 − internal fragmentation)."""
        return self.tokens / (self.used * self.block_size) if self.used else 1.0


def _positive_int(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """``num_blocks`` blocks of ``block_size`` slots (a power of two: slot → (block, offset) is a shift and a
    mask in a kernel). Low-level: ``allocate`` / ``incref`` / ``decref`` / ``free`` on block ids. Sequence
    level: ``new_seq`` / ``append`` / ``truncate`` / ``fork`` / ``free_seq`` on block tables."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        _positive_int("num_blocks", num_blocks)
        _positive_int("block_size", block_size)
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

    # ------------------------------------------------------------ blocks
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def ref_count(self, block: int) -> int:
        return self._ref[self._check_block(block)]

    def _check_block(self, block) -> int:
        if not isinstance(block, int) or isinstance(block, bool) or not 0 <= block < self.num_blocks:
            raise ValueError(f"block must be an int in [0, {self.num_blocks}), got {block!r}")
        return block

    def allocate(self) -> int:
        """A free block with reference count 1."""
        if not self._free:
            raise OutOfBlocks(f"need 1 block, 0 of {self.num_blocks} free")
        block = heapq.heappop(self._free)
        self._ref[block] = 1
        return block

    def incref(self, block: int) -> None:
        """One more holder of an allocated block (a forked sequence)."""
        if self._ref[self._check_block(block)] == 0:
            raise ValueError(f"incref of block {block}, which is free")
        self._ref[block] += 1

    def decref(self, block: int) -> bool:
        """Drop one holder; the block returns to the free list when none is left. True if it did."""
        if self._ref[self._check_block(block)] == 0:
            raise ValueError(f"double free: block {block} is already free")
        self._ref[block] -= 1
        if self._ref[block] == 0:
            heapq.heappush(self._free, block)
            return True
        return False

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
        self.tables[seq], self.lengths[seq] = [], 0
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

    def fork(self, seq: int) -> int:
        """A new sequence sharing every block of ``seq`` (reference counts + 1, no copy)."""
        table = self.tables[self._check_seq(seq)]
        child = self.new_seq()
        for block in table:
            self.incref(block)
        self.tables[child], self.lengths[child] = list(table), self.lengths[seq]
        return child

    def free_seq(self, seq: int) -> None:
        """Drop the sequence; its blocks go back unless another sequence still shares them."""
        for block in self.tables[self._check_seq(seq)]:
            self.decref(block)
        del self.tables[seq], self.lengths[seq]

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
        return BlockStats(self.num_blocks, self.block_size, self.num_used, self.num_free, logical, sum(fill.values()))

    def utilisation(self) -> float:
        """Fraction of the pool's blocks in use."""
        return self.num_used / self.num_blocks


__all__ = ["BlockManager", "BlockStats", "OutOfBlocks", "cdiv"]
