"""The simulation: a trace replayed through the engine's own ``Scheduler`` (its budgets, its preemption) on
a bookkeeping KV cache and a virtual clock that advances by the cost model's time for each scheduled batch.
Replaying a trace on the real engine takes as long as the trace; this takes milliseconds, so a policy sweep
over arrival rates is cheap. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Sequence as SequenceABC

from course_lib.engine.sampling import SamplingParams
from course_lib.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from course_lib.engine.sequence import Sequence
from course_lib.measure.metrics import SLO
from course_lib.serving.simulator.backends import sim_backend
from course_lib.serving.simulator.cost_model import CostModel, step_shape
from course_lib.serving.simulator.replay import RunResult, StepRecord, check_trace, kv_capacity, summarize_run
from course_lib.serving.traces import Trace


def _schedule(scheduler: Scheduler, now: float) -> ScheduledBatch:
    """``schedule(now=...)`` where the scheduler takes a clock (the dynamic policy), else ``schedule()``."""
    try:
        takes_now = "now" in inspect.signature(scheduler.schedule).parameters
    except (TypeError, ValueError):
        takes_now = False
    return scheduler.schedule(now=now) if takes_now else scheduler.schedule()


def simulate(
    trace: Trace,
    config: SchedulerConfig,
    cost_model: CostModel,
    *,
    kv_cache: str = "contiguous",
    block_size: int = 16,
    slo: SLO | None = None,
    pool: SequenceABC[int] | None = None,
    prefix_caching: bool = False,
    priorities: SequenceABC[int] | None = None,
) -> RunResult:
    """Replay ``trace`` through the engine's ``Scheduler`` on a virtual clock: each step costs
    ``cost_model.batch_time(batch)``; every request generates exactly ``max_new_tokens`` (EOS ignored).
    Arrivals join between steps, as in the real loop; when nothing can run the clock jumps to the next
    arrival (or to the oldest waiting request's ``max_wait_s`` deadline under a dynamic policy).
    ``pool``: token ids for the prompts (only their identity matters, for prefix caching); default a
    synthetic pool. ``priorities``: one int per request (lower first), read by
    ``SchedulerConfig(admission="priority")``."""
    if not isinstance(cost_model, CostModel):
        raise ValueError(f"cost_model must be a CostModel, got {type(cost_model).__name__}")
    if not isinstance(config, SchedulerConfig):
        raise ValueError(f"config must be a SchedulerConfig, got {type(config).__name__}")
    if config.max_model_len is None:
        config = dataclasses.replace(config, max_model_len=int(cost_model.meta.get("max_model_len", 1024)))
    layout = cost_model.meta.get("kv_layout", (6, 2, 32))
    backend = sim_backend(config, kv_cache, block_size, layout, prefix_caching)
    check_trace(trace, config, backend.max_tokens_per_seq(), config.chunked_prefill)
    scheduler = Scheduler(config, backend)
    if pool is None:
        pool = [(7 * i + 3) % 4093 + 2 for i in range(trace.pool_tokens)]
    ids = trace.prompt_ids(pool)
    seqs = [
        Sequence(i, p, SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True), r.arrival_s)
        for i, (r, p) in enumerate(zip(trace.requests, ids))
    ]
    if priorities is not None:
        priorities = list(priorities)
        if len(priorities) != len(seqs) or any(not isinstance(q, int) or isinstance(q, bool) for q in priorities):
            raise ValueError(f"priorities must be one int per request of the trace ({len(seqs)}), got {priorities!r}")
        for seq, q in zip(seqs, priorities):
            seq.priority = q
    max_wait = getattr(config, "max_wait_s", None)
    bpt = backend.bytes_per_token
    capacity = kv_capacity(backend)
    now, nxt, stalls = seqs[0].arrival, 0, 0
    steps: list[StepRecord] = []
    max_tokens = max_seqs = max_kv = 0
    while nxt < len(seqs) or scheduler.has_unfinished():
        while nxt < len(seqs) and seqs[nxt].arrival <= now:
            scheduler.add(seqs[nxt])
            nxt += 1
        batch = _schedule(scheduler, now)
        if not batch.seqs:
            wake = [seqs[nxt].arrival] if nxt < len(seqs) else []
            if scheduler.waiting and hasattr(scheduler, "wait_time"):
                wake.append(now + scheduler.wait_time(now))  # inf when a batch must finish first
            elif scheduler.waiting and max_wait:
                wake.append(min(s.arrival for s in scheduler.waiting) + max_wait)
            wake = [t for t in wake if math.isfinite(t)]
            wake = [t for t in wake if t > now]
            stalls += 1
            if not wake or stalls > 10_000:  # dynamic batching may wait through many arrivals
                raise RuntimeError(
                    f"the scheduler made no progress at t={now:.4f} s with {len(scheduler.waiting)} waiting and "
                    f"{len(scheduler.running)} running requests (does a request fit the KV budget?)"
                )
            now = min(wake)
            continue
        stalls = 0
        shape = step_shape(batch)
        dt = cost_model.shape_time(shape)
        steps.append(StepRecord(now, dt, shape))
        max_tokens, max_seqs = max(max_tokens, batch.total_tokens), max(max_seqs, len(batch))
        max_kv = max(max_kv, backend.bytes_reserved() // bpt)
        now += dt
        # postprocess, as Engine.step does: a sequence whose prompt is complete emits a token now
        for seq, n in zip(batch.seqs, batch.num_tokens):
            done = seq.num_cached_tokens + n == seq.num_tokens
            seq.num_cached_tokens += n
            if done:
                seq.token_ids.append(1)
                seq.token_times.append(now)
                if seq.num_output_tokens >= seq.params.max_new_tokens:
                    scheduler.finish(seq, "length", now)
    traces = [s.trace for s in seqs]
    return RunResult(
        "sim",
        config,
        traces,
        summarize_run(traces, slo),
        steps,
        max(t.token_times[-1] for t in traces) - seqs[0].arrival,
        sum(s.num_preemptions for s in seqs),
        max_tokens,
        max_seqs,
        max_kv,
        capacity,
    )
