"""Serving metrics on synthetic event streams whose answers are known by hand."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from course_lib.measure.metrics import (
    SLO,
    RequestTrace,
    mbu,
    meets,
    mfu,
    percentiles,
    reading_speed_budget_s,
    summarize,
)

approx = pytest.approx


def hand_traces() -> list[RequestTrace]:
    """Five requests; with SLO(ttft 0.5 s, tpot 0.1 s) only A and D meet it."""
    return [
        RequestTrace("A", 0.0, 10, [0.2, 0.25, 0.3]),  # ttft 0.2, tpot 0.05  → meets
        RequestTrace("B", 0.5, 20, [1.5, 1.55]),  # ttft 1.0             → too slow to start
        RequestTrace("C", 1.0, 30, [1.3, 1.6, 1.9, 2.2]),  # ttft 0.3, tpot 0.3   → too slow to stream
        RequestTrace("D", 1.5, 40, [1.9]),  # ttft 0.4, one token  → meets (no TPOT)
        RequestTrace("E", 2.0, 50, []),  # never produced a token → fails
    ]


# --- one request ------------------------------------------------------------------------------------


def test_trace_hand_case():
    t = RequestTrace("r0", arrival=0.0, prompt_tokens=12, token_times=[0.5, 0.6, 0.7, 0.8], finish=0.85)
    assert t.n_output == 4
    assert t.ttft == approx(0.5)
    assert t.tpot == approx(0.1)
    assert t.itl == approx([0.1, 0.1, 0.1])
    assert t.latency == approx(0.8)
    assert t.latency == approx(t.ttft + t.tpot * (t.n_output - 1))


def test_one_token_has_no_tpot_and_no_tokens_has_no_ttft():
    one = RequestTrace("one", 1.0, 5, [1.25])
    assert math.isnan(one.tpot) and one.itl == [] and one.latency == approx(0.25) == one.ttft
    empty = RequestTrace("empty", 1.0, 5)
    assert empty.n_output == 0
    for attr in ("ttft", "tpot", "latency"):
        with pytest.raises(ValueError, match=r"RequestTrace\('empty'\) has no output tokens yet"):
            getattr(empty, attr)


def test_tpot_is_the_mean_itl_even_when_gaps_vary():
    t = RequestTrace("r", 0.0, 1, [0.3, 0.35, 0.55, 0.6])
    assert t.itl == approx([0.05, 0.2, 0.05])
    assert t.tpot == approx(np.mean(t.itl)) == approx(0.1)


def test_real_clock_events():
    arrival = time.perf_counter()
    trace = RequestTrace("live", arrival, prompt_tokens=3)
    for _ in range(5):
        sum(range(2000))  # stands in for a decode step
        trace.token_times.append(time.perf_counter())
    assert trace.ttft > 0 and trace.tpot > 0
    assert trace.latency == approx(trace.ttft + trace.tpot * 4)
    assert summarize([trace]).completed == 1


# --- percentiles --------------------------------------------------------------------------------------


def test_percentiles_known_array_and_numpy():
    assert percentiles(range(1, 101)) == approx({50: 50.5, 90: 90.1, 95: 95.05, 99: 99.01})
    values = np.random.default_rng(0).lognormal(size=1000)
    got = percentiles(values, ps=(0, 25, 99.9, 100))
    assert list(got) == [0, 25, 99.9, 100]
    assert list(got.values()) == approx(np.percentile(values, [0, 25, 99.9, 100]).tolist())
    assert percentiles([3.0]) == {50: 3.0, 90: 3.0, 95: 3.0, 99: 3.0}


def test_one_outlier_moves_the_mean_not_the_median():
    latencies = [1.0] * 9 + [100.0]
    p = percentiles(latencies)
    assert np.mean(latencies) == approx(10.9)
    assert p[50] == 1.0  # what a typical user sees
    assert p[99] > 90.0  # the tail sees the outlier
    assert np.mean(latencies) > p[90]


# --- SLO and summary --------------------------------------------------------------------------------


def test_meets_by_hand():
    slo = SLO(ttft_s=0.5, tpot_s=0.1)
    assert [meets(t, slo) for t in hand_traces()] == [True, False, False, True, False]
    assert SLO(ttft_s=1.0).tpot_s == reading_speed_budget_s == 0.120


def test_summary_by_hand():
    s = summarize(hand_traces(), slo=SLO(ttft_s=0.5, tpot_s=0.1))
    assert (s.count, s.completed) == (5, 4)
    assert s.window == approx((0.0, 2.2))  # first arrival → last token
    assert s.mean_ttft == approx((0.2 + 1.0 + 0.3 + 0.4) / 4)
    assert s.ttft[50] == approx(0.35)
    assert s.mean_tpot == approx((0.05 + 0.05 + 0.3) / 3)  # D has one token: no TPOT
    assert s.tpot[50] == approx(0.05)
    assert s.mean_latency == approx((0.3 + 1.05 + 1.2 + 0.4) / 4)
    assert s.output_tokens_per_s == approx(10 / 2.2)  # 3 + 2 + 4 + 1 tokens
    assert s.total_tokens_per_s == approx((10 + 100) / 2.2)  # + prompts of A-D (E never started)
    assert s.requests_per_min == approx(60 * 4 / 2.2)
    assert s.goodput_rps == approx(2 / 2.2)  # A and D
    assert s.slo_attainment == approx(2 / 5)  # E counts against it


def test_summary_over_a_window():
    s = summarize(hand_traces(), slo=SLO(ttft_s=0.5, tpot_s=0.1), window=(1.0, 2.0))
    assert s.output_tokens_per_s == approx(6.0)  # B 1.5, 1.55; C 1.3, 1.6, 1.9; D 1.9
    assert s.total_tokens_per_s == approx(6.0 + 90)  # first tokens of B, C, D fall inside
    assert s.requests_per_min == approx(120.0)  # B and D finish inside
    assert s.goodput_rps == approx(1.0)  # D
    assert s.ttft[50] == approx(0.35)  # the window changes rates, not latencies


def test_summary_without_slo_and_table():
    s = summarize(hand_traces()[:3])
    assert s.goodput_rps is None and s.slo_attainment is None
    table = summarize(hand_traces(), slo=SLO(0.5, 0.1)).table()
    assert "TTFT ms" in table and "p99" in table and "350.0" in table
    assert "goodput: 0.909 req/s" in table and "40.0% of requests" in table
    only_single_tokens = summarize([RequestTrace("x", 0.0, 1, [0.5])])
    assert math.isnan(only_single_tokens.tpot[50]) and "nan" in only_single_tokens.table()


# --- MFU, MBU --------------------------------------------------------------------------------------


def test_mbu_hand_case():
    assert mbu(7e9, 2, 100, 2.0e12) == approx(0.70)
    # Reading a 14 GB KV cache per step as well doubles the bytes: 1.4, not clipped (the peak is wrong).
    assert mbu(7e9, 2, 100, 2.0e12, kv_bytes_per_token_step=14e9) == approx(1.40)
    assert mbu(7e9, 2, 0, 2.0e12) == 0.0


def test_mfu_both_forms_agree():
    by_tokens = mfu(tokens_per_s=1000, flops_per_token=2 * 7e9, peak_flops_per_s=1e15)
    assert by_tokens == approx(0.014)
    assert mfu(flops_per_s=1.4e13, peak_flops_per_s=1e15) == approx(by_tokens)
    assert mfu(flops_per_s=2e15, peak_flops_per_s=1e15) == approx(2.0)


# --- bad inputs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(token_times=[0.5, 0.4]), r"token_times must be ≥ arrival .* non-decreasing; token_times\[1\]=0.4"),
        (dict(token_times=[-0.1]), r"token_times\[0\]=-0.1 < 0.0"),
        (dict(token_times=[float("nan")]), r"token_times\[0\] must be a finite number"),
        (dict(prompt_tokens=-1), "prompt_tokens must be an int ≥ 0"),
        (dict(prompt_tokens=2.5), "prompt_tokens must be an int ≥ 0"),
        (dict(arrival=float("inf")), "arrival must be a finite number"),
        (dict(token_times=[0.5], finish=0.4), r"finish=0.4 must be ≥ arrival and the last token time"),
    ],
)
def test_trace_rejects_bad_events(kwargs, message):
    base = dict(request_id="bad", arrival=0.0, prompt_tokens=1, token_times=[])
    with pytest.raises(ValueError, match=message):
        RequestTrace(**{**base, **kwargs})


@pytest.mark.parametrize(
    "values, ps, message",
    [
        ([], (50,), "values must be a non-empty"),
        ([1.0, float("nan")], (50,), "values must all be finite"),
        ([1.0], (101,), r"ps must hold percentiles in \[0, 100\]"),
        ([1.0], (-1,), r"ps must hold percentiles in \[0, 100\]"),
        ([1.0], ("p50",), r"ps must hold percentiles in \[0, 100\]"),
        ([1.0], (), "ps must be a non-empty"),
    ],
)
def test_percentiles_reject_bad_input(values, ps, message):
    with pytest.raises(ValueError, match=message):
        percentiles(values, ps)


def test_slo_and_summary_reject_bad_input():
    for bad in (dict(ttft_s=0.0, tpot_s=0.1), dict(ttft_s=0.5, tpot_s=-1.0), dict(ttft_s=float("nan"), tpot_s=0.1)):
        with pytest.raises(ValueError, match=r"SLO\.(ttft_s|tpot_s) must be a finite number > 0"):
            SLO(**bad)
    with pytest.raises(ValueError, match="slo must be an SLO"):
        meets(hand_traces()[0], (0.5, 0.1))
    with pytest.raises(ValueError, match="traces must be a non-empty sequence of RequestTrace"):
        summarize([])
    with pytest.raises(ValueError, match="traces must be a non-empty sequence of RequestTrace"):
        summarize([{"arrival": 0.0}])
    with pytest.raises(ValueError, match="no trace has output tokens"):
        summarize([RequestTrace("e", 0.0, 1)])
    with pytest.raises(ValueError, match=r"window must be \(start, end\) .* end > start"):
        summarize(hand_traces(), window=(2.0, 1.0))
    with pytest.raises(ValueError, match=r"window must be \(start, end\)"):
        summarize(hand_traces(), window=3.0)
    with pytest.raises(ValueError, match="slo must be None or an SLO"):
        summarize(hand_traces(), slo=0.5)
    late = RequestTrace("late", 1.0, 1, [1.5])
    late.token_times.append(1.2)  # appended out of order after construction: caught when summarised
    with pytest.raises(ValueError, match=r"'late'\)\.token_times must be ≥ arrival"):
        summarize([late])


def test_mfu_mbu_reject_bad_input():
    with pytest.raises(ValueError, match="give either flops_per_s, or both tokens_per_s and flops_per_token"):
        mfu(peak_flops_per_s=1e15)
    with pytest.raises(ValueError, match="give either flops_per_s, or both"):
        mfu(peak_flops_per_s=1e15, flops_per_s=1e12, tokens_per_s=10, flops_per_token=1e9)
    with pytest.raises(ValueError, match="give either flops_per_s, or both"):
        mfu(peak_flops_per_s=1e15, tokens_per_s=10)
    with pytest.raises(ValueError, match="peak_flops_per_s must be a finite number > 0"):
        mfu(peak_flops_per_s=0, flops_per_s=1.0)
    with pytest.raises(ValueError, match="flops_per_token must be a finite number > 0"):
        mfu(peak_flops_per_s=1e15, tokens_per_s=10, flops_per_token=-1)
    with pytest.raises(TypeError):
        mfu(1.0, 1e15)  # keyword-only: two bare floats are too easy to swap
    for args, name in [
        ((0, 2, 100, 2e12), "param_count"),
        ((7e9, 0, 100, 2e12), "bytes_per_param"),
        ((7e9, 2, -1, 2e12), "tokens_per_s"),
        ((7e9, 2, 100, 0), "bandwidth_bytes_per_s"),
        ((7e9, 2, 100, 2e12, -5.0), "kv_bytes_per_token_step"),
    ]:
        with pytest.raises(ValueError, match=f"^{name} must be a finite number"):
            mbu(*args)


def test_meets_is_inclusive_despite_float_rounding():
    from course_lib.measure.metrics import SLO, RequestTrace, meets

    times = [2.9 + 0.1 * i for i in range(16)]  # 15 gaps of 0.1 s, averaged with rounding error
    trace = RequestTrace("edge", arrival=2.4, prompt_tokens=3, token_times=times)
    assert meets(trace, SLO(ttft_s=0.5, tpot_s=0.1))
    assert not meets(trace, SLO(ttft_s=0.5, tpot_s=0.0999))
