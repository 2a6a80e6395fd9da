"""Chapter 03's verdicts (compression.verdicts): each holds on an example of its claim and fails on a
counter-example, so none can pass by construction."""

import pytest

from course_lib.compression import verdicts as v


def test_amdahl_speedup():
    # 40 ms step, 500 MB at 25 GB/s = 20 ms of weights, 20 ms of the rest: 4x fewer bytes -> 40/(20+5)
    assert v.amdahl_speedup(0.04, 500e6, 125e6, 25e9) == pytest.approx(1.6)
    assert v.amdahl_speedup(0.02, 500e6, 125e6, 25e9) == pytest.approx(4.0)  # all weights: the byte ratio
    with pytest.raises(ValueError, match="bandwidth"):
        v.amdahl_speedup(0.04, 500e6, 125e6, 0)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_gemv_goal(fmt):
    goal = v.GEMV_GOALS[fmt]
    assert v.gemv_goal(fmt, goal * 1.2).held
    assert not v.gemv_goal(fmt, goal * 0.8).held
    assert v.gemv_goal(fmt, goal * 1.05, spread=0.2).inside_noise
    with pytest.raises(ValueError, match="fmt"):
        v.gemv_goal("int2", 9.0)


def test_int4_over_int8_follows_bytes():
    assert v.int4_follows_bytes_over_int8(1.7, 1.78, hot_over_cold=0.5).held
    assert not v.int4_follows_bytes_over_int8(1.05, 1.78, hot_over_cold=0.95).held  # the 1.05x
    assert not v.int4_follows_bytes_over_int8(1.0, 1.78, hot_over_cold=0.3).held


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_decode_goal(fmt):
    goal = v.DECODE_GOALS[fmt]
    assert v.decode_goal(fmt, goal + 0.5, amdahl_cap=goal + 1).held
    assert not v.decode_goal(fmt, 1.96 if fmt == "int8" else 3.22, amdahl_cap=goal - 0.5).held  # the benchmark's misses


def test_matches_amdahl():
    assert v.matches_amdahl("int8", 1.6, 1.6).held
    assert not v.matches_amdahl("int8", 1.0, 1.6).held  # too slow
    assert not v.matches_amdahl("int8", 2.4, 1.6).held  # faster than bytes explain


def test_quality_verdicts():
    assert v.int8_nearly_free(0.002).held and not v.int8_nearly_free(0.02).held
    assert v.smaller_groups_pay(5.0, "g64", "g32").held
    assert not v.smaller_groups_pay(0.6, "g64", "g32").held  # the 1.006: inside the sampling noise
    assert v.gptq_cuts_rtn_loss(0.30, 0.19).held
    assert not v.gptq_cuts_rtn_loss(0.30, 0.28).held  # "within 5%" would have passed RTN too
    assert v.smoothing_helps(0.2, 0.02, 100).held and not v.smoothing_helps(0.02, 0.015, 100).held


def test_middle_spread_ignores_a_far_outlier():
    assert v.middle_spread([1.0, 1.0, 1.1, 1.0, 0.9, 1.0, 50.0]) < 0.1
    assert v.ratio_spread([1, 1, 1, 1], [2, 2, 2, 2]) == 0.0
    with pytest.raises(ValueError, match="at least 4"):
        v.middle_spread([1.0, 2.0])
