"""Pipeline parallelism measured: greedy generation on p stage processes, and the bubble beside its formula.

``pipeline_generate`` runs prefill and greedy decode through a p-stage pipeline (one process per stage,
gloo on a CPU) and returns the tokens, the logits and the measured ``Timeline`` of every slot.
``measure_bubble`` times pipelined prefills for several m; ``bubble_rows`` sets each measured bubble (wall
clock, and the CPU-time replay: the run as it would go with a dedicated core per stage) beside
(p − 1)/(m + p − 1) and ``bubble_with_comm`` with the measured hand-off time, and ``format_bubble_rows``
tabulates them. Every check that can fail runs before a process starts. Introduced in 07_parallelism.ipynb.

    runs = measure_bubble("tiny-target", prompts, p=2, ms=(1, 2, 4))              # measured, 2 processes
    print(format_bubble_rows(bubble_rows(runs)))      # formula, + t_comm, wall clock, CPU-time replay
    res = pipeline_generate("tiny-target", prompts, p=2, m=4, max_new_tokens=8)   # spawns 2 processes
    plot_timeline(res.timeline)                       # course_lib.parallel.plots
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from course_lib.parallel.pp_schedule import Timeline, bubble_fraction, bubble_with_comm, check_count
from course_lib.parallel.pp_stages import bubble_worker, pipeline_worker, split_micro_batches, stage_bounds


@dataclass
class PipelineResult:
    """Greedy tokens per sequence, logits (steps, B, V) of every sampled position, and the measured timeline."""

    tokens: list[list[int]]
    logits: torch.Tensor
    timeline: Timeline


def _check_prompts(prompts) -> list[list[int]]:
    if not isinstance(prompts, Sequence) or isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str) or not isinstance(p, Sequence) or not p:
            raise ValueError(f"prompts[{i}] must be a non-empty list of token ids, got {p!r:.60}")
        out.append([int(t) for t in p])
    return out


def _num_layers(model) -> int:
    if isinstance(model, (str, Path)):
        from transformers import AutoConfig

        from course_lib.models.load import resolve

        kind, path = resolve(model)
        return AutoConfig.from_pretrained(path if path is not None else str(model)).num_hidden_layers
    return model.config.num_hidden_layers


def _check_run(model, prompts, p: int, ms: Sequence[int]) -> list[list[int]]:
    """Every check that can fail, before any process starts."""
    prompts = _check_prompts(prompts)
    check_count("p (pipeline stages)", p)
    if not ms:
        raise ValueError("ms must hold at least one number of micro-batches")
    for m in ms:
        check_count("m (micro-batches)", m)
        split_micro_batches(len(prompts), m)
    stage_bounds(_num_layers(model), p)
    return prompts


def pipeline_generate(
    model,
    prompts,
    p: int = 2,
    m: int = 2,
    max_new_tokens: int = 8,
    *,
    linear: str = "auto",
    threads_per_worker: int = 1,
    timeout_s: float = 120.0,
) -> PipelineResult:
    """Greedy generation (EOS ignored: exactly ``max_new_tokens`` each) on a p-stage pipeline, ``prompts``
    (token-id lists) cut into m micro-batches: the prefill goes through the stages micro-batch by micro-batch,
    then every decode step does too, the last stage sending each micro-batch's new tokens back to stage 0.
    Spawns p processes through ``launch`` (gloo on a CPU); the result holds every slot's timing."""
    from course_lib.parallel.launcher import launch

    prompts = _check_run(model, prompts, p, [m])
    check_count("max_new_tokens", max_new_tokens)
    results = launch(
        pipeline_worker,
        p,
        model,
        prompts,
        m,
        max_new_tokens,
        linear,
        threads_per_worker=threads_per_worker,
        timeout_s=timeout_s,
    )
    timeline = Timeline(p, m, sorted((s for r in results for s in r["slots"]), key=lambda s: (s.start, s.stage)))
    return PipelineResult(results[-1]["tokens"], results[-1]["logits"], timeline)


