"""What came back from a benchmark: each request as the client saw it (``RequestResult``: send time, token
times, how it ended) and the run (``LoadResult``: ``summarize`` of their ``RequestTrace``s, inter-token
latency percentiles, a printable table). Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

from course_lib.measure.metrics import SLO, RequestTrace, ServingSummary, percentiles, summarize

LOADGEN_PS = (50, 90, 99)


@dataclass
class RequestResult:
    """One request as the client saw it: when it was sent, when each streamed token arrived, how it ended."""

    index: int
    sent: float  # perf_counter when the request left the client
    token_times: list[float] = field(default_factory=list)  # perf_counter of each token's chunk
    text: str = ""
    prompt_tokens: int = 0  # from the server's usage (0 if unknown)
    finish_reason: str | None = None
    status: int | None = None  # HTTP status; None if the connection failed
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_reason is not None

    def trace(self) -> RequestTrace:
        return RequestTrace(self.index, self.sent, self.prompt_tokens, list(self.token_times))


@dataclass
class LoadResult:
    """A benchmark run: per-request results, the ``summarize`` of their traces, and inter-token latencies."""

    results: list[RequestResult]
    summary: ServingSummary
    itl: dict  # {p: s} over every gap between consecutive tokens of every request (NaN if none)
    duration_s: float  # first send → last token
    source: str  # "server <url>" or "in-process engine"

    @property
    def n_ok(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def errors(self) -> dict:
        """{HTTP status or "connection": count} of the failed requests."""
        c = collections.Counter(
            r.status if r.status and r.status != 200 else "connection" for r in self.results if not r.ok
        )
        return dict(c)

    @property
    def requests_per_s(self) -> float:
        return self.summary.requests_per_min / 60.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.summary.output_tokens_per_s

    def p(self, metric: str, q: float = 50) -> float:
        """A percentile in seconds: ``metric`` in "ttft", "tpot", "latency", "itl"."""
        table = self.itl if metric == "itl" else getattr(self.summary, metric)
        return table[q]

    def table(self) -> str:
        s = self.summary
        lines = [
            f"{self.source}: {self.n_ok}/{len(self.results)} requests ok"
            + (f", errors {self.errors}" if self.errors else "")
        ]
        lines.append(s.table())
        lines.append("ITL ms      " + "".join(f"{v * 1e3:>9.1f}" for v in self.itl.values()))
        lines.append(f"{self.requests_per_s:.2f} req/s, {self.output_tokens_per_s:.1f} output tok/s")
        return "\n".join(lines)


def summarize_results(results: list[RequestResult], start: float, slo: SLO | None, ps, source: str) -> LoadResult:
    """A ``LoadResult`` of ``results`` over the window from ``start`` to the last token, percentiles ``ps``."""
    traces = [r.trace() for r in results]
    ends = [r.token_times[-1] for r in results if r.token_times]
    end = max(ends) if ends else start + 1e-9
    summary = summarize(traces, slo=slo, window=(start, max(end, start + 1e-9)), ps=ps)
    gaps = [g for t in traces for g in t.itl]
    itl = percentiles(gaps, ps) if gaps else {p: math.nan for p in ps}
    return LoadResult(results, summary, itl, end - start, source)
