"""The server's Prometheus metrics (``GET /metrics``), named as vLLM names its own with ``course_`` in place of
``vllm:`` (``course_time_to_first_token_seconds`` is ``vllm:time_to_first_token_seconds``), so a vLLM
dashboard's queries carry over by renaming the prefix. From the engine's side after every step: the queue
gauges (``num_requests_running`` / ``waiting`` / ``swapped``), ``kv_cache_usage_perc`` (the fraction of the
KV cache reserved, 0 to 1) and, as counters, ``num_preemptions`` and ``prefix_cache_queries`` / ``hits``
(prompt tokens looked up / found). From the asyncio side per token and per finished sequence (one choice):
TTFT, inter-token latency per token (ITL), the per-request TPOT, end-to-end latency, queue time (arrival at
the server to first scheduled; vLLM starts at its engine's queue, one hop later), prefill / decode /
inference time, prompt and generation tokens, and ``request_success`` by vLLM's finished reasons (stop,
length, abort, error). The course's own, with no vLLM counterpart: ``course_requests`` by the engine's
reasons (eos, stop, length, abort, timeout, error, rejected), ``course_requests_in_server`` and the KV
bytes used and reserved. Buckets start at a millisecond (a tiny model's step), finer than vLLM's.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import math

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SUCCESS_REASON = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort", "timeout": "abort"}


class ServerMetrics:
    """Prometheus metrics in their own ``CollectorRegistry`` (two apps in one process never collide)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self._e2e_sum, self._e2e_n = 0.0, 0
        self._engine_totals = {"preemptions": 0, "prefix_queries": 0, "prefix_hits": 0}

        def gauge(name, doc):
            return Gauge(f"course_{name}", doc, registry=r)

        def counter(name, doc, labels=()):
            return Counter(f"course_{name}", doc, labels, registry=r)

        def histogram(name, doc, buckets=LATENCY_BUCKETS):
            return Histogram(f"course_{name}", doc, buckets=buckets, registry=r)

        # the engine's state, after every step (vLLM's names)
        self.running = gauge("num_requests_running", "Sequences the engine is running")
        self.waiting = gauge("num_requests_waiting", "Sequences in the engine's waiting queue (preempted ones too)")
        self.swapped = gauge("num_requests_swapped", "Sequences preempted by swapping, their KV in host memory")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of the KV cache reserved by live sequences (0-1)")
        self.preemptions = counter("num_preemptions", "Preemptions by the engine's scheduler")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache")
        # the course's own
        self.in_server = gauge("requests_in_server", "Sequences admitted and not yet answered")
        self.kv_used = gauge("kv_cache_bytes_used", "KV cache bytes holding tokens")
        self.kv_reserved = gauge("kv_cache_bytes_reserved", "KV cache bytes reserved for live sequences")
        self.requests = counter(
            "requests",
            "Sequences by how they ended: eos, stop, length, abort, timeout, error, rejected",
            ["finish_reason"],
        )
        # per request and per token, on the asyncio side (vLLM's names)
        self.success = counter("request_success", "Finished sequences by vLLM's reason", ["finished_reason"])
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of admitted requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.ttft = histogram("time_to_first_token_seconds", "Arrival at the server → first token")
        self.itl = histogram("inter_token_latency_seconds", "Time between two tokens of a sequence, per token")
        self.tpot = histogram("request_time_per_output_token_seconds", "Per sequence: (last − first) / (n − 1)")
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival at the server → last token")
        self.queue = histogram("request_queue_time_seconds", "Arrival at the server → first scheduled")
        self.prefill = histogram("request_prefill_time_seconds", "First scheduled → first token")
        self.decode = histogram("request_decode_time_seconds", "First token → last token")
        self.inference = histogram("request_inference_time_seconds", "First scheduled → last token")
        self.prompt_hist = histogram("request_prompt_tokens", "Prompt tokens per request", TOKEN_BUCKETS)
        self.generation_hist = histogram("request_generation_tokens", "Generated tokens per sequence", TOKEN_BUCKETS)

    def token(self, ev, arrival: float, previous: float | None) -> None:
        """One generated token of a sequence (``previous``: the time of that sequence's last one)."""
        if previous is None:
            self.ttft.observe(ev.time - arrival)
            if ev.first_scheduled is not None:
                self.queue.observe(max(0.0, ev.first_scheduled - arrival))
                self.prefill.observe(ev.time - ev.first_scheduled)
        else:
            self.itl.observe(ev.time - previous)

    def finished(self, reason: str, token_times: list[float], arrival: float, scheduled: float | None = None) -> None:
        """One sequence (a choice) ended: how (the engine's reason, or abort / timeout / error), with which
        token times and, if known, when it was first scheduled."""
        self.requests.labels(finish_reason=reason).inc()
        self.success.labels(finished_reason=SUCCESS_REASON.get(reason, "error")).inc()
        self.generation_tokens.inc(len(token_times))
        self.generation_hist.observe(len(token_times))
        if reason in ("eos", "stop", "length") and token_times:
            self.e2e.observe(token_times[-1] - arrival)
            self._e2e_sum += token_times[-1] - arrival
            self._e2e_n += 1
            self.decode.observe(token_times[-1] - token_times[0])
            if scheduled is not None:
                self.inference.observe(token_times[-1] - scheduled)
            if len(token_times) > 1:
                self.tpot.observe((token_times[-1] - token_times[0]) / (len(token_times) - 1))

    def retry_after_s(self) -> int:
        """A 429's ``Retry-After``: the mean end-to-end latency of the requests served so far, in whole
        seconds within [1, 60] (1 before any): about when the requests ahead will have made room."""
        if not self._e2e_n:
            return 1
        return min(60, max(1, math.ceil(self._e2e_sum / self._e2e_n)))

    def engine_state(self, g: dict) -> None:
        """Set the gauges, and advance the counters, from ``EngineCore.gauges()`` (cumulative totals)."""
        self.waiting.set(g["waiting"])
        self.running.set(g["running"])
        self.swapped.set(g["swapped"])
        self.kv_usage.set(g["kv_usage"])
        self.kv_used.set(g["kv_used"])
        self.kv_reserved.set(g["kv_reserved"])
        for key, counter in (
            ("preemptions", self.preemptions),
            ("prefix_queries", self.prefix_queries),
            ("prefix_hits", self.prefix_hits),
        ):
            delta = g[key] - self._engine_totals[key]
            if delta > 0:
                counter.inc(delta)
            self._engine_totals[key] = g[key]


def set_gauges(metrics: ServerMetrics | None, gauges: dict) -> None:
    """The engine side's state after a step, into ``metrics`` (nothing if there are none)."""
    if metrics is not None:
        metrics.engine_state(gauges)
