"""The in-process baseline of a server benchmark: the same timed requests driven with ``add_request`` /
``step`` on a worker thread, no HTTP; token times are the engine's own. ``overhead`` compares the two.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Sequence

from course_lib.engine.sampling import SamplingParams
from course_lib.measure.metrics import SLO
from course_lib.serving.loadgen.results import LOADGEN_PS, LoadResult, RequestResult, summarize_results
from course_lib.serving.loadgen.timed_requests import TimedRequest


def measure_engine(
    engine,
    requests: Sequence[TimedRequest],
    *,
    slo: SLO | None = None,
    ignore_eos: bool = True,
    temperature: float = 0.0,
    ps=LOADGEN_PS,
) -> LoadResult:
    """The same requests, at the same arrival times, driven in-process with ``add_request``/``step``: the
    baseline the server's overhead is measured against. Token times are the engine's own event times.

    The loop runs on a worker thread, as the server's engine loop does, so the two differ only by the
    HTTP path: on a CPU, torch's OpenMP pool behaves differently on the main thread (on a loaded 2-core
    machine, two spinning OpenMP threads there made steps ~10× slower than on a worker thread). The engine
    must be idle and not owned by a running server (only one thread may drive it)."""
    requests = list(requests)
    if not requests or not all(isinstance(r, TimedRequest) for r in requests):
        raise ValueError("requests must be a non-empty sequence of TimedRequest (see schedule())")
    if engine.has_unfinished():
        raise RuntimeError("measure_engine needs an idle engine")
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="course-measure") as pool:
        start, results = pool.submit(_drive_engine, engine, requests, ignore_eos, temperature).result()
    return summarize_results(results, start, slo, ps, "in-process engine")


def _drive_engine(engine, requests: list[TimedRequest], ignore_eos: bool, temperature: float):
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    results = [RequestResult(i, 0.0) for i in range(len(requests))]
    outputs: list[list[int]] = [[] for _ in requests]
    start = time.perf_counter()
    nxt = 0
    try:
        while nxt < len(order) or engine.has_unfinished():
            now = time.perf_counter()
            while nxt < len(order) and start + requests[order[nxt]].arrival_s <= now:
                i = order[nxt]
                r, res = requests[i], results[i]
                res.sent = start + r.arrival_s
                params = SamplingParams(max_new_tokens=r.max_tokens, temperature=temperature, ignore_eos=ignore_eos)
                try:
                    seq = engine.add_request(r.prompt, params, request_id=f"loadgen-{i}", arrival=res.sent)
                    res.prompt_tokens = seq.num_prompt_tokens
                except ValueError as exc:
                    res.error, res.status = str(exc), 400
                nxt += 1
            if engine.has_unfinished():
                for ev in engine.step():
                    i = int(str(ev.request).rsplit("-", 1)[1])
                    results[i].token_times.append(ev.time)
                    outputs[i].append(ev.token_id)
                    if ev.finished:
                        results[i].finish_reason = {"eos": "stop"}.get(ev.finish_reason, ev.finish_reason)
            elif nxt < len(order):
                time.sleep(max(0.0, start + requests[order[nxt]].arrival_s - time.perf_counter()))
    finally:
        for i, res in enumerate(results):  # an interrupted run leaves nothing behind in the engine
            if res.error is None and res.finish_reason is None and res.sent:
                try:
                    engine.abort(f"loadgen-{i}")
                except ValueError:
                    pass
    for res, out in zip(results, outputs):
        res.text = engine.tokenizer.decode(out, skip_special_tokens=True)
        res.status = res.status or 200
    return start, results
