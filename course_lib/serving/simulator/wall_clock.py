"""The real replay: the same trace on a real ``Engine`` by wall clock (``run_real``), a request added once
its arrival time has passed, every token timed by the engine itself; what the simulation is checked
against. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import time
from collections.abc import Sequence as SequenceABC

from course_lib.engine.sampling import SamplingParams
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.engine.sequence import Sequence
from course_lib.measure.metrics import SLO
from course_lib.serving.simulator.calibrate import record_batches
from course_lib.serving.simulator.cost_model import StepShape
from course_lib.serving.simulator.replay import (
    RunResult,
    StepRecord,
    backend_bytes_per_token,
    check_trace,
    kv_capacity,
    summarize_run,
)
from course_lib.serving.traces import Trace


def run_real(
    engine,
    trace: Trace,
    config: SchedulerConfig,
    *,
    pool: SequenceABC[int] | None = None,
    kv_cache: str = "contiguous",
    slo: SLO | None = None,
    warmup: bool = True,
    prefix_caching: bool = False,
) -> RunResult:
    """Replay ``trace`` on a real ``Engine`` built around ``engine``'s model with ``config``: a request is
    added once its arrival time has passed on the wall clock, ``step()`` runs otherwise, and the loop sleeps
    until the next arrival when idle. Every token's time is the engine's own event time."""
    from course_lib.engine import Engine
    from course_lib.serving.workload import prompt_pool

    extra = {"prefix_caching": True} if prefix_caching else {}  # only where the engine has it
    eng = Engine(engine.hf_model, engine.tokenizer, device=engine.device, config=config, kv_cache=kv_cache, **extra)
    check_trace(trace, eng.config, eng.backend.max_tokens_per_seq(), eng.config.chunked_prefill)
    if pool is None:
        pool = prompt_pool(engine.tokenizer, trace.pool_tokens)
    ids = trace.prompt_ids(pool)
    reqs = trace.requests
    if warmup:  # first calls pay for allocation and kernel selection; the KV rows are reused afterwards
        warm = sorted(range(len(ids)), key=lambda i: -len(ids[i]))[: min(4, config.max_num_seqs)]
        eng.generate([ids[i] for i in warm], SamplingParams(max_new_tokens=3, ignore_eos=True))
    shapes: list[tuple[StepShape, int, int]] = []
    record_batches(eng, shapes)
    steps: list[StepRecord] = []
    seqs: list[Sequence] = []
    max_tokens = max_seqs = max_kv = 0
    start = time.perf_counter() - reqs[0].arrival_s
    while len(seqs) < len(reqs) or eng.has_unfinished():
        now = time.perf_counter() - start
        while len(seqs) < len(reqs) and reqs[len(seqs)].arrival_s <= now:
            i = len(seqs)
            params = SamplingParams(max_new_tokens=reqs[i].max_new_tokens, ignore_eos=True)
            seqs.append(eng.add_request(ids[i], params, request_id=i, arrival=start + reqs[i].arrival_s))
        n_before = len(shapes)
        t0 = time.perf_counter()
        eng.step()
        t1 = time.perf_counter()
        if len(shapes) > n_before:
            sh, n_seqs, n_tokens = shapes[-1]
            steps.append(StepRecord(t0 - start, t1 - t0, sh))
            max_seqs, max_tokens = max(max_seqs, n_seqs), max(max_tokens, n_tokens)
            max_kv = max(max_kv, eng.backend.bytes_reserved() // max(1, backend_bytes_per_token(eng.backend)))
        elif not eng.scheduler.running:
            wait = reqs[len(seqs)].arrival_s - (t1 - start) if len(seqs) < len(reqs) else 0.0
            time.sleep(min(max(wait, 0.0), 0.05) if wait > 0 else 5e-4)
    traces = [s.trace for s in seqs]
    return RunResult(
        "real",
        eng.config,
        traces,
        summarize_run(traces, slo),
        steps,
        max(t.token_times[-1] for t in traces) - (start + reqs[0].arrival_s),
        sum(s.num_preemptions for s in seqs),
        max_tokens,
        max_seqs,
        max_kv,
        kv_capacity(eng.backend),
        eng,
    )
