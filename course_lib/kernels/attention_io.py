"""Why FlashAttention is an SRAM argument: HBM bytes of standard and of tiled attention, per head.

Standard attention (Dao et al., *FlashAttention*, 2022, Algorithm 0) writes the n × n score matrix S to
HBM, reads it back for the softmax, writes P, and reads P again for P·V: Θ(n·d + n²) elements. Tiled
attention keeps a block of B query rows, its output accumulator, one block of B keys and values and the
B × B score tile in SRAM, and streams K and V past each query block (FlashAttention-2's loop order):
Q read once, O written once, K and V read ⌈n / B⌉ times. The block B is the largest that fits the SRAM,
(4·B·d + B²) elements ≤ SRAM, so the traffic falls as the SRAM grows: Dao et al.'s Theorem 2,
Θ(n²·d² / M). Forward pass only, one head, no causal skipping. Introduced in 00_setup_and_hardware.ipynb;
chapter 05 measures the kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course_lib.measure.costs import check_positive_int


@dataclass(frozen=True)
class AttentionTraffic:
    """HBM bytes of one attention head's forward pass, standard and tiled, for one SRAM size."""

    n: int
    head_dim: int
    sram_bytes: int
    block: int  # query/key rows per tile that fit in the SRAM
    standard_bytes: float
    tiled_bytes: float

    @property
    def saving(self) -> float:
        """standard ÷ tiled HBM bytes (> 1: tiling moves less)."""
        return self.standard_bytes / self.tiled_bytes


def standard_attention_bytes(n: int, head_dim: int, dtype_bytes: int = 2) -> float:
    """HBM bytes of Algorithm 0: read Q, K; write S; read S, write P; read P, V; write O."""
    check_positive_int("n", n)
    check_positive_int("head_dim", head_dim)
    return float((4 * n * head_dim + 4 * n * n) * dtype_bytes)


def tile_block(head_dim: int, sram_bytes: int, dtype_bytes: int = 2) -> int:
    """The largest B with (4·B·d + B²)·bytes ≤ SRAM: Q and O blocks, K and V blocks, the S tile."""
    check_positive_int("head_dim", head_dim)
    check_positive_int("sram_bytes", sram_bytes)
    elems = sram_bytes / dtype_bytes
    block = int((-4 * head_dim + math.sqrt(16 * head_dim**2 + 4 * elems)) / 2)
    if block < 1:
        raise ValueError(
            f"sram_bytes={sram_bytes} cannot hold one row of Q, O, K, V at head_dim={head_dim} "
            f"({(4 * head_dim + 1) * dtype_bytes} bytes needed)"
        )
    return block


def tiled_attention_bytes(n: int, head_dim: int, block: int, dtype_bytes: int = 2) -> float:
    """HBM bytes of tiled attention with ``block`` rows per tile: Q and O once, K and V ⌈n/block⌉ times."""
    check_positive_int("n", n)
    check_positive_int("block", block)
    passes = -(-n // block)
    return float((2 * n * head_dim + 2 * n * head_dim * passes) * dtype_bytes)


def attention_traffic(n: int, head_dim: int, sram_bytes: int, dtype_bytes: int = 2) -> AttentionTraffic:
    """Standard against tiled attention's HBM bytes for a sequence of ``n`` and an SRAM of ``sram_bytes``."""
    block = tile_block(head_dim, sram_bytes, dtype_bytes)
    return AttentionTraffic(
        n,
        head_dim,
        sram_bytes,
        block,
        standard_attention_bytes(n, head_dim, dtype_bytes),
        tiled_attention_bytes(n, head_dim, block, dtype_bytes),
    )
