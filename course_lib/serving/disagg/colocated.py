"""The baseline a disaggregated server is measured against: one engine in this process, requests added at
their arrival times, prefills and decodes sharing its steps (continuous batching), so a long prefill
stalls every running decode. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import time
from collections.abc import Sequence as SequenceABC

from course_lib.measure.metrics import RequestTrace
from course_lib.serving.disagg.run import ServingRun, check_requests, request_params
from course_lib.serving.disagg.workers import POLL_S
from course_lib.serving.workload import Request


def serve_colocated(engine, requests: SequenceABC[Request], arrivals: SequenceABC[float] | None = None) -> ServingRun:
    """The baseline: one engine in this process, requests added at their arrival times (s after the start),
    greedy with ``ignore_eos``; prefills and decodes share its steps (continuous batching)."""
    requests, arrivals = check_requests(requests, arrivals)
    if engine.has_unfinished():
        raise RuntimeError("serve_colocated needs an idle engine")
    start = time.perf_counter()
    times: list[list[float]] = [[] for _ in requests]
    outputs: list[list[int]] = [[] for _ in requests]
    nxt = 0
    while nxt < len(requests) or engine.has_unfinished():
        now = time.perf_counter() - start
        while nxt < len(requests) and arrivals[nxt] <= now:
            r = requests[nxt]
            engine.add_request(list(r.prompt_ids), request_params(r), request_id=nxt, arrival=start + arrivals[nxt])
            nxt += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, min(arrivals[nxt] - now, POLL_S)))
            continue
        for ev in engine.step():
            outputs[ev.request].append(ev.token_id)
            times[ev.request].append(ev.time)
    traces = [
        RequestTrace(i, start + a, len(r.prompt_ids), t, finish=t[-1])
        for i, (r, a, t) in enumerate(zip(requests, arrivals, times))
    ]
    return ServingRun(traces, outputs)
