"""Pipeline parallelism in steady-state decode: micro-batches in flight across steps, measured on the stages.

A serving engine does not fill and drain the pipeline for every decode step (that is the one-batch GPipe
bubble of ``pp_schedule``, which a prefill pays once): micro-batch j's next step starts on stage 0 as soon
as its token is back from the last stage, while the other micro-batches are still in the pipe. In the
steady state a stage works m · t per round (t: one micro-batch on one stage) and one micro-batch's round
trip takes p · (t + c) (c: one hand-off), so the idle share is 1 − m·t / max(m·t, p·(t + c)): with m = 1
on 2 stages 0.5 by construction (one stage works while the other waits), and from m ≥ p(t + c)/t on none — with equal stages. Unequal ones (the last carries the LM head and the
sampling) idle 1 − m·mean(t_s) / max(m·max(t_s), Σ(t_s + c)) (``steady_idle_stages``, the prediction the
rows use): the lighter stages wait for the busiest one whatever m is.
Each sequence still gets one token per round, so pipelining never lowers the time per output token (TPOT)
below one pass through every stage. ``decode_rows`` reads the decode steps of ``measure_bubble``'s
("decode", m) timelines — dropping the prefill, the first decode step (the fill) and the last (the drain)
— into measured idle share, the prediction from the measured t and c, TPOT and tokens per second, and
traces where the idle time went: how long each stage sat blocked on a receive, what share of the span both
stages computed at once (``overlap``: near 1 when the pipeline is full), the CPU share inside the slots,
and ``replay_decode``, the same run re-timed with each slot's CPU time under decode's dependencies (stage
s + 1 takes micro-batch j after stage s, stage 0 takes j's next step after its token is back from the
last stage), as it would go with a core per stage. ``idle_cause`` names the cause of a miss from these
numbers. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from course_lib.parallel.pp_schedule import Slot, Timeline


def steady_idle(p: int, m: int, t_slot: float, t_comm: float) -> float:
    """Predicted idle share of a stage in steady-state decode, equal stages: 1 − m·t / max(m·t, p·(t + c))."""
    if t_slot <= 0 or t_comm < 0:
        raise ValueError(f"t_slot must be > 0 and t_comm >= 0, got {t_slot!r}, {t_comm!r}")
    return 1 - m * t_slot / max(m * t_slot, p * (t_slot + t_comm))


def steady_idle_stages(m: int, t_stages, t_comm: float) -> float:
    """Predicted mean idle share of the stages in steady-state decode when they take unequal times t_s.

    A round lasts R = max(m · max_s t_s, Σ_s (t_s + c)): the busiest stage's m slots, or one micro-batch's
    round trip through every stage, whichever is longer. Stage s works m · t_s of it, so the stages idle
    1 − m · mean(t_s) / R on average. With equal stages this is ``steady_idle``; with unequal ones it never
    reaches 0: the lighter stages wait for the busiest one whatever m is (1 − mean/max at large m) — the
    last stage of a language model carries the LM head and the sampling, so its stages are never equal."""
    ts = [float(t) for t in t_stages]
    if not ts or min(ts) <= 0 or t_comm < 0 or m < 1:
        raise ValueError(
            f"t_stages must be positive seconds per stage, t_comm >= 0 and m >= 1, got {t_stages!r}, {t_comm!r}, {m!r}"
        )
    rnd = max(m * max(ts), sum(ts) + len(ts) * t_comm)
    return 1 - m * (sum(ts) / len(ts)) / rnd


@dataclass(frozen=True)
class DecodeRow:
    """One m of steady-state pipelined decode, measured on the stages."""

    m: int
    idle: float  # measured: 1 − busy / Σ stage spans over the steady-state steps (each stage's whole rounds)
    predicted: float  # steady_idle_stages(m, t_stages, t_comm): the measured per-stage t_s and c
    t_slot: float  # mean seconds of one micro-batch on one stage (decode)
    t_comm: float  # mean hand-off: next stage's start − this stage's end, where the next stage sat idle waiting
    tpot: float  # median seconds between a sequence's successive tokens (last stage, same micro-batch)
    tokens_per_s: float  # tokens the batch gained per second over the steady-state steps
    steps: int  # steady-state steps the row is measured on
    blocked: float = 0.0  # share of the stages' span spent blocked in a receive's wait (Slot.wait → start)
    overlap: float = 0.0  # share of the steady span in which every stage was computing at once
    cpu_share: float = 1.0  # CPU time / wall time inside the steady slots (< 1: the OS ran another program)
    replay_idle: float = float("nan")  # replay_decode's idle: the run with a core per stage, hops of t_comm
    replay_free: float = float("nan")  # ... with free hops: the schedule and the measured CPU work alone
    t_stages: tuple = ()  # mean seconds of one micro-batch on each stage (decode), stage 0 first
    outside: float = 0.0  # share of the span neither inside a slot nor blocked in a receive (idle − blocked)
    equal_stages: float = float("nan")  # steady_idle(p, m, t_slot, t_comm): the prediction if stages were equal

    @property
    def imbalance(self) -> float:
        """The busiest stage's slot time over the mean stage's (1: equal stages)."""
        return max(self.t_stages) / (sum(self.t_stages) / len(self.t_stages)) if self.t_stages else 1.0


def _steady(tl: Timeline) -> list:
    steps = sorted({s.step for s in tl.slots if s.step > 0})
    if len(steps) < 3:
        raise ValueError(
            "a decode timeline needs at least 3 decode steps (fill, steady state, drain): more decode_tokens"
        )
    keep = set(steps[1:-1])
    return [s for s in tl.slots if s.step in keep]


def replay_decode(tl: Timeline, t_comm: float = 0.0) -> Timeline:
    """``tl`` re-timed with each slot's CPU time under decode's dependencies, each hand-off ``t_comm``: every
    stage keeps its measured order of work, starts a slot when it is free and the slot's input has arrived
    (stage s − 1's slot of the same step and micro-batch; on stage 0, the last stage's slot of the previous
    step). A core per stage and nothing else running: the pipeline as the schedule alone allows it."""
    if any(s.cpu is None for s in tl.slots):
        raise ValueError("replay_decode needs measured slots (with CPU times)")
    p = tl.stages
    order = {st: sorted((s for s in tl.slots if s.stage == st), key=lambda s: s.start) for st in range(p)}
    end, free, out = {}, [0.0] * p, []
    pos = [0] * p
    keys = {(s.stage, s.step, s.micro) for s in tl.slots}
    while any(pos[st] < len(order[st]) for st in range(p)):
        moved = False
        for st in range(p):
            while pos[st] < len(order[st]):
                s = order[st][pos[st]]
                if st:
                    dep = (st - 1, s.step, s.micro)
                elif s.step and p > 1:
                    dep = (p - 1, s.step - 1, s.micro)
                else:
                    dep = None
                if dep not in keys:
                    dep = None  # its input came from before the timeline (a decode-only run's first step)
                if dep is not None and dep not in end:
                    break  # its input is not computed yet: let the other stages advance
                start = max(free[st], end[dep] + t_comm if dep is not None else 0.0)
                end[(st, s.step, s.micro)] = free[st] = start + max(s.cpu, 1e-9)
                out.append(Slot(st, s.micro, start, free[st], s.step, s.cpu, start))
                pos[st] += 1
                moved = True
        if not moved:
            raise ValueError("the timeline's slots depend on each other in a cycle: not a pipelined run")
    return Timeline(p, tl.micro_batches, sorted(out, key=lambda s: s.start))


def _overlap(slots, p: int, lo: float, hi: float) -> float:
    """Share of [lo, hi] in which all p stages were inside a slot at once (sweep over the slot edges)."""
    events = sorted([(s.start, s.stage, 1) for s in slots] + [(s.end, s.stage, -1) for s in slots])
    inside, both, last = [0] * p, 0.0, lo
    for t, st, d in events:
        t = min(max(t, lo), hi)
        if all(inside):
            both += t - last
        last = t
        inside[st] += d
    return both / (hi - lo) if hi > lo else 0.0


def idle_cause(row: DecodeRow) -> str:
    """Why a steady-state row idled more than predicted, from its own numbers: the schedule (the replay with a
    core per stage idles as much), the machine (CPU/wall inside the slots well below 1: the stages' slots
    stretched while another program held the cores), or waiting on messages."""
    core = (
        f"with a core per stage the measured work idles {row.replay_free:.2f} with free hand-offs and "
        f"{row.replay_idle:.2f} with this run's {row.t_comm * 1e3:.2f} ms ones"
    )
    if row.replay_free >= row.idle - 0.05:
        if row.replay_free > row.predicted + 0.05:
            return (
                f"the schedule itself, through slot-to-slot variation: {core}, above the {row.predicted:.2f} that "
                f"the stages' mean times predict (busiest stage {row.imbalance:.2f}× the mean): slots that vary "
                "from one step to the next leave the next stage waiting even where the means balance"
            )
        return (
            f"the schedule itself: {core} (the busiest stage is {row.imbalance:.2f}× the mean, and m = {row.m} "
            "micro-batches may be too few to cover a round trip)"
        )
    if row.cpu_share < 0.8:
        return (
            f"the machine, not the schedule: {core}, but inside the slots the stages got only {row.cpu_share:.2f} "
            f"of a core each (CPU/wall), and both stages computed at once {row.overlap:.0%} of the time: the other "
            "programs on the cores, not the pipeline, set the pace (a hand-off waits for the receiving process to "
            "be scheduled, too)"
        )
    if row.replay_idle >= row.idle - 0.05:
        return f"the hand-offs: {core}; a round trip of p·(t + c) outlasts the m·t of work per round"
    waited = max(row.blocked - row.replay_idle, 0.0)  # blocked beyond what the schedule's own waits explain
    split = (
        f"the stages idled {row.idle:.2f} of the span against the replay's {row.replay_idle:.2f} with a core per "
        f"stage; beyond it, {waited:.2f} more was spent blocked in receives and {row.outside:.2f} outside any slot "
        "and any wait"
    )
    if row.outside >= waited:
        return (
            f"time between the slots: {split} — the Python that hands each result on and, with fewer free cores "
            f"than processes, the OS running the other rank or the notebook (CPU/wall inside the slots "
            f"{row.cpu_share:.2f})"
        )
    return f"waiting on messages: {split} — a message waits for the receiving process to be scheduled"


def decode_row(tl: Timeline, batch: int, replay: bool = True) -> DecodeRow:
    """The steady state of one ("decode", m) timeline of ``measure_bubble`` serving ``batch`` sequences."""
    slots = _steady(tl)
    p, m = tl.stages, tl.micro_batches
    first = min(s.step for s in slots)
    spans = []  # per stage: from its last slot before the steady steps to its last steady slot (whole rounds)
    for st in range(p):
        before = [s.end for s in tl.slots if s.stage == st and s.step < first]
        mine = [s for s in slots if s.stage == st]
        spans.append(max(s.end for s in mine) - (max(before) if before else min(s.start for s in mine)))
    span = sum(spans) / p
    busy = sum(s.end - s.start for s in slots)
    t_slot = busy / len(slots)
    t_stages = tuple(statistics.mean(s.end - s.start for s in slots if s.stage == st) for st in range(p))
    by = {(s.stage, s.step, s.micro): s for s in tl.slots}
    free_at = {}  # (stage, step, micro) -> when that stage finished its slot before this one
    for st in range(p):
        mine = sorted((s for s in tl.slots if s.stage == st), key=lambda s: s.start)
        for a, b in zip(mine, mine[1:]):
            free_at[(st, b.step, b.micro)] = a.end

    def delay(src, key):  # (the wait beyond the receiving stage's own queue, whether that stage sat idle)
        dst = by[key]
        idle = free_at.get(key, src.end) <= src.end  # it waited for this very message: the hop is the hand-off
        return max(dst.start - max(src.end, free_at.get(key, src.end)), 0.0), idle

    hops = [
        delay(s, (s.stage + 1, s.step, s.micro))
        for s in slots
        if s.stage + 1 < p and (s.stage + 1, s.step, s.micro) in by
    ]
    hops += [  # the token's trip from the last stage to stage 0, for the next step
        delay(s, (0, s.step + 1, s.micro)) for s in slots if s.stage == p - 1 and (0, s.step + 1, s.micro) in by
    ]
    clean = [d for d, idle in hops if idle]  # hops no queue hid: the hand-off time itself
    t_comm = statistics.mean(clean or [d for d, _ in hops]) if hops else 0.0
    ends = {}
    for s in tl.slots:
        if s.stage == p - 1 and s.step > 0:
            ends.setdefault(s.micro, []).append((s.step, s.end))
    gaps = [b - a for v in ends.values() for (_, a), (_, b) in zip(sorted(v), sorted(v)[1:])]
    steps = len({s.step for s in slots})
    lo, hi = min(s.start for s in slots), max(s.end for s in slots)
    blocked = sum(s.start - s.wait for s in slots if s.wait is not None) / (p * span)
    measured = all(s.cpu is not None for s in tl.slots)
    cpu_share = sum(s.cpu for s in slots) / busy if measured else 1.0
    go = replay and measured
    replay_idle = decode_row(replay_decode(tl, t_comm), batch, False).idle if go else float("nan")
    replay_free = decode_row(replay_decode(tl, 0.0), batch, False).idle if go else float("nan")
    return DecodeRow(
        m,
        1 - busy / (p * span),
        steady_idle_stages(m, t_stages, t_comm),
        t_slot,
        t_comm,
        statistics.median(gaps),
        batch * steps / span,
        steps,
        blocked,
        _overlap(slots, p, lo, hi),
        cpu_share,
        replay_idle,
        replay_free,
        t_stages=t_stages,
        equal_stages=steady_idle(p, m, t_slot, t_comm),
        outside=max(1 - busy / (p * span) - blocked, 0.0),
    )


def decode_rows(runs: dict, batch: int) -> list[DecodeRow]:
    """One ``DecodeRow`` per ("decode", m) timeline of ``measure_bubble(..., decode_tokens=...)``."""
    tls = {k[1]: v for k, v in runs.items() if isinstance(k, tuple) and k[0] == "decode"}
    if not tls:
        raise ValueError("runs holds no decode timelines: call measure_bubble with decode_tokens >= 4")
    return [decode_row(tls[m], batch) for m in sorted(tls)]


def format_decode_rows(rows) -> str:
    head = (
        f"{'m':>3}{'idle':>7}{'predicted':>11}{'equal':>7}{'replay':>8}{'c = 0':>7}{'stage ms':>13}{'hop ms':>8}"
        f"{'TPOT ms':>9}{'tok/s':>8}{'blocked':>9}{'outside':>9}{'overlap':>9}{'CPU/wall':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        st = "/".join(f"{t * 1e3:.2f}" for t in r.t_stages) if r.t_stages else f"{r.t_slot * 1e3:.2f}"
        lines.append(
            f"{r.m:>3}{r.idle:>7.2f}{r.predicted:>11.2f}{r.equal_stages:>7.2f}{r.replay_idle:>8.2f}{r.replay_free:>7.2f}"
            f"{st:>13}{r.t_comm * 1e3:>8.2f}{r.tpot * 1e3:>9.2f}{r.tokens_per_s:>8.0f}{r.blocked:>9.2f}{r.outside:>9.2f}{r.overlap:>9.2f}"
            f"{r.cpu_share:>10.2f}"
        )
    return "\n".join(lines)


__all__ = [
    "DecodeRow",
    "decode_row",
    "decode_rows",
    "format_decode_rows",
    "idle_cause",
    "replay_decode",
    "steady_idle",
    "steady_idle_stages",
]
