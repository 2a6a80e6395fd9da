"""Pipeline parallelism in steady-state decode: micro-batches in flight across steps, measured on the stages.

A serving engine does not fill and drain the pipeline for every decode step (that is the one-batch GPipe
bubble of ``pp_schedule``, which a prefill pays once): micro-batch j's next step starts on stage 0 as soon
as its token is back from the last stage, while the other micro-batches are still in the pipe. In the
steady state a stage works m · t per round (t: one micro-batch on one stage) and one micro-batch's round
trip takes p · (t + c) (c: one hand-off), so the idle share is 1 − m·t / max(m·t, p·(t + c)): with m = 1
on 2 stages 0.5 by construction (one stage works while the other waits), and from m ≥ p(t + c)/t on none.
Each sequence still gets one token per round, so pipelining never lowers the time per output token (TPOT)
below one pass through every stage. ``decode_rows`` reads the decode steps of ``measure_bubble``'s
("decode", m) timelines — dropping the prefill, the first decode step (the fill) and the last (the drain)
— into measured idle share, the prediction from the measured t and c, TPOT and tokens per second.
Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from course_lib.parallel.pp_schedule import Timeline


def steady_idle(p: int, m: int, t_slot: float, t_comm: float) -> float:
    """Predicted idle share of a stage in steady-state decode: 1 − m·t / max(m·t, p·(t + c))."""
    if t_slot <= 0 or t_comm < 0:
        raise ValueError(f"t_slot must be > 0 and t_comm >= 0, got {t_slot!r}, {t_comm!r}")
    return 1 - m * t_slot / max(m * t_slot, p * (t_slot + t_comm))


@dataclass(frozen=True)
class DecodeRow:
    """One m of steady-state pipelined decode, measured on the stages."""

    m: int
    idle: float  # measured: 1 − busy / Σ stage spans over the steady-state steps (each stage's whole rounds)
    predicted: float  # steady_idle(p, m, t_slot, t_comm) from the measured t and c
    t_slot: float  # mean seconds of one micro-batch on one stage (decode)
    t_comm: float  # mean hand-off: next stage's start − this stage's end, where the next stage sat idle waiting
    tpot: float  # median seconds between a sequence's successive tokens (last stage, same micro-batch)
    tokens_per_s: float  # tokens the batch gained per second over the steady-state steps
    steps: int  # steady-state steps the row is measured on


def _steady(tl: Timeline) -> list:
    steps = sorted({s.step for s in tl.slots if s.step > 0})
    if len(steps) < 3:
        raise ValueError(
            "a decode timeline needs at least 3 decode steps (fill, steady state, drain): more decode_tokens"
        )
    keep = set(steps[1:-1])
    return [s for s in tl.slots if s.step in keep]


def decode_row(tl: Timeline, batch: int) -> DecodeRow:
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
    return DecodeRow(
        m,
        1 - busy / (p * span),
        steady_idle(p, m, t_slot, t_comm),
        t_slot,
        t_comm,
        statistics.median(gaps),
        batch * steps / span,
        steps,
    )


def decode_rows(runs: dict, batch: int) -> list[DecodeRow]:
    """One ``DecodeRow`` per ("decode", m) timeline of ``measure_bubble(..., decode_tokens=...)``."""
    tls = {k[1]: v for k, v in runs.items() if isinstance(k, tuple) and k[0] == "decode"}
    if not tls:
        raise ValueError("runs holds no decode timelines: call measure_bubble with decode_tokens >= 4")
    return [decode_row(tls[m], batch) for m in sorted(tls)]


def format_decode_rows(rows) -> str:
    head = f"{'m':>3}{'idle':>7}{'predicted':>11}{'slot ms':>9}{'hop ms':>8}{'TPOT ms':>9}{'tok/s':>8}{'steps':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.m:>3}{r.idle:>7.2f}{r.predicted:>11.2f}{r.t_slot * 1e3:>9.2f}{r.t_comm * 1e3:>8.2f}"
            f"{r.tpot * 1e3:>9.2f}{r.tokens_per_s:>8.0f}{r.steps:>7}"
        )
    return "\n".join(lines)


__all__ = ["DecodeRow", "decode_row", "decode_rows", "format_decode_rows", "steady_idle"]
