"""The trace's own bound on what continuous batching can gain over static batching: decode steps counted from
the answer lengths alone, as if a step cost the same whatever its rows (a free row, no prefill, no
fixed-cost dilution). Static batching takes the requests in arrival order ``slots`` at a time and each batch
lasts as long as its longest answer; continuous batching gives each freed slot to the next request in order
(list scheduling), so it needs about Σ lengths / slots steps, but never fewer than the longest answer.
The ratio of the two is the most a step-bound server can gain; a per-row cost, prefill and a tail of
arrivals take from it. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import heapq
from dataclasses import dataclass


def _check(lengths, slots: int) -> list[int]:
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be an int ≥ 1 (max_num_seqs), got {slots!r}")
    out = list(lengths)
    if not out or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in out):
        raise ValueError(f"lengths must be a non-empty list of ints ≥ 1 (tokens per answer), got {lengths!r}")
    return out


def static_decode_steps(lengths, slots: int) -> int:
    """Steps of static batching: consecutive groups of ``slots`` requests, each lasting its longest answer."""
    lengths = _check(lengths, slots)
    return sum(max(lengths[i : i + slots]) for i in range(0, len(lengths), slots))


def continuous_decode_steps(lengths, slots: int) -> int:
    """Steps of continuous batching with every request waiting: each freed slot takes the next request at
    once (FIFO list scheduling); the makespan is the step at which the last slot falls free."""
    lengths = _check(lengths, slots)
    free_at = [0] * min(slots, len(lengths))  # step at which each slot falls free
    for n in lengths:
        heapq.heappush(free_at, heapq.heappop(free_at) + n)
    return max(free_at)


@dataclass(frozen=True)
class StepBound:
    """Decode steps each policy needs on a trace's answer lengths, and their ratio (the bound on the gain)."""

    static: int
    continuous: int
    slots: int
    requests: int

    @property
    def ratio(self) -> float:
        return self.static / self.continuous

    def describe(self) -> str:
        return (
            f"{self.requests} answers, {self.slots} slots: static batching needs {self.static:,} decode steps, "
            f"continuous {self.continuous:,} → at most {self.ratio:.2f}× (the trace's bound, free rows)"
        )


def step_bound(trace, slots: int) -> StepBound:
    """The bound for a ``serving.traces.Trace`` (its requests' ``max_new_tokens``, in arrival order)."""
    lengths = [int(r.max_new_tokens) for r in trace.requests]
    return StepBound(static_decode_steps(lengths, slots), continuous_decode_steps(lengths, slots), slots, len(lengths))


def share_of_bound(gain: float, bound: float) -> float:
    """How much of the trace's bound a measured gain recovered: (gain − 1) / (bound − 1); 1 = all of it,
    0 = no gain, above 1 = more than fewer steps can explain (the baseline was handicapped)."""
    for name, v in (("gain", gain), ("bound", bound)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name} must be a positive ratio, got {v!r}")
    if bound <= 1:
        raise ValueError(f"bound must exceed 1 (a trace where static batching wastes steps), got {bound!r}")
    return (gain - 1) / (bound - 1)
