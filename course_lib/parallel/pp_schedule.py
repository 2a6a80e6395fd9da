"""The GPipe schedule of pipeline parallelism, simulated, and its bubble arithmetic.

A model's layers are cut into p stages; a batch into m equal micro-batches. Like cooks on a line, a stage
is idle until the first dish reaches it (fill) and after the last one left it (drain): stage s runs
micro-batch j in time slot s + j, every stage is busy m of the m + p − 1 slots, and the idle share — the
*bubble* — is (p − 1)/(m + p − 1) (``bubble_fraction``). More micro-batches shrink it, but each is
smaller and less efficient. When each hand-off between stages takes t_comm, the first micro-batch's
delays each next stage once: ``bubble_with_comm``. ``gpipe_schedule`` simulates the schedule (no
processes) as a ``Timeline`` of ``Slot``s; a measured run (``course_lib.parallel.pp_measure``) fills the
same ``Timeline`` with wall-clock and CPU times, which ``Timeline.replayed`` re-times through the
simulation. Introduced in 07_parallelism.ipynb.

    tl = gpipe_schedule(p=4, m=8)                     # simulated: no processes, drawn instantly
    tl.bubble() == bubble_fraction(4, 8)              # 3/11
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Real


def check_count(name: str, value, minimum: int = 1) -> int:
    """``value`` if it is an int >= ``minimum``, else a ValueError naming ``name`` (stages, micro-batches, ...)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def bubble_fraction(p: int, m: int) -> float:
    """GPipe's idle share (p − 1)/(m + p − 1): p stages, m equal micro-batches, fill and drain once."""
    check_count("p (pipeline stages)", p)
    check_count("m (micro-batches)", m)
    return (p - 1) / (m + p - 1)


def _check_time(name: str, value, minimum_exclusive: bool = False):
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (minimum_exclusive and value == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if minimum_exclusive else '>= 0'}, got {value!r}")
    return value


def bubble_with_comm(p: int, m: int, t_stage, t_comm) -> float:
    """The bubble when each hand-off between stages takes ``t_comm`` (overlapped with the sender's next
    micro-batch, so paid once per stage boundary, in the fill): (p − 1)(t + c) / ((m + p − 1)·t + (p − 1)·c),
    t = ``t_stage`` the time of one micro-batch on one stage. c = 0 gives ``bubble_fraction``."""
    check_count("p (pipeline stages)", p)
    check_count("m (micro-batches)", m)
    t, c = _check_time("t_stage", t_stage, True), _check_time("t_comm", t_comm)
    return (p - 1) * (t + c) / ((m + p - 1) * t + (p - 1) * c)


@dataclass(frozen=True)
class Slot:
    """Stage ``stage`` worked on micro-batch ``micro`` from ``start`` to ``end`` (seconds from the common start);
    ``step`` 0 is the prefill, k ≥ 1 the k-th decode step."""

    stage: int
    micro: int
    start: float
    end: float
    step: int = 0
    cpu: float | None = None  # CPU seconds of the stage's main thread in the slot (measured runs, one torch
    # thread per stage, the default): less than end − start means the OS gave the core to someone else
    wait: float | None = None  # measured runs: when the stage began waiting for this slot's input (its
    # receive); ``start`` − ``wait`` is the time it sat blocked on the message