def measure_bubble(
    model,
    prompts,
    p: int = 2,
    ms: Sequence[int] = (1, 2, 4),
    repeats: int = 3,
    *,
    linear: str = "auto",
    threads_per_worker: int = 1,
    timeout_s: float = 120.0,
    decode_tokens: int = 0,
) -> dict[int, list[Timeline]]:
    """Measured GPipe prefills of ``prompts`` on p stages, for each m in ``ms``: {m: [Timeline] × repeats}
    (one process launch for all; a warm-up pass first). Compare ``Timeline.bubble()`` with ``bubble_fraction``
    and ``bubble_with_comm`` (``bubble_rows`` does it for every m). The formula holds when a micro-batch's
    compute dwarfs the fixed costs each one adds — the hand-off between processes (hundreds of µs with gloo
    on a CPU), the last stage's LM head, Python: give each sequence tens of tokens, not a few (8 prompts of
    64 tokens keep tiny-target's slots at milliseconds up to m = 8). With ``decode_tokens`` > 0 the same launch
    also runs, for each m, prefill + ``decode_tokens`` greedy steps with the micro-batches in flight across
    steps (steady-state decode, ``course_lib.parallel.pp_decode``): its Timeline under key ("decode", m)."""
    from course_lib.parallel.launcher import launch

    ms = list(ms)
    prompts = _check_run(model, prompts, p, ms)
    check_count("repeats", repeats)
    check_count("decode_tokens", decode_tokens, 0)
    results = launch(
        bubble_worker,
        p,
        model,
        prompts,
        ms,
        repeats,
        linear,
        decode_tokens,
        threads_per_worker=threads_per_worker,
        timeout_s=timeout_s,
    )
    out = {m: [Timeline(p, m, [s for r in results for s in r[m][k]]) for k in range(repeats)] for m in ms}
    for m in ms if decode_tokens else ():
        out[("decode", m)] = Timeline(
            p, m, sorted((s for r in results for s in r[("decode", m)]), key=lambda s: s.start)
        )
    return out


@dataclass(frozen=True)
class BubbleRow:
    """One m of a ``measure_bubble`` run: the formulas beside the measurements (medians over the repeats)."""

    m: int
    formula: float  # (p − 1)/(m + p − 1): equal stages, free hand-offs
    with_comm: float  # bubble_with_comm(p, m, t_slot, t_comm): equal stages, measured hand-off time
    wall: float  # the measured timeline
    replay: float  # the schedule re-timed with each slot's CPU time, free hand-offs
    replay_comm: float  # ... and hand-offs of t_comm: the measured work and communication, no other program
    t_slot: float  # mean seconds of one micro-batch on one stage
    t_comm: float  # seconds of the first micro-batch's hand-off (Timeline.first_hop)
    cpu_share: float  # CPU / wall time inside the slots
    imbalance: float  # busiest stage ÷ mean stage (Timeline.imbalance)


def bubble_rows(runs: dict[int, list[Timeline]]) -> list[BubbleRow]:
    """``measure_bubble``'s prefill runs as one row per m (decode runs, keyed ("decode", m), are skipped)."""
    runs = {m: tls for m, tls in runs.items() if isinstance(m, int)}
    if not runs or any(not tls for tls in runs.values()):
        raise ValueError("runs must map each m to a non-empty list of measured Timelines (from measure_bubble)")
    rows = []
    for m, tls in runs.items():
        p = tls[0].stages

        def med(f):
            return statistics.median(float(f(t)) for t in tls)

        t_comm = med(lambda t: max(t.first_hop(), 0.0))
        rows.append(
            BubbleRow(
                m,
                bubble_fraction(p, m),
                med(lambda t: bubble_with_comm(p, m, t.mean_slot(), max(t.first_hop(), 0.0))),
                med(lambda t: t.bubble()),
                med(lambda t: t.replayed().bubble()),
                med(lambda t: t.replayed(max(t.first_hop(), 0.0)).bubble()),
                med(lambda t: t.mean_slot()),
                t_comm,
                med(lambda t: t.cpu_share()),
                med(lambda t: t.imbalance()),
            )
        )
    return rows


def format_bubble_rows(rows: Sequence[BubbleRow]) -> str:
    """The rows of ``bubble_rows`` as a table."""
    head = (
        f"{'m':>3}{'formula':>9}{'+ t_comm':>10}{'wall clock':>12}{'CPU replay':>12}{'+ t_comm':>10}"
        f"{'slot ms':>9}{'t_comm ms':>11}{'CPU/wall':>10}{'imbalance':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.m:>3}{r.formula:>9.3f}{r.with_comm:>10.3f}{r.wall:>12.3f}{r.replay:>12.3f}{r.replay_comm:>10.3f}"
            f"{r.t_slot * 1e3:>9.2f}{r.t_comm * 1e3:>11.2f}{r.cpu_share:>10.2f}{r.imbalance:>11.2f}"
        )
    return "\n".join(lines)


__all__ = ["BubbleRow", "PipelineResult", "bubble_rows", "format_bubble_rows", "measure_bubble", "pipeline_generate"]
