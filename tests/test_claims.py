"""Verdicts print whether a claim held here, and show nothing as a cell's value."""

import math

import pytest

from course_lib.measure.claims import Verdict, claim, compare_prediction


def test_claim_held_and_not(capsys):
    v = claim("prefill reaches half the roof", 0.6, at_least=0.5)
    assert v and v.held and math.isclose(v.margin, 1.2)
    assert "✅ holds" in capsys.readouterr().out
    v = claim("prefill reaches half the roof", 0.24, at_least=0.5, unit="", why_not="per-op overhead")
    assert not v and math.isclose(v.margin, 0.48)
    out = capsys.readouterr().out
    assert "✗ does not hold" in out and "likely reason: per-op overhead" in out
    v = claim("in a band", 3.0, at_least=1.0, at_most=4.0)
    assert v and math.isclose(v.margin, 4 / 3)
    assert not claim("below", 5.0, at_most=4.0)


def test_claim_says_whose_measurement_it_is(capsys):
    claim("x is small", 1.0, at_most=2.0)
    assert "✅ holds on this machine: x is small" in capsys.readouterr().out
    claim("x is small", 3.0, at_most=2.0, where="in the recorded run (2026-12-06)")
    assert "✗ does not hold in the recorded run (2026-12-06): x is small" in capsys.readouterr().out
    with pytest.raises(ValueError, match="where"):
        claim("x", 1.0, at_least=1, where="")


def test_claim_bad_input():
    with pytest.raises(ValueError, match="threshold"):
        claim("x", 1.0)
    with pytest.raises(ValueError, match="measured"):
        claim("x", float("nan"), at_least=1)
    with pytest.raises(ValueError, match="measured"):
        claim("x", "fast", at_least=1)
    with pytest.raises(ValueError, match="statement"):
        claim("", 1.0, at_least=1)


def test_verdict_is_bool_like_and_silent():
    assert Verdict(True) == True  # noqa: E712
    assert Verdict(False) == False  # noqa: E712
    assert Verdict(True) != Verdict(False)
    assert Verdict(False)._ipython_display_() is None


def test_compare_prediction_ratios_never_round_to_zero(capsys):
    compare_prediction("gap", 1.0, measured=3000.0)
    assert "1/3,000× the measurement" in capsys.readouterr().out
    compare_prediction("gap", 3000.0, measured=1.0)
    assert "3,000× the measurement" in capsys.readouterr().out


def test_compare_prediction(capsys):
    compare_prediction("decode step", 2.0, theory=1.0, measured=4.0, unit=" ms")
    out = capsys.readouterr().out
    assert "your prediction" in out and "0.50× the measurement" in out and "0.25×" in out
    compare_prediction("decode step", None, theory=1.0, measured=4.0)
    assert "no prediction written" in capsys.readouterr().out
    with pytest.raises(ValueError, match="theory"):
        compare_prediction("x", 1.0, theory="big")


def test_claim_inside_the_noise(capsys):
    from course_lib.measure.claims import claim, relative_spread

    assert relative_spread([0.9, 1.0, 1.1]) == pytest.approx(0.1)
    v = claim("x is at least 1.0", 1.05, at_least=1.0, spread=0.1)
    out = capsys.readouterr().out
    assert v.inside_noise and v.held and "inside the noise" in out and "this run held" in out
    v = claim("x is at least 1.0", 0.95, at_least=1.0, spread=0.1)
    assert v.inside_noise and not v.held and "this run missed" in capsys.readouterr().out
    # far from the threshold, the spread does not matter: a false claim still fails plainly
    v = claim("x is at least 2.0", 1.0, at_least=2.0, spread=0.1)
    assert not v.inside_noise and not v.held and "does not hold" in capsys.readouterr().out
    with pytest.raises(ValueError, match="spread"):
        claim("x", 1.0, at_least=1.0, spread=-0.1)
    with pytest.raises(ValueError, match="at least 2"):
        relative_spread([1.0])
