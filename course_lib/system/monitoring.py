"""Monitoring: the server's Prometheus ``/metrics`` scraped during a load run, as time series, and alerts.

Prometheus pulls: every scrape interval it reads the exposition text and keeps each sample with its time.
``Poller`` does the same from a thread while a load runs. Gauges (requests running / waiting, KV usage) are
read as they are; counters and histograms only grow, so what a dashboard shows is their change over a window:
``rate()`` for tokens per second, and the bucket counts' difference for a window's TTFT quantile (PromQL's
``histogram_quantile(0.99, rate(..._bucket[w]))``, here with ``scrape.quantile``). An alert is a threshold
on one of these series held for some scrapes (Prometheus' ``for:``); ``alert_windows`` says where it fires.
What to alert on is what a user feels (TTFT, errors) and what comes before it (a queue that grows, a KV cache
near full), with thresholds computed from a baseline run, not guessed (Beyer et al., *Site Reliability
Engineering*, ch. 6: symptoms over causes). Introduced in 08_system_2_agents_observability_feedback.ipynb.
"""

from __future__ import annotations

import math
import threading
import time

from prometheus_client.parser import text_string_to_metric_families

from course_lib.serving.loadgen.scrape import Histogram, histograms, quantile

GAUGES = ("course_num_requests_running", "course_num_requests_waiting", "course_kv_cache_usage_perc")
TTFT = "course_time_to_first_token_seconds"


class Poller:
    """``with Poller(url, interval_s) as p:`` scrapes ``url/metrics`` every ``interval_s``; ``p.samples`` is
    the list of (seconds since start, exposition text)."""

    def __init__(self, url: str, interval_s: float = 0.25) -> None:
        if not isinstance(url, str) or not url.startswith("http"):
            raise ValueError(f"url must be the server's root URL (http://...), got {url!r}")
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not 0.01 <= interval_s <= 60:
            raise ValueError(f"interval_s must be a number of seconds in [0.01, 60], got {interval_s!r}")
        self.url, self.interval_s = url.rstrip("/") + "/metrics", float(interval_s)
        self.samples: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import httpx

        t0 = time.perf_counter()
        with httpx.Client(timeout=5.0) as client:
            while True:
                self.samples.append((time.perf_counter() - t0, client.get(self.url).text))
                if self._stop.wait(self.interval_s):
                    self.samples.append((time.perf_counter() - t0, client.get(self.url).text))
                    return

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _values(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.labels or family.type != "histogram":
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def series(samples, window: int = 4) -> dict[str, list[float]]:
    """Per scrape: time ``t``, the gauges, ``tokens_per_s`` (the generation-token counter's rate over the last
    ``window`` scrapes) and ``ttft_p99_s`` (the TTFT histogram's p99 over the same window; nan with no first
    token in it)."""
    samples = list(samples)
    if len(samples) < 2 or not all(isinstance(t, (int, float)) and isinstance(x, str) for t, x in samples):
        raise ValueError("samples must be at least 2 (seconds, /metrics text) pairs (Poller.samples)")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1 (scrapes), got {window!r}")
    values = [_values(text) for _, text in samples]
    hists = [histograms(text, TTFT)[TTFT] for _, text in samples]
    out = {"t": [t for t, _ in samples], **{g: [v.get(g, 0.0) for v in values] for g in GAUGES}}
    out["tokens_per_s"], out["ttft_p99_s"] = [], []
    for i in range(len(samples)):
        j = max(0, i - window)
        dt = samples[i][0] - samples[j][0]
        gen = values[i].get("course_generation_tokens_total", 0.0) - values[j].get(
            "course_generation_tokens_total", 0.0
        )
        out["tokens_per_s"].append(gen / dt if dt > 0 else 0.0)
        out["ttft_p99_s"].append(quantile(_delta(hists[i], hists[j]), 0.99))
    return out


def _delta(now: Histogram, before: Histogram) -> Histogram:
    cum = tuple(a - b for a, b in zip(now.cumulative, before.cumulative))
    return Histogram(now.name, now.bounds, cum, now.total - before.total, now.count - before.count)


def alert_windows(values, threshold: float, for_scrapes: int = 2) -> list[bool]:
    """Whether the alert fires at each scrape: ``values`` above ``threshold`` for ``for_scrapes`` scrapes in a
    row (nan, no data, never fires)."""
    values = list(values)
    if not values or not all(isinstance(v, (int, float)) for v in values):
        raise ValueError("values must be a non-empty list of numbers (a series)")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number, got {threshold!r}")
    if isinstance(for_scrapes, bool) or not isinstance(for_scrapes, int) or for_scrapes < 1:
        raise ValueError(f"for_scrapes must be an int >= 1, got {for_scrapes!r}")
    out, run = [], 0
    for v in values:
        run = run + 1 if v > threshold else 0  # nan > x is False
        out.append(run >= for_scrapes)
    return out


def two_phase_load(prompt: str, n_base: int, rate: float, n_burst: int, max_tokens: int = 16, seed: int = 0):
    """(requests, burst_start_s): ``n_base`` requests at ``rate`` per second (Poisson), then ``n_burst`` all at
    once just after the last of them: a steady phase to set thresholds on, and an overload to see them fire."""
    from course_lib.serving.loadgen import TimedRequest, schedule

    for name, v in (("n_base", n_base), ("n_burst", n_burst), ("max_tokens", max_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise ValueError(f"rate must be a finite number of requests per second > 0, got {rate!r}")
    base = schedule([(prompt, max_tokens)] * n_base, rate=rate, seed=seed)
    start = base[-1].arrival_s + 1.0 / rate
    return base + [TimedRequest(start, prompt, max_tokens) for _ in range(n_burst)], start


__all__ = ["GAUGES", "TTFT", "Poller", "alert_windows", "series", "two_phase_load"]
