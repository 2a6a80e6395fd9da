"""Chapter 02 exercises: right answers pass, wrong ones raise, unanswered ones wait; expected values from the library."""

import numpy as np
import pytest

from course_lib.exercises import ch02
from course_lib.measure.hardware import gpu_spec
from course_lib.models import accounting


def test_ttft_tpot(capsys):
    assert ch02.check_ttft_tpot(450, 50)
    assert not ch02.check_ttft_tpot(None, None)
    assert "⏳" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="TPOT"):
        ch02.check_ttft_tpot(450, 250 / 6)  # divided by n instead of n - 1
    with pytest.raises(AssertionError, match="TTFT"):
        ch02.check_ttft_tpot(0.45, 50)  # seconds, not ms


def test_mbu():
    params = accounting.param_count(accounting.ModelShape.from_name("llama-2-7b"))
    assert ch02.check_mbu(params * 1 * 170.8 / 2.039e12)
    with pytest.raises(AssertionError):
        ch02.check_mbu(params * 2 * 170.8 / 2.039e12)  # fp16 bytes for an int8 model
    with pytest.raises(AssertionError):
        ch02.check_mbu(100 * params * 170.8 / 2.039e12)  # a percentage, not a fraction


def test_goodput():
    good = 4  # requests 0, 3, 4 (one token) and 5 meet TTFT <= 0.5 s and TPOT <= 0.1 s
    assert ch02.check_goodput(good / 4.25)
    with pytest.raises(AssertionError):
        ch02.check_goodput(good / 2.5)  # window to the last arrival instead of the last token
    with pytest.raises(AssertionError):
        ch02.check_goodput(6 / 4.25)  # throughput in requests/s, not goodput


def test_p50_mean():
    lat = ch02.EXERCISE_LATENCIES_S
    assert ch02.check_p50_mean(float(np.median(lat)), float(np.mean(lat)))
    with pytest.raises(AssertionError):
        ch02.check_p50_mean(float(np.mean(lat)), float(np.mean(lat)))


def test_ratio():
    h200 = gpu_spec("H200 SXM")
    assert ch02.check_ratio(h200.ridge("bf16"))  # ≈ ridge × (2 bytes / 2)
    # every byte a batch-1 step streams takes part in a multiply-add (one embedding row, not the table)
    assert ch02.ratio_expected() == pytest.approx(h200.ridge("bf16"), rel=1e-3)
    with pytest.raises(AssertionError):
        ch02.check_ratio(100)
