"""The server's Prometheus metrics (``GET /metrics``): queue and KV gauges set from the engine's side after
every step, request counters and TTFT / TPOT / end-to-end histograms observed on the asyncio side.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import math


class ServerMetrics:
    """Prometheus metrics in their own ``CollectorRegistry`` (two apps in one process never collide)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self._e2e_sum, self._e2e_n = 0.0, 0
        self.waiting = Gauge("course_requests_waiting", "Requests in the engine's waiting queue", registry=r)
        self.running = Gauge("course_requests_running", "Requests the engine is running", registry=r)
        self.in_server = Gauge("course_requests_in_server", "Requests admitted and not yet answered", registry=r)
        self.kv_used = Gauge("course_kv_cache_bytes_used", "KV cache bytes holding tokens", registry=r)
        self.kv_reserved = Gauge(
            "course_kv_cache_bytes_reserved", "KV cache bytes reserved for live requests", registry=r
        )
        self.requests = Counter(
            "course_requests", "Requests by how they ended", ["finish_reason"], registry=r
        )  # eos / stop / length / abort (client left) / timeout / error / rejected (429)
        self.prompt_tokens = Counter("course_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("course_generation_tokens", "Generated tokens", registry=r)
        latency = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)
        self.ttft = Histogram(
            "course_time_to_first_token_seconds", "Arrival → first token", buckets=latency, registry=r
        )
        self.tpot = Histogram(
            "course_time_per_output_token_seconds", "Per request (last − first) / (n − 1)", buckets=latency, registry=r
        )
        self.e2e = Histogram("course_e2e_request_latency_seconds", "Arrival → last token", buckets=latency, registry=r)

    def token(self, ev, arrival: float, previous: float | None) -> None:
        """One generated token of a choice (``previous``: the time of that choice's last one)."""
        if previous is None:
            self.ttft.observe(ev.time - arrival)

    def finished(self, reason: str, token_times: list[float], arrival: float) -> None:
        """One sequence (a choice) ended: how, and with which token times."""
        self.requests.labels(finish_reason=reason).inc()
        self.generation_tokens.inc(len(token_times))
        if reason in ("eos", "stop", "length") and token_times:
            self.e2e.observe(token_times[-1] - arrival)
            self._e2e_sum += token_times[-1] - arrival
            self._e2e_n += 1
            if len(token_times) > 1:
                self.tpot.observe((token_times[-1] - token_times[0]) / (len(token_times) - 1))

    def retry_after_s(self) -> int:
        """A 429's ``Retry-After``: the mean end-to-end latency of the requests served so far, in whole
        seconds within [1, 60] (1 before any): about when the requests ahead will have made room."""
        if not self._e2e_n:
            return 1
        return min(60, max(1, math.ceil(self._e2e_sum / self._e2e_n)))


def set_gauges(metrics: ServerMetrics | None, gauges: tuple) -> None:
    """Set the queue and KV gauges from ``EngineCore.gauges()`` (nothing if there are no metrics)."""
    if metrics is not None:
        waiting, running, kv_used, kv_reserved = gauges[:4]
        metrics.waiting.set(waiting)
        metrics.running.set(running)
        metrics.kv_used.set(kv_used)
        metrics.kv_reserved.set(kv_reserved)
