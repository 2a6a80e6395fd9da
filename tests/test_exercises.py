"""The checker: right answers pass, wrong ones raise, unanswered ones wait; expected values from the library."""

import pytest

from course_lib import exercises
from course_lib.exercises import ch00, ch01
from course_lib.measure.hardware import gpu_spec
from course_lib.models import accounting


def test_check_right_wrong_unanswered(capsys):
    assert exercises.check("x", 1.01, 1.0) == True  # noqa: E712 (a Verdict, not a bool)
    assert "✅" in capsys.readouterr().out
    assert exercises.check("x", None, 1.0) == False  # noqa: E712
    assert "⏳" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="❌ x"):
        exercises.check("x", 1.5, 1.0)
    with pytest.raises(AssertionError):
        exercises.check("x", "1.0", 1.0)  # a string is not a number
    assert exercises.check("s", " Memory-Bound ", "memory-bound")
    with pytest.raises(ValueError, match="rtol"):
        exercises.check("x", 1, 1, rtol=-1)


def test_ch00():
    assert ch00.check_ridge(989e12 / 3.35e12)
    assert ch00.check_ridge(gpu_spec("A100 80GB SXM").ridge(), gpu="A100 80GB SXM")
    with pytest.raises(AssertionError):
        ch00.check_ridge(989 / 3.35 * 1000)  # units slip
    assert ch00.check_triad_bytes(3 * 4 * 1000, n=1000)
    with pytest.raises(AssertionError):
        ch00.check_triad_bytes(2 * 4 * 1000, n=1000)
    shape = accounting.ModelShape.from_name("llama-2-7b")
    ms = accounting.weights_read_per_step(shape, 1, "bf16") / 4.8e12 * 1e3
    assert ch00.check_weight_read_ms(ms)
    with pytest.raises(AssertionError):
        ch00.check_weight_read_ms(ms / 1e3)


def test_ch01():
    assert ch01.check_gemv_intensity(2 * 4096**2 / ((4096**2 + 2 * 4096) * 2))
    with pytest.raises(AssertionError):
        ch01.check_gemv_intensity(2.0)
    shape = accounting.ModelShape.from_name("llama-2-7b")
    assert ch01.check_decode_intensity(accounting.decode_intensity(shape, 512, 8, "bf16"))
    with pytest.raises(AssertionError):
        ch01.check_decode_intensity(8.0 * 10)
    from course_lib.bottlenecks.llm_phases import batch_to_reach

    b = batch_to_reach(gpu_spec("H100 SXM").ridge(), "llama-2-7b", context_len=1)
    assert ch01.check_batch_to_ridge(b)
    assert b == 299  # a step reads `batch` embedding rows; counting the whole table gave 305
    with pytest.raises(AssertionError):
        ch01.check_batch_to_ridge(b + 1)
    assert ch01.check_bound("compute-bound", phase="prefill")
    assert ch01.check_bound("memory-bound", phase="decode")
    with pytest.raises(AssertionError):
        ch01.check_bound("memory-bound", phase="prefill")


def test_ch04_exercises():
    from course_lib.engine.speculative import best_gamma, expected_tokens
    from course_lib.exercises import ch04

    assert not ch04.check_expected_tokens(None)
    assert ch04.check_expected_tokens(expected_tokens(0.8, 4))
    assert ch04.check_expected_tokens(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    with pytest.raises(AssertionError):
        ch04.check_expected_tokens(0.8 * 4)  # α·γ: forgets that one rejection ends the run
    assert ch04.check_best_gamma(best_gamma(0.7, 0.1))
    with pytest.raises(AssertionError):
        ch04.check_best_gamma(best_gamma(0.7, 0.1) + 3)
    with pytest.raises(ValueError, match="answer"):
        ch04.check_best_gamma(3.0)
    assert ch04.check_ridge_batch(6, ridge=15.0, gamma=4)  # 2·15/5 = 6
    with pytest.raises(AssertionError):
        ch04.check_ridge_batch(30, ridge=15.0, gamma=4)
    with pytest.raises(ValueError, match="ridge"):
        ch04.check_ridge_batch(6, ridge=0)


def test_ch05_exercises():
    from course_lib.exercises import ch05
    from course_lib.kv.formulas import fit_requests, kv_gb

    assert not ch05.check_kv_bytes_per_token(None)
    assert ch05.check_kv_bytes_per_token(2 * 32 * 8 * 128 * 2, "llama-3-8b", "bf16")  # 128 KiB
    with pytest.raises(AssertionError, match="KV heads"):
        ch05.check_kv_bytes_per_token(2 * 32 * 32 * 128 * 2, "llama-3-8b", "bf16")  # counted the query heads
    assert ch05.check_fit_requests(fit_requests("llama-3-8b", "H100 SXM", "bf16", 8192))
    with pytest.raises(ValueError, match="answer"):
        ch05.check_fit_requests(3.5)
    assert ch05.check_kv_stream_ms(kv_gb("llama-2-7b", "fp16", 4096, 16) * 1e9 / 1e12 * 1e3, bandwidth=1e12)
    with pytest.raises(ValueError, match="bandwidth"):
        ch05.check_kv_stream_ms(1.0, bandwidth=-1)


def test_ch07_exercises():
    from course_lib.exercises import ch07
    from course_lib.parallel.interconnects import collective_time

    assert not ch07.check_bubble(None)
    assert ch07.check_bubble(3 / 15, p=4, m=12)
    with pytest.raises(AssertionError, match="bubble"):
        ch07.check_bubble(3 / 12, p=4, m=12)  # (p − 1)/m forgets the fill and drain slots
    assert ch07.check_allreduce_us(collective_time("all_reduce", 16e6, 8, "nvlink4") * 1e6)
    with pytest.raises(AssertionError):
        ch07.check_allreduce_us(16e6 / 450e9 * 1e6 * 100)
    assert ch07.check_link_vs_memory(1e-9 * 20e9, beta=1e-9, bandwidth=20e9)
    with pytest.raises(ValueError, match="beta"):
        ch07.check_link_vs_memory(1.0, beta=0, bandwidth=1e9)


def test_ch06_exercises():
    from course_lib.exercises import ch06

    assert ch06.static_steps([12, 3, 40, 5, 8, 30, 2, 6], 4) == 40 + 30
    assert ch06.check_static_steps(70)
    with pytest.raises(AssertionError):
        ch06.check_static_steps(sum([12, 3, 40, 5, 8, 30, 2, 6]) // 4)  # what continuous batching needs
    with pytest.raises(ValueError, match="lengths"):
        ch06.static_steps([0, 3], 2)
    assert ch06.check_goodput(2 / 10, [0.5, 2.0, 0.3], [0.01, 0.01, 0.04], duration_s=10)
    with pytest.raises(AssertionError, match="goodput"):
        ch06.check_goodput(3 / 10, [0.5, 2.0, 0.3], [0.01, 0.01, 0.04], duration_s=10)
    assert ch06.check_decode_ceiling(16 * 20e9 / 20e6, bandwidth=20e9, weight_bytes=20e6)
    with pytest.raises(ValueError, match="weight_bytes"):
        ch06.check_decode_ceiling(1.0, bandwidth=1e9, weight_bytes=0)
