"""Chapter 08 part 2, monitoring: series read gauges as they are and counters/histograms as changes over a
window, an alert fires only after its threshold is exceeded for the scrapes it asks, the two-phase load has
its burst after the steady phase, and the poller scrapes a real server during a load run."""

import math

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest  # noqa: E402

from course_lib.system import monitoring  # noqa: E402


def _exposition(waiting, tokens, ttfts):
    r = CollectorRegistry()
    Gauge("course_num_requests_running", "", registry=r).set(1)
    Gauge("course_num_requests_waiting", "", registry=r).set(waiting)
    Gauge("course_kv_cache_usage_perc", "", registry=r).set(0.5)
    Counter("course_generation_tokens", "", registry=r).inc(tokens)
    h = Histogram("course_time_to_first_token_seconds", "", buckets=(0.01, 0.1, 1.0), registry=r)
    for t in ttfts:
        h.observe(t)
    return generate_latest(r).decode()


def test_series_windows_counters_and_histograms():
    samples = [
        (0.0, _exposition(0, 0, [])),
        (1.0, _exposition(0, 100, [0.005] * 10)),
        (2.0, _exposition(5, 300, [0.005] * 10 + [0.5] * 10)),
    ]
    s = monitoring.series(samples, window=1)
    assert s["course_num_requests_waiting"] == [0, 0, 5]
    assert s["tokens_per_s"] == [0.0, 100.0, 200.0]
    assert math.isnan(s["ttft_p99_s"][0])
    assert s["ttft_p99_s"][1] <= 0.01 and 0.1 < s["ttft_p99_s"][2] <= 1.0  # only the last window's slow ones
    with pytest.raises(ValueError, match="samples"):
        monitoring.series(samples[:1])


def test_alert_needs_consecutive_scrapes():
    assert monitoring.alert_windows([1, 5, 1, 5, 5, 5], 2, for_scrapes=2) == [False, False, False, False, True, True]
    assert monitoring.alert_windows([math.nan, 5], 2, for_scrapes=1) == [False, True]
    assert not any(monitoring.alert_windows([1, 1, 1], 2))  # a quiet series never fires: the claim can fail
    with pytest.raises(ValueError, match="threshold"):
        monitoring.alert_windows([1], math.inf)


def test_two_phase_load_and_poller_on_a_server():
    reqs, burst_at = monitoring.two_phase_load("def f(x):", 4, 20.0, 6, max_tokens=4)
    assert len(reqs) == 10 and all(r.arrival_s < burst_at for r in reqs[:4])
    assert all(r.arrival_s == burst_at for r in reqs[4:])
    with pytest.raises(ValueError, match="rate"):
        monitoring.two_phase_load("x", 1, math.inf, 1)
    pytest.importorskip("fastapi")
    from course_lib.engine import Engine, SchedulerConfig
    from course_lib.serving import loadgen, server

    with server.serve(Engine("tiny-target", config=SchedulerConfig(max_num_seqs=4, max_model_len=128))) as handle:
        with monitoring.Poller(handle.url, interval_s=0.05) as poller:
            result = loadgen.run_load(handle.url, reqs)
    assert result.n_ok == 10 and len(poller.samples) >= 2
    s = monitoring.series(poller.samples)
    assert s["tokens_per_s"][-1] >= 0 and max(s["tokens_per_s"]) > 0
    with pytest.raises(ValueError, match="url"):
        monitoring.Poller("localhost:8000")
