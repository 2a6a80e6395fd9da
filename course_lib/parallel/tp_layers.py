"""The Megatron-LM parallel linear layers: column-parallel (no communication) and row-parallel (one all-reduce).

Tensor parallelism (Shoeybi et al. 2019) splits a layer's weights over p ranks so that each reads 1/p of
them per step. A *column-parallel* layer keeps its rank's slice of the output features: the input is
replicated and nothing is communicated. A *row-parallel* layer keeps its slice of the input features:
each rank computes a partial sum of the whole output and ONE all-reduce adds them. A column-parallel
layer followed by a row-parallel one (qkv → o, gate_up → down) thus costs one all-reduce of (N, D). Both
sit on the engine's linear seam (``course_lib.engine.layers.Linear``) and keep the kernel choice
(skinny or reference) of the layer they replace. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.engine.layers import Linear, SkinnyLinear
from course_lib.parallel.tp_comm import Comm


def take_rows(weight: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
    """The rows [start, stop) of each range, concatenated into a new tensor (own memory: the full weight
    can be freed). A fused (Σ out, in) weight is cut per part (q | k | v): one slice of the whole would give
    rank 0 all of q."""
    for start, stop in ranges:
        if not 0 <= start < stop <= weight.shape[0]:
            raise ValueError(f"row range [{start}, {stop}) is not inside the {weight.shape[0]} rows of the weight")
    if ranges[0][0] == 0 and ranges[-1][1] == weight.shape[0] and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])):
        return weight  # every row in order (world_size 1): share it, copy nothing
    return torch.cat([weight[start:stop] for start, stop in ranges], dim=0).contiguous()  # (Σ rows, in)


def shard_rows(weight: torch.Tensor, segments: list[int], rank: int, world_size: int) -> torch.Tensor:
    """Rows of each segment of a fused weight (e.g. q | k | v), rank's 1/p of each, concatenated."""
    if sum(segments) != weight.shape[0]:
        raise ValueError(f"segments {segments} do not add up to the {weight.shape[0]} rows of the weight")
    if world_size == 1:
        return weight
    ranges, start = [], 0
    for size in segments:
        if size % world_size:
            raise ValueError(f"a segment of {size} rows cannot be split over world_size={world_size}")
        step = size // world_size
        ranges.append((start + rank * step, start + (rank + 1) * step))  # (out/p, in) of this segment
        start += size
    return take_rows(weight, ranges)


def _local(weight: torch.Tensor, bias: torch.Tensor | None, like: Linear) -> Linear:
    """The rank's own matmul, with the same kernel choice as the layer it replaces (skinny or reference)."""
    return SkinnyLinear(weight, bias) if isinstance(like, SkinnyLinear) else Linear(weight, bias)


class ColumnParallelLinear(Linear):
    """Y_r = X W_rᵀ with W_r this rank's (out/p, in) rows: the input is replicated, nothing is communicated."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, like: Linear | None = None) -> None:
        super().__init__(weight, bias)  # (out/p, in)
        self.local = _local(weight, bias, like or self)

    @classmethod
    def from_linear(
        cls, lin: Linear, rank: int, world_size: int, segments: list[int] | None = None
    ) -> ColumnParallelLinear:
        """Shard a (fused) layer; ``segments`` are the row counts of its fused parts (default: one part)."""
        segments = segments or [lin.out_features]
        bias = None if lin.bias is None else shard_rows(lin.bias[:, None], segments, rank, world_size)[:, 0]
        return cls(shard_rows(lin.weight, segments, rank, world_size), bias, like=lin)

    @classmethod
    def from_rows(cls, lin: Linear, ranges: list[tuple[int, int]]) -> ColumnParallelLinear:
        """Keep the given output rows (e.g. ``RankShard.qkv_rows``: a replicated KV head is not an even split)."""
        bias = None if lin.bias is None else take_rows(lin.bias[:, None], ranges)[:, 0]
        return cls(take_rows(lin.weight, ranges), bias, like=lin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, in), replicated → (N, out/p), this rank's output features."""
        return self.local(x)


class RowParallelLinear(Linear):
    """Y = Σ_r X_r W_rᵀ with W_r this rank's (out, in/p) columns: a partial sum per rank, ONE all-reduce."""

    def __init__(
        self, weight: torch.Tensor, comm: Comm, bias: torch.Tensor | None = None, like: Linear | None = None
    ) -> None:
        super().__init__(weight, bias)  # (out, in/p); the bias is added once, after the reduction
        self.comm = comm
        self.local = _local(weight, None, like or self)

    @classmethod
    def from_linear(cls, lin: Linear, rank: int, world_size: int, comm: Comm) -> RowParallelLinear:
        if lin.in_features % world_size:
            raise ValueError(f"in_features={lin.in_features} cannot be split over world_size={world_size}")
        step = lin.in_features // world_size
        weight = lin.weight if world_size == 1 else lin.weight[:, rank * step : (rank + 1) * step].contiguous()
        return cls(weight, comm, lin.bias, like=lin)

    @classmethod
    def from_columns(cls, lin: Linear, columns: tuple[int, int], comm: Comm) -> RowParallelLinear:
        """Keep the input columns [start, stop) (e.g. ``RankShard.o_columns``: the outputs of this rank's heads)."""
        start, stop = columns
        if not 0 <= start < stop <= lin.in_features:
            raise ValueError(f"column range [{start}, {stop}) is not inside the {lin.in_features} input features")
        whole = (start, stop) == (0, lin.in_features)  # world_size 1: share the weight, copy nothing
        return cls(lin.weight if whole else lin.weight[:, start:stop].contiguous(), comm, lin.bias, like=lin)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, in/p), this rank's input features → (N, out): this rank's share of the sum, no bias."""
        return self.local(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, in/p) → (N, out), the full result on every rank."""
        y = self.comm.all_reduce(self.partial(x))  # (N, out)
        return y if self.bias is None else y + self.bias


__all__ = ["ColumnParallelLinear", "RowParallelLinear", "shard_rows", "take_rows"]
