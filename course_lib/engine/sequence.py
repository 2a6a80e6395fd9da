"""A request inside the engine: its tokens, its state, its sampling and its timeline.

The scheduler moves sequences between queues by ``status``; the attention backend keeps their keys and
values behind ``kv`` (a handle only it understands: a row of the contiguous cache, a block table in
chapter 05). ``num_cached_tokens`` says how many of ``token_ids`` already have K/V stored, so the next
forward processes exactly ``num_tokens - num_cached_tokens`` of them: the whole prompt at first (prefill),
a chunk of it (chunked prefill), one token (decode), everything again after a preemption by recompute,
or what is left after the matched prefix (prefix caching). A sequence preempted by swapping keeps its
``num_cached_tokens``; its ``kv`` is then the host copy the backend's ``swap_out`` returned. A step reports
each generated token as a ``TokenEvent``.
Introduced in 02_metrics_1_latency.ipynb; chapters 04-06 read and change it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from course_lib.engine.sampling import SamplingParams, make_generator
from course_lib.measure.metrics import RequestTrace


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, no KV storage
    RUNNING = "running"  # admitted: has KV storage, is scheduled every step
    PREEMPTED = "preempted"  # evicted for memory; KV freed, back in the queue to be recomputed
    SWAPPED = "swapped"  # evicted for memory; KV copied to host memory, back in the queue to be copied back
    FINISHED = "finished"  # done (eos, length, stop string, or aborted); KV freed


class Sequence:
    """One request. ``token_ids`` is prompt + output; ``params`` and ``generator`` are its own."""

    def __init__(
        self,
        request_id: str | int,
        prompt_ids: list[int],
        params: SamplingParams,
        arrival: float,
        device: str | torch.device = "cpu",
    ) -> None:
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_ids)
        self.num_prompt_tokens = len(prompt_ids)
        self.params = params
        # one generator per request, reused every step: the same seed gives the same tokens in any batch
        seeded = params.seed is not None and not params.greedy
        self.generator: torch.Generator | None = make_generator(params.seed, device) if seeded else None
        self.status = SequenceStatus.WAITING
        self.num_cached_tokens = 0  # tokens of token_ids whose K/V are in the cache
        self.kv: Any = None  # the attention backend's storage handle while RUNNING
        self.arrival = arrival
        self.token_times: list[float] = []  # perf_counter when each output token reached the host
        self.finish_time: float | None = None
        self.finish_reason: str | None = None  # "eos", "length", "stop" or "abort"
        self.num_preemptions = 0
        self.swapped_bytes = 0  # KV bytes copied to the host and back by preemptions by swapping
        self.first_scheduled: float | None = None  # when the scheduler first admitted it (queue time = − arrival)
        self.cumulative_logprob = 0.0  # sum of its tokens' raw log-probs (kept when params.logprobs is set)
        self.parent: str | int | None = None  # for sample j ≥ 1 of a request with params.n > 1: that request's id
        self.priority = 0  # SchedulerConfig(admission="priority") admits lower values first
        self.forked = False  # params.n > 1: its other samples exist (forked when its prompt was done)
        self.grammar = None  # params.structured: its structured.Grammar (the matcher follows its output)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Tokens the next forward must process for this sequence (prompt, chunk remainder, or 1)."""
        return len(self.token_ids) - self.num_cached_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def trace(self) -> RequestTrace:
        """Arrival and per-token times as a ``metrics.RequestTrace`` (TTFT, TPOT, latency)."""
        return RequestTrace(
            self.request_id, self.arrival, self.num_prompt_tokens, list(self.token_times), finish=self.finish_time
        )

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}, cached={self.num_cached_tokens})"
        )


@dataclass
class TokenEvent:
    """One generated token as it happens: which request, which token, when."""

    request: str | int
    token_id: int
    time: float
    index: int  # 0 for the first generated token of that request
    finished: bool = False
    finish_reason: str | None = None  # "eos", "length" or "stop" on the request's last token
    logprob: float | None = None  # with params.logprobs set: the token's raw log-probability
    top_logprobs: tuple | None = None  # ... and the ((token id, log-prob), ...) of the params.logprobs most likely
    first_scheduled: float | None = None  # on a sequence's first token: when it was first scheduled (queue time)