@dataclass
class Timeline:
    """Every slot of a pipelined run; ``bubble()`` = idle time / (stages × makespan)."""

    stages: int
    micro_batches: int
    slots: list[Slot] = field(default_factory=list)
    unit: str = "s"  # measured: seconds; simulated: whatever t_stage was given in

    @property
    def makespan(self):
        """From the first slot's start to the last slot's end."""
        if not self.slots:
            raise ValueError("an empty timeline has no makespan")
        return max(s.end for s in self.slots) - min(s.start for s in self.slots)

    def busy(self, stage: int):
        """Time stage ``stage`` spent working."""
        return sum((s.end - s.start for s in self.slots if s.stage == stage), 0)

    def bubble(self):
        """Idle share over all stages: 1 − busy / (stages × makespan). Exact for exact (int, Fraction) times."""
        total = self.stages * self.makespan
        idle = total - sum((self.busy(s) for s in range(self.stages)), 0)
        return idle / total

    def cpu_share(self) -> float:
        """CPU time / wall time inside the slots: ~1 when each stage had its core, lower when the OS gave it
        to another process (an oversubscribed machine stretches the bars and the measured bubble with them)."""
        if any(s.cpu is None for s in self.slots):
            raise ValueError("cpu_share needs measured slots (a simulated timeline has no CPU times)")
        return sum(s.cpu for s in self.slots) / sum(s.end - s.start for s in self.slots)

    def replayed(self, t_comm: float = 0.0) -> Timeline:
        """The same schedule re-timed with each slot's CPU time (``gpipe_schedule`` with measured durations):
        the run as it would go with a dedicated core per stage, and hand-offs that take ``t_comm`` (default:
        free). One-step timelines only."""
        if any(s.cpu is None for s in self.slots) or any(s.step for s in self.slots):
            raise ValueError("replayed needs the measured slots of one prefill (step 0 only)")
        cpu = {(s.stage, s.micro): s.cpu for s in self.slots}
        t = [[max(cpu[(st, j)], 1e-9) for j in range(self.micro_batches)] for st in range(self.stages)]
        replay = gpipe_schedule(self.stages, self.micro_batches, t, t_comm)
        replay.unit = "s"
        return replay

    def _slot_map(self) -> dict[tuple[int, int], Slot]:
        if any(s.step for s in self.slots):
            raise ValueError("needs the slots of one prefill (step 0 only): use only_step(0) first")
        return {(s.stage, s.micro): s for s in self.slots}

    def imbalance(self) -> float:
        """The busiest stage's busy time ÷ the mean stage's: 1 for equal stages, as the formula assumes (the
        last stage also runs the LM head, the first the embedding)."""
        busy = [self.busy(s) for s in range(self.stages)]
        return max(busy) * self.stages / sum(busy)

    def mean_slot(self) -> float:
        """Mean busy time of one micro-batch on one stage: the t of the formulas."""
        if not self.slots:
            raise ValueError("an empty timeline has no slots")
        return sum((s.end - s.start for s in self.slots), 0) / len(self.slots)

    def hops(self) -> dict[tuple[int, int], float]:
        """{(s, j): time from stage s finishing micro-batch j to stage s + 1 starting it}: the hand-off, plus
        queueing when stage s + 1 was still busy with j − 1."""
        slot = self._slot_map()
        return {
            (s, j): slot[(s + 1, j)].start - slot[(s, j)].end
            for s in range(self.stages - 1)
            for j in range(self.micro_batches)
        }

    def first_hop(self) -> float:
        """The hand-off time t_comm: the first micro-batch's hop, averaged over the stage boundaries (the next
        stage is idle, waiting for it, so there is no queueing in it); 0 for one stage."""
        if self.stages == 1:
            return 0.0
        hops = self.hops()
        return sum(hops[(s, 0)] for s in range(self.stages - 1)) / (self.stages - 1)

    def only_step(self, step: int) -> Timeline:
        """The slots of one step (0 = prefill) as a timeline of their own."""
        return Timeline(self.stages, self.micro_batches, [s for s in self.slots if s.step == step], self.unit)


def gpipe_schedule(p: int, m: int, t_stage: Real | Sequence = 1.0, t_comm: Real = 0) -> Timeline:
    """The GPipe forward schedule, simulated: stage s starts micro-batch j when stage s − 1 has finished it
    and its activations have arrived (``t_comm`` later), and stage s has finished j − 1. ``t_stage``: the time
    of one micro-batch on one stage — one number for all, one per stage (p numbers), or one per stage and
    micro-batch (p lists of m). With equal times and t_comm = 0 stage s runs j in slot s + j, and ``bubble()``
    equals ``bubble_fraction(p, m)`` (exactly, for exact numbers); with t_comm, ``bubble_with_comm``."""
    check_count("p (pipeline stages)", p)
    check_count("m (micro-batches)", m)
    _check_time("t_comm", t_comm)
    if isinstance(t_stage, Sequence):
        if len(t_stage) != p:
            raise ValueError(
                f"t_stage must be one time, one per stage ({p}) or p lists of m, got {len(t_stage)} entries"
            )
        rows = [list(r) if isinstance(r, Sequence) else [r] * m for r in t_stage]
    else:
        rows = [[t_stage] * m for _ in range(p)]
    if any(len(r) != m for r in rows):
        raise ValueError(f"each stage's list of times in t_stage must hold m={m} times")
    if not all(isinstance(t, Real) and not isinstance(t, bool) and t > 0 for r in rows for t in r):
        raise ValueError(f"t_stage times must be positive numbers, got {t_stage!r}")
    end = [[0] * m for _ in range(p)]
    slots = []
    for s in range(p):
        for j in range(m):
            start = max(end[s - 1][j] + t_comm if s else 0, end[s][j - 1] if j else 0)
            end[s][j] = start + rows[s][j]
            slots.append(Slot(s, j, start, end[s][j]))
    return Timeline(p, m, slots, unit="time units")


__all__ = ["Slot", "Timeline", "bubble_fraction", "bubble_with_comm", "gpipe_schedule"]
