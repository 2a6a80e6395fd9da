"""What one replay of a trace returns, simulated or real (``RunResult``: per-request traces, their summary,
every step), and what both replays check and count (the trace fits the engine, the cache's capacity).
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import math
from dataclasses import dataclass

from course_lib.engine.attention.contiguous import ContiguousBackend
from course_lib.engine.attention.paged import PagedBackend
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.measure.metrics import SLO, RequestTrace, ServingSummary, summarize
from course_lib.serving.simulator.cost_model import StepShape
from course_lib.serving.traces import Trace


@dataclass(frozen=True)
class StepRecord:
    start_s: float  # s after the run started
    dt_s: float
    shape: StepShape


@dataclass
class RunResult:
    """One replay of a trace (``mode`` "sim" or "real"): per-request traces, their summary, every step."""

    mode: str
    config: SchedulerConfig
    traces: list[RequestTrace]
    summary: ServingSummary
    steps: list[StepRecord]
    makespan_s: float  # first arrival → last token
    num_preemptions: int = 0
    max_step_tokens: int = 0  # the most tokens any step held (≤ max_num_batched_tokens)
    max_step_seqs: int = 0  # the most sequences any step held (≤ max_num_seqs)
    max_kv_tokens: int = 0  # the most KV tokens reserved at once
    kv_capacity_tokens: int = 0  # what the cache could hold
    engine: object = None  # run_real: the Engine it built (its backend's counters, e.g. prefix hits)

    @property
    def throughput(self) -> float:
        """Output tokens/s over the run's window."""
        return self.summary.output_tokens_per_s

    @property
    def busy_s(self) -> float:
        """Σ step durations (the virtual clock's advance, in a simulation without idle gaps)."""
        return sum(s.dt_s for s in self.steps)

    def max_itl(self, request_ids=None) -> float:
        """The longest gap between two consecutive tokens of one request (of ``request_ids``, default all)."""
        keep = None if request_ids is None else set(request_ids)
        gaps = [g for t in self.traces if keep is None or t.request_id in keep for g in t.itl]
        return max(gaps) if gaps else math.nan

    def metrics(self) -> dict[str, float]:
        s = self.summary
        out = {
            "throughput": s.output_tokens_per_s,
            "ttft_p50": s.ttft[50],
            "ttft_p99": s.ttft[99],
            "tpot_p50": s.tpot[50],
            "tpot_p99": s.tpot[99],
            "latency_p50": s.latency[50],
            "latency_p99": s.latency[99],
            "max_itl": self.max_itl(),
        }
        if s.slo is not None:
            out["goodput_rps"] = s.goodput_rps
            out["slo_attainment"] = s.slo_attainment
        return out


def summarize_run(traces: list[RequestTrace], slo: SLO | None) -> ServingSummary:
    return summarize(traces, slo=slo, ps=(50, 90, 99))


def check_trace(trace: Trace, config: SchedulerConfig, max_tokens_per_seq: int, chunking: bool) -> None:
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a Trace, got {type(trace).__name__}")
    for i, r in enumerate(trace.requests):
        need = r.prompt_len + r.max_new_tokens
        if need > min(config.max_model_len, max_tokens_per_seq):
            raise ValueError(
                f"trace request {i} needs {need} tokens of context; the engine holds "
                f"{min(config.max_model_len, max_tokens_per_seq)} per sequence"
            )
        if not chunking and need > config.max_num_batched_tokens:
            raise ValueError(
                f"trace request {i} has {need} tokens, more than max_num_batched_tokens="
                f"{config.max_num_batched_tokens} with chunked prefill off: it could never run"
            )


def kv_capacity(backend) -> int:
    """Tokens the cache can hold over all sequences (0 if the backend does not say)."""
    if isinstance(backend, PagedBackend):
        return backend.num_blocks * backend.block_size
    if isinstance(backend, ContiguousBackend):
        return backend.max_seqs * backend.max_len
    return 0


def backend_bytes_per_token(backend) -> int:
    return int(getattr(backend, "bytes_per_token", 0) or 0)
