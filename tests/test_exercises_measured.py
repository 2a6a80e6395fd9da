"""Exercises that re-measure, or use the learner's own peaks: right within tolerance, wrong raises,
unanswered waits without measuring."""

import pytest

from course_lib import exercises
from course_lib.bottlenecks.llm_phases import batch_to_reach
from course_lib.bottlenecks.time_floors import output_input_ratio
from course_lib.exercises import ch00, ch01, ch02
from course_lib.models.accounting import ModelShape, weight_bytes


def test_check_measurement_tolerance_and_laziness(capsys):
    calls = []

    def measure():
        calls.append(1)
        return 10.0

    assert not exercises.check_measurement("t", None, measure)
    assert not calls  # unanswered: nothing is measured
    assert exercises.check_measurement("t", 12.0, measure, rtol=0.35)
    assert "re-measured here: 10" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="❌ t"):
        exercises.check_measurement("t", 20.0, measure, rtol=0.35)
    with pytest.raises(ValueError, match="measure must be a callable"):
        exercises.check_measurement("t", 1.0, 3.0)


def test_own_peaks_exercises():
    assert ch00.check_stream_time_ms(1e9 / 40e9 * 1e3, bandwidth=40e9)
    with pytest.raises(AssertionError):
        ch00.check_stream_time_ms(1e9 / 40e9, bandwidth=40e9)  # seconds, not ms
    with pytest.raises(ValueError, match="bandwidth"):
        ch00.check_stream_time_ms(1.0, bandwidth=0)
    tiny = ModelShape.from_embedded("tiny-target")
    assert ch02.check_weight_stream_ms(weight_bytes(tiny, "fp32") / 30e9 * 1e3, bandwidth=30e9)
    assert ch02.check_ratio_on_this_machine(output_input_ratio(tiny, 2e11, 4e10, "fp32"), 2e11, 4e10)
    with pytest.raises(ValueError, match="peak_flops"):
        ch02.check_ratio_on_this_machine(1.0, -1, 4e10)
    s7 = ModelShape.from_name("llama-2-7b")
    b = batch_to_reach(5.0, s7, context_len=16, dtype="fp32")
    assert ch01.check_ridge_batch_here(b, s7, 5.0)
    with pytest.raises(AssertionError):
        ch01.check_ridge_batch_here(b + 1, s7, 5.0)


def test_remeasuring_checks_measure(monkeypatch):
    from course_lib.measure import microbench

    class FakeTiming:
        bytes = 3 * 2**20

        def rate(self, amount, best=False):
            return 150e9

    class FakePeaks:
        triad_gbs = 50.0

    monkeypatch.setattr(microbench, "measure_bandwidth", lambda *a, **k: FakeTiming())
    monkeypatch.setattr(microbench, "machine_peaks", lambda *a, **k: FakePeaks())
    assert ch00.check_cache_speedup(3.1)  # 150 / 50 = 3, within 35%
    with pytest.raises(AssertionError):
        ch00.check_cache_speedup(1.0)
    assert not ch00.check_cache_speedup(None)


def test_ch03_exercises():
    from course_lib.compression.quantize import QuantConfig, expected_nbytes
    from course_lib.exercises import ch03

    assert ch03.check_int4_bytes(4096 * 11008 // 2 + 2 * 4 * 4096 * (11008 // 128))
    assert ch03.check_int4_bytes(expected_nbytes((64, 256), QuantConfig(4, False, "group", 32)), (64, 256), 32)
    with pytest.raises(AssertionError):
        ch03.check_int4_bytes(4096 * 11008 // 2)  # forgot the scales
    assert ch03.check_rtn_bound(0.5 / 127 / 2)
    with pytest.raises(AssertionError):
        ch03.check_rtn_bound(0.5 / 127)  # a whole step, not half
    assert not ch03.check_stream_ms(None, bandwidth=30e9)
    with pytest.raises(ValueError, match="bandwidth"):
        ch03.check_stream_ms(1.0, bandwidth=-1)


def test_ch04_lookup_speedup_remeasures():
    from course_lib.decoding.prompts import GROUNDED_PROMPTS
    from course_lib.engine import Engine
    from course_lib.exercises import ch04

    target = Engine("tiny-target")
    prompt = GROUNDED_PROMPTS[0]
    assert not ch04.check_lookup_speedup(None, target, prompt, new_tokens=8)
    with pytest.raises(AssertionError, match="speed-up"):
        ch04.check_lookup_speedup(1000.0, target, prompt, new_tokens=8)


def test_ch05_kv_speedup_remeasures():
    from course_lib.exercises import ch05

    assert not ch05.check_kv_speedup(None, length=24)
    with pytest.raises(AssertionError, match="speed-up"):
        ch05.check_kv_speedup(1000.0, length=24)


def test_ch07_allreduce_remeasures():
    from course_lib.exercises import ch07

    assert not ch07.check_allreduce_ms(None)
    with pytest.raises(AssertionError, match="all-reduce"):
        ch07.check_allreduce_ms(1e6, nbytes=4096)
