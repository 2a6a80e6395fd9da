"""What a benchmark sends, and when: ``TimedRequest`` (an arrival time, a prompt, a token count) and
``schedule``, which gives a workload gamma-distributed gaps at a request rate, as vLLM's benchmark does.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from course_lib.serving.workload import Request


@dataclass(frozen=True)
class TimedRequest:
    """One request of a benchmark: when to send it (s after the start), the prompt, how many tokens."""

    arrival_s: float
    prompt: str | tuple[int, ...]  # text, or token ids (sent as OpenAI's token-array prompt)
    max_tokens: int

    def __post_init__(self) -> None:
        if not (isinstance(self.arrival_s, (int, float)) and math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise ValueError(f"TimedRequest.arrival_s must be a finite number ≥ 0, got {self.arrival_s!r}")
        if isinstance(self.prompt, list):
            object.__setattr__(self, "prompt", tuple(self.prompt))
        if not self.prompt or not isinstance(self.prompt, (str, tuple)):
            raise ValueError("TimedRequest.prompt must be a non-empty string or sequence of token ids")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"TimedRequest.max_tokens must be an int ≥ 1, got {self.max_tokens!r}")


def schedule(requests, rate: float = math.inf, *, burstiness: float = 1.0, seed: int = 0) -> list[TimedRequest]:
    """Arrival times for ``requests`` (``workload.Request``s or (prompt, max_tokens) pairs) at ``rate`` req/s.

    Gaps are gamma-distributed with mean 1/rate and shape ``burstiness`` (1 = a Poisson process; < 1
    burstier, > 1 more even), as vLLM's benchmark does; ``rate=inf`` sends everything at once."""
    if not (isinstance(rate, (int, float)) and rate > 0):
        raise ValueError(f"rate must be > 0 requests/s (math.inf = all at once), got {rate!r}")
    if not (isinstance(burstiness, (int, float)) and math.isfinite(burstiness) and burstiness > 0):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness!r}")
    pairs = []
    for r in requests:
        if isinstance(r, Request):
            pairs.append((tuple(r.prompt_ids), r.max_new_tokens))
        elif isinstance(r, TimedRequest):
            pairs.append((r.prompt, r.max_tokens))
        else:
            prompt, max_tokens = r
            pairs.append((prompt, max_tokens))
    if not pairs:
        raise ValueError("requests must be non-empty")
    if math.isinf(rate):
        times = np.zeros(len(pairs))
    else:
        from course_lib.serving.traces import bursty_arrivals

        # gamma gaps of shape `burstiness` = coefficient of variation 1/√burstiness; the first request at t = 0
        times = bursty_arrivals(rate, len(pairs), cv=burstiness**-0.5, seed=seed)
    return [TimedRequest(float(t), p, m) for t, (p, m) in zip(times, pairs)]
