"""The collectives of tensor and sequence parallelism, each timed and counted, and the bytes they should send.

``Comm`` wraps the three collectives TP and SP call — all-reduce, all-gather and reduce-scatter over
tokens — with a timer and a byte counter per op (``OpStats``), so a run reports what it sent and how
long it waited; ``tp_comm_bytes`` predicts those bytes from the ring model for one forward (TP: two
all-reduces of (N, D) per layer; SP: as many reduce-scatter + all-gather pairs, which move exactly the
bytes of the all-reduces they replace). A decode step's messages are a few KB: latency-bound, whatever
the link. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

REDUCE_SCATTER_METHODS = ("auto", "native", "all_to_all", "all_reduce")


@dataclass
class OpStats:
    """What one kind of collective cost on this rank since the last ``reset``."""

    calls: int = 0
    payload_bytes: int = 0  # size of the full (N, D) tensor being reduced / gathered, summed over calls
    sent_bytes: float = 0.0  # what a ring algorithm sends per rank: all-reduce 2(p−1)/p·S, RS and AG (p−1)/p·S
    seconds: float = 0.0  # wall time inside the blocking call (includes waiting for the slower rank)


@dataclass
class Comm:
    """The three collectives TP and SP need, each wrapped with a timer and a byte counter.

    ``reduce_scatter``: "native" (``dist.reduce_scatter_tensor``; gloo has it from torch 2.x), "all_to_all"
    (each rank sends shard j of its partial sums to rank j and adds what it receives: the same (p−1)/p·S
    bytes as a ring reduce-scatter), "all_reduce" (all-reduce, then keep my rows: correct but twice the
    bytes) or "auto" (native, falling back to all_to_all where the backend lacks it). With
    ``world_size == 1`` every collective is the identity and nothing is sent.
    """

    rank: int
    world_size: int
    group: object = None
    reduce_scatter: str = "auto"
    timed: bool = True
    stats: dict[str, OpStats] = field(default_factory=dict)
    trace: list | None = (
        None  # set to [] to record (op, start, end) of every call (perf_counter: one clock for all ranks)
    )

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {self.world_size!r}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {self.rank!r}")
        if self.reduce_scatter not in REDUCE_SCATTER_METHODS:
            raise ValueError(f"reduce_scatter must be one of {REDUCE_SCATTER_METHODS}, got {self.reduce_scatter!r}")
        self.reset()

    def reset(self) -> None:
        self.stats = {op: OpStats() for op in ("all_reduce", "reduce_scatter", "all_gather")}

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stats.values())

    @property
    def sent_bytes(self) -> float:
        return sum(s.sent_bytes for s in self.stats.values())

    def _record(self, op: str, t0: float, x: torch.Tensor, payload: int, sent_factor: float) -> None:
        if x.is_cuda:
            torch.cuda.synchronize(x.device)  # the collective was launched, not finished
        s = self.stats[op]
        t1 = time.perf_counter()
        s.calls += 1
        s.seconds += t1 - t0
        if self.trace is not None:
            self.trace.append((op, t0, t1))
        s.payload_bytes += payload
        s.sent_bytes += sent_factor * payload

    def _start(self, x: torch.Tensor) -> float:
        if x.is_cuda:
            torch.cuda.synchronize(x.device)  # do not bill the collective for the matmul before it
        return time.perf_counter()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over ranks, in place; returns x. Ring model: 2(p−1)/p · bytes(x) sent per rank."""
        p = self.world_size
        if p == 1:
            return x
        import torch.distributed as dist

        t0 = self._start(x)
        dist.all_reduce(x, group=self.group)
        self._record("all_reduce", t0, x, x.numel() * x.element_size(), 2 * (p - 1) / p)
        return x

    def all_gather_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's (n, ...) rows → every rank's, stacked in rank order: (p·n, ...). (p−1)/p · output sent."""
        p = self.world_size
        if p == 1:
            return x
        import torch.distributed as dist

        t0 = self._start(x)
        out = x.new_empty(p * x.shape[0], *x.shape[1:])  # (p·n, D)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.1x
        gather(out, x.contiguous(), group=self.group)
        self._record("all_gather", t0, x, out.numel() * out.element_size(), (p - 1) / p)
        return out

    def reduce_scatter_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Partial sums (p·n, ...) → the summed rows ``rank·n : (rank+1)·n`` of this rank: (n, ...)."""
        p = self.world_size
        if p == 1:
            return x
        if x.shape[0] % p:
            raise ValueError(f"reduce_scatter_tokens needs a row count divisible by world_size={p}, got {x.shape[0]}")
        import torch.distributed as dist

        n = x.shape[0] // p
        x = x.contiguous()
        payload = x.numel() * x.element_size()
        t0 = self._start(x)
        method = self.reduce_scatter
        if method in ("auto", "native"):
            out = x.new_empty(n, *x.shape[1:])
            try:
                scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
                scatter(out, x, group=self.group)
            except (RuntimeError, NotImplementedError):  # a backend without it fails on every rank, before sending
                if method == "native":
                    raise
                self.reduce_scatter = method = "all_to_all"
        if method == "all_to_all":
            recv = torch.empty_like(x)  # (p·n, D): block j = rank j's partial sums of MY rows
            dist.all_to_all_single(recv, x, group=self.group)
            out = recv.view(p, n, *x.shape[1:]).sum(0)  # (n, D)
        elif method == "all_reduce":
            dist.all_reduce(x, group=self.group)
            out = x[self.rank * n : (self.rank + 1) * n]
        factor = 2 * (p - 1) / p if method == "all_reduce" else (p - 1) / p
        self._record("reduce_scatter", t0, x, payload, factor)
        return out


def tp_comm_bytes(
    hidden_size: int, num_layers: int, num_tokens: int, world_size: int, sequence_parallel: bool = False, elem: int = 4
) -> dict[str, float]:
    """Predicted ring bytes sent per rank in one forward of ``num_tokens`` tokens, and rows normed per rank.

    TP: 2 all-reduces of (N, D) per layer, each 2(p−1)/p·N·D·elem. SP: the same count of reduce-scatters
    and all-gathers over the padded p·⌈N/p⌉ rows, each (p−1)/p of that: RS + AG = one all-reduce. The norms
    run on N rows per rank under TP and ⌈N/p⌉ under SP. (The head's (M, D) assembly under SP is extra.)
    """
    p, L, D = world_size, num_layers, hidden_size
    if sequence_parallel and num_tokens >= p:
        rows = p * -(-num_tokens // p)
        one = (p - 1) / p * rows * D * elem
        return {
            "reduce_scatter": 2 * L * one,
            "all_gather": 2 * L * one,
            "all_reduce": 0.0,
            "rows_normed": 2 * L * rows // p,
        }
    return {
        "reduce_scatter": 0.0,
        "all_gather": 0.0,
        "all_reduce": 2 * L * 2 * (p - 1) / p * num_tokens * D * elem,
        "rows_normed": 2 * L * num_tokens,
    }


__all__ = ["REDUCE_SCATTER_METHODS", "Comm", "OpStats", "tp_comm_bytes"]
