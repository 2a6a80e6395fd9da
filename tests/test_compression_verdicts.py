"""Chapter 03's verdicts (compression.verdicts): each holds on an example of its claim and fails on a
counter-example, so none can pass by construction."""

import pytest

from course_lib.compression import verdicts as v


def test_amdahl_speedup():
    # measured t0 = 5 ms; 500 MB at 25 GB/s = 20 ms of weights: 4x fewer bytes -> 25/(5+5)
    assert v.amdahl_speedup(0.005, 500e6, 125e6, 25e9) == pytest.approx(2.5)
    assert v.amdahl_speedup(0.0, 500e6, 125e6, 25e9) == pytest.approx(4.0)  # no fixed part: the byte ratio
    with pytest.raises(ValueError, match="bandwidth"):
        v.amdahl_speedup(0.005, 500e6, 125e6, 0)
    with pytest.raises(ValueError, match="t0_s"):
        v.amdahl_speedup(-0.001, 500e6, 125e6, 25e9)


def test_inferred_t0_mispredicts_when_the_kernels_stream_below_the_roof():
    """The chapter's old model: t0 = t(fp32) - bytes/bandwidth. A step whose kernels all stream at half
    the bandwidth (t = 5 ms + bytes / 12.5 GB/s) makes that t0 = 25 ms instead of 5, and the old
    prediction falls far below the measurement, while the measured t0 predicts it within the tolerance."""
    t0, bw = 0.005, 25e9
    measured = (t0 + 500e6 / 12.5e9) / (t0 + 125e6 / 12.5e9)  # 45 ms / 15 ms = 3.0x
    inferred_t0 = (t0 + 500e6 / 12.5e9) - 500e6 / bw
    old = (t0 + 500e6 / 12.5e9) / (inferred_t0 + 125e6 / bw)
    assert not v.matches_amdahl("int8", measured, old).held  # 3.0 vs 1.5: the old prediction fails
    assert v.matches_amdahl("int8", measured, v.amdahl_speedup(t0, 500e6, 125e6, bw)).held  # 3.0 vs 2.5


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
def test_decode_goal(fmt, capsys):
    goal = v.DECODE_GOALS[fmt]
    assert v.decode_goal(fmt, goal + 0.5, amdahl_cap=goal + 1).held
    miss = v.decode_goal(fmt, 1.96 if fmt == "int8" else 3.22, amdahl_cap=goal - 0.5)  # the benchmark's misses
    assert not miss.held and "below the goal" in capsys.readouterr().out
    kernel = v.decode_goal(fmt, goal - 0.5, amdahl_cap=goal + 2)  # t0 allows it: the kernels are the reason
    assert not kernel.held and "stream below" in capsys.readouterr().out


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


def test_awq_verdicts():
    assert v.awq_cuts_rtn_loss(0.30, 0.125).held
    assert not v.awq_cuts_rtn_loss(0.30, 0.25).held  # only a sixth less: not the claim
    assert v.awq_at_most_gptq(0.187, 0.125).held
    assert not v.awq_at_most_gptq(0.125, 0.187).held  # AWQ worse than GPTQ
    with pytest.raises(ValueError, match="rtn_rel"):
        v.awq_cuts_rtn_loss(0.0, 0.1)
    with pytest.raises(ValueError, match="gptq_rel"):
        v.awq_at_most_gptq(-0.1, 0.1)
