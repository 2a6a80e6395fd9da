"""The timing helper: warm-up excluded, synchronisation around every timed call, derived rates."""

import time

import pytest

from course_lib.measure import bench


class FakeClock:
    """A clock that only moves when fn() says so: timing tests become exact."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_warmup_is_excluded():
    clock = FakeClock()
    calls = []

    def fn():  # the first three calls are slow (compilation, page faults), then fast
        calls.append(1)
        clock.now += 100.0 if len(calls) <= 3 else 1.0

    t = bench.benchmark(fn, warmup=3, repeats=5, sync=lambda: None, timer=clock, device="cpu")
    assert len(calls) == 8
    assert t.samples_s == (1.0,) * 5 and t.median_s == 1.0
    # without warm-up the slow calls pollute the samples
    calls.clear()
    t2 = bench.benchmark(fn, warmup=0, repeats=5, sync=lambda: None, timer=clock, device="cpu")
    assert max(t2.samples_s) == 100.0 and t2.median_s == 100.0


def test_warmup_excluded_with_real_sleeps():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.05 if len(calls) <= 2 else 0.001)

    t = bench.benchmark(fn, warmup=2, repeats=5, device="cpu")
    assert t.median_s < 0.5 * 0.05  # a ratio to the slow call, not an absolute time


def test_sync_brackets_every_timed_call():
    events = []
    clock = FakeClock()

    def timer():
        events.append("clock")
        return clock()

    def fn():
        events.append("fn")
        clock.now += 1

    bench.benchmark(fn, warmup=2, repeats=3, sync=lambda: events.append("sync"), timer=timer, device="cpu")
    assert events.count("sync") >= 3 + 1
    timed = events[events.index("clock") :]
    # every measured call: sync, clock, fn, sync, clock — the clock is read only after a sync
    assert timed == ["clock", "fn", "sync", "clock", "sync"] * 2 + ["clock", "fn", "sync", "clock"]
    assert events[:3] == ["fn", "fn", "sync"]  # warm-up calls, then drain the queue


def test_counting_sync_stub():
    count = {"n": 0}

    def sync():
        count["n"] += 1

    bench.benchmark(lambda: None, warmup=1, repeats=4, sync=sync, device="cpu")
    assert count["n"] == 1 + 2 * 4


def _timed(durations, **kwargs) -> bench.Timing:
    """``benchmark`` of a call whose n-th run takes ``durations[n]`` seconds on a fake clock, no warm-up."""
    clock = FakeClock()
    steps = iter(durations)

    def fn():
        clock.now += next(steps)

    return bench.benchmark(fn, warmup=0, repeats=len(durations), sync=lambda: None, timer=clock, device="cpu", **kwargs)


def test_statistics_and_rates():
    t = _timed([1.0, 2.0, 3.0, 4.0, 10.0], flops=6e12, bytes=3e9, peaks=False, label="x")
    assert t.median_s == 3.0 and t.best_s == 1.0
    assert t.p10_s == pytest.approx(1.4) and t.p90_s == pytest.approx(7.6)
    assert t.iqr_s == pytest.approx(2.0)
    assert t.tflops == pytest.approx(2.0) and t.gbps == pytest.approx(1.0) and t.gflops == pytest.approx(2000)
    assert t.intensity == pytest.approx(2000)
    assert t.spread == pytest.approx((7.6 - 1.4) / 3)
    assert t.pct_measured_bw is None and t.pct_datasheet_flops is None
    assert "GB/s" in str(t) and "GFLOP/s" in str(t)


def test_percent_of_peak_from_given_peaks():
    from course_lib.measure.hardware import MeasuredPeaks

    peaks = MeasuredPeaks("cpu", 10.0, 20.0, {"fp32": 1.0}, 1, 1)  # 20 GB/s, 1 TFLOP/s
    t = _timed([1.0] * 3, flops=0.5e12, bytes=5e9, peaks=peaks, dtype="fp32")
    assert t.pct_measured_bw == pytest.approx(25.0)
    assert t.pct_measured_flops == pytest.approx(50.0)
    assert "25% of measured peak" in str(t)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(repeats=0), "repeats must be an int >= 1"),
        (dict(warmup=-1), "warmup must be an int >= 0"),
        (dict(flops=-1.0), "flops must be a non-negative"),
        (dict(bytes=float("nan")), "bytes must be a non-negative"),
        (dict(device="tpu"), "device"),
        (dict(dtype="fp33"), "unknown dtype"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, RuntimeError), match=match):
        bench.benchmark(lambda: None, **kwargs)


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match="callable"):
        bench.benchmark(42)


def test_unsynchronised_equals_on_cpu():
    t = bench.time_unsynchronised(lambda: sum(range(1000)), repeats=3, device="cpu")
    assert len(t.samples_s) == 3 and "unsynchronised" in t.label
