"""Chapter 01's roofline verdicts (issue 28): each holds on a run the roofline describes, and fails on a
counter-example."""

from __future__ import annotations

import pytest

from course_lib.bottlenecks.sweep_verdicts import batch_cost_verdict, level_off_verdict

KS = (1, 2, 4, 8, 16, 32, 64, 128)


def _roofline(peak, bw, k_scale=1.0):
    """GFLOP/s of a sweep that follows a roof: min(peak, bw · k/4)."""
    return {k: min(peak, bw * k * k_scale / 4) for k in KS}


def test_a_sweep_on_the_roofline_levels_off_near_the_ridge():
    peak, bw = 160.0, 29.0  # GFLOP/s, GB/s: ridge 5.5 FLOP/byte, k_ridge 22
    assert level_off_verdict(_roofline(peak, bw), peak, 4 * peak / bw)


def test_a_plateau_far_below_the_roof_fails_even_when_it_flattens_at_the_ridge():
    peak, bw = 160.0, 29.0
    k_ridge = 4 * peak / bw
    overhead_bound = {k: min(0.06 * peak, 0.06 * bw * k / 4 * 4) for k in KS}  # flat from k ≈ 4-8, at 6%
    v = level_off_verdict(overhead_bound, peak, k_ridge)
    assert not v


def test_reaching_the_roof_far_from_the_ridge_fails():
    peak, bw = 160.0, 29.0
    early = _roofline(peak, bw, k_scale=20.0)  # reaches the roof at k ≈ 1: twenty times too early
    assert not level_off_verdict(early, peak, 4 * peak / bw)
    with pytest.raises(ValueError):
        level_off_verdict({}, peak, 22)


def test_batch_cost_holds_at_the_roofline_prediction_and_fails_at_the_old_loose_threshold():
    assert batch_cost_verdict(8, 1.10, 1.02)
    # 1.62x passed the old "< b/2 = 4x" test; the roofline predicted 1.02x
    assert not batch_cost_verdict(8, 1.62, 1.02)
    assert not batch_cost_verdict(8, 3.9, 1.02)
    with pytest.raises(ValueError):
        batch_cost_verdict(8, 1.0, 0.0)


def test_the_low_plateau_reason_is_printed(capsys):
    flat = {k: 5.0 for k in KS}
    assert not level_off_verdict(flat, 160.0, 22, low_plateau_reason="separate passes")
    out = capsys.readouterr().out
    assert "3% of the roof" in out and "separate passes" in out
