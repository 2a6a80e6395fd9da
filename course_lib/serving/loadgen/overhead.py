"""What serving over HTTP adds to a latency percentile: a server's ``LoadResult`` against the in-process
baseline's (``server_overhead``; the issue's goal is ≤ 10 % on p50 TPOT). Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.serving.loadgen.results import LoadResult


@dataclass(frozen=True)
class Overhead:
    """What serving over HTTP adds to a latency percentile, client side vs in-process."""

    metric: str
    percentile: float
    server_s: float
    engine_s: float

    @property
    def relative(self) -> float:
        """server / engine − 1 (0.1 = the server adds 10 %)."""
        return self.server_s / self.engine_s - 1.0

    def within(self, budget: float = 0.10) -> bool:
        return self.relative <= budget

    def __str__(self) -> str:
        return (
            f"p{self.percentile:g} {self.metric.upper()}: server {self.server_s * 1e3:.2f} ms vs in-process "
            f"{self.engine_s * 1e3:.2f} ms → {self.relative:+.1%}"
        )


def server_overhead(server: LoadResult, engine: LoadResult, metric: str = "tpot", percentile: float = 50) -> Overhead:
    """The server's overhead on one percentile of ``metric`` (default p50 TPOT: the issue's ≤ 10 % goal)."""
    return Overhead(metric, percentile, server.p(metric, percentile), engine.p(metric, percentile))
