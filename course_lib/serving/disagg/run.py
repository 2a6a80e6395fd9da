"""What serving a workload returns (``ServingRun``: traces, generated ids, KV transfers) and the request
checks shared by the colocated baseline and the disaggregated server. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from course_lib.engine.sampling import SamplingParams
from course_lib.measure.metrics import RequestTrace
from course_lib.serving.disagg.handover import KVTransfer
from course_lib.serving.workload import Request


@dataclass
class ServingRun:
    """Traces of one served workload (in request order), the generated ids, and (disaggregated) the transfers."""

    traces: list[RequestTrace]
    outputs: list[list[int]]
    transfers: list[KVTransfer] = field(default_factory=list)

    def transfer_bytes(self) -> int:
        return sum(t.bytes for t in self.transfers)


def check_requests(requests, arrivals) -> tuple[list[Request], list[float]]:
    """``requests`` as a list and ``arrivals`` (s after the start; default all 0) as floats, or ValueError."""
    requests = list(requests)
    if not requests or not all(isinstance(r, Request) for r in requests):
        raise ValueError("requests must be a non-empty sequence of serving.workload.Request")
    arrivals = [0.0] * len(requests) if arrivals is None else [float(a) for a in arrivals]
    if len(arrivals) != len(requests):
        raise ValueError(f"arrivals must hold one time per request ({len(requests)}), got {len(arrivals)}")
    if any(not math.isfinite(a) or a < 0 for a in arrivals) or any(b < a for a, b in zip(arrivals, arrivals[1:])):
        raise ValueError("arrivals must be finite, non-negative, non-decreasing seconds after the start")
    return requests, arrivals


def request_params(r: Request) -> SamplingParams:
    """Greedy, exactly ``max_new_tokens`` (EOS ignored): both servers generate the same tokens."""
    return SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True)
