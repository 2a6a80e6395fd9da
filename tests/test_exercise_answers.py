"""Every chapter's official exercise answer, as its <details> block spells it, passes its own checker
(issue 24 item 10: chapter 05's official answer once failed its check). Machine-dependent inputs (a
bandwidth, a ridge) take fixed values; re-measuring exercises get their measurement stubbed so the answer's
formula and the checker's comparison are tested, not the machine. A wrong answer must fail each check."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.exercises import ch00, ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08
from course_lib.measure import hardware, metrics
from course_lib.models import accounting
from course_lib.models.accounting import ModelShape, kv_bytes_per_token, weight_bytes, weights_read_per_step

BW, RIDGE, PEAK = 20e9, 12.0, 240e9  # a CPU-like bandwidth (B/s), ridge (FLOP/B) and peak (FLOP/s)


def _cases():
    a100, h200 = hardware.gpu_spec("A100 80GB SXM"), hardware.gpu_spec("H200 SXM")
    l7, l3 = ModelShape.from_name("llama-2-7b"), ModelShape.from_name("llama-3-8b")
    h100_ridge = hardware.gpu_spec("H100 SXM").ridge("bf16")
    from course_lib.bottlenecks import time_floors
    from course_lib.kv import formulas
    from course_lib.parallel.interconnects import link

    lk = link("nvlink4")
    tiny = ModelShape.from_embedded("tiny-target")
    yield (
        "00.1",
        lambda a: ch00.check_ridge(a, gpu="A100 80GB SXM"),
        a100.tflops["bf16"] * 1e12 / (a100.hbm_tbps * 1e12),
    )
    yield "00.2", lambda a: ch00.check_triad_bytes(a, n=10_000_000), 3 * 4 * 10_000_000
    yield (
        "00.3",
        lambda a: ch00.check_weight_read_ms(a, model="llama-2-7b", gpu="H200 SXM"),
        weights_read_per_step(l7, 1, "bf16") / h200.bandwidth * 1e3,
    )
    yield "00.5", lambda a: ch00.check_stream_time_ms(a, bandwidth=BW, n_bytes=1e9), 1e9 / BW * 1e3
    yield "01.1", lambda a: ch01.check_gemv_intensity(a, n=4096, dtype="fp16"), 2 * 4096**2 / ((4096**2 + 2 * 4096) * 2)
    yield (
        "01.2",
        lambda a: ch01.check_decode_intensity(a, model="llama-2-7b", batch=8, context_len=512, dtype="bf16"),
        accounting.decode_flops(l7, 512, 8) / accounting.decode_step_bytes(l7, 512, 8, "bf16"),
    )
    yield (
        "01.3",
        lambda a: ch01.check_batch_to_ridge(a, model="llama-2-7b", gpu="H100 SXM", dtype="bf16", context_len=1),
        next(b for b in range(1, 10_000) if accounting.decode_intensity(l7, 1, b, "bf16") >= h100_ridge),
    )
    yield (
        "01.4",
        lambda a: ch01.check_bound(a, phase="prefill", model="llama-2-7b", gpu="A100 80GB SXM", batch=1, tokens=512),
        "compute-bound",
    )
    yield (
        "01.6",
        lambda a: ch01.check_ridge_batch_here(a, tiny, RIDGE, context_len=16, dtype="fp32"),
        next(b for b in range(1, 100_000) if accounting.decode_intensity(tiny, 16, b, "fp32") >= RIDGE),
    )
    yield (
        "02-1.1",
        lambda a: ch02.check_ttft_tpot(*a),
        (ch02.exercise_trace().ttft * 1e3, ch02.exercise_trace().tpot * 1e3),
    )
    lat = ch02.EXERCISE_LATENCIES_S
    yield "02-1.2", lambda a: ch02.check_p50_mean(*a), (metrics.percentiles(lat, (50,))[50], float(np.mean(lat)))
    yield (
        "02-1.4",
        lambda a: ch02.check_weight_stream_ms(a, bandwidth=BW, model="tiny-target"),
        accounting.weight_bytes(tiny, "fp32") / BW * 1e3,
    )
    yield (
        "02-2.1",
        ch02.check_mbu,
        metrics.mbu(accounting.param_count(l7), 1, 170.8, hardware.gpu_spec("A100 80GB SXM").bandwidth),
    )
    yield "02-2.2", ch02.check_goodput, metrics.summarize(ch02.exercise_traces(), slo=ch02.EXERCISE_SLO).goodput_rps
    step = accounting.weights_read_per_step(l7, 1, "bf16") / h200.bandwidth
    yield "02-2.3", ch02.check_ratio, step / (accounting.prefill_flops(l7, 1) / h200.peak_flops("bf16"))
    yield (
        "02-2.5",
        lambda a: ch02.check_ratio_on_this_machine(a, peak_flops=PEAK, bandwidth=BW, model="tiny-target", dtype="fp32"),
        time_floors.output_input_ratio(tiny, PEAK, BW, "fp32"),
    )
    yield (
        "03.1",
        lambda a: ch03.check_int4_bytes(a, shape=(4096, 11008), group_size=128),
        4096 * 11008 // 2 + 2 * 4 * 4096 * (11008 // 128),
    )
    yield "03.2", lambda a: ch03.check_rtn_bound(a, absmax=0.5, bits=8), 0.5 / 127 / 2
    yield "04.1", lambda a: ch04.check_expected_tokens(a, alpha=0.8, gamma=4), (1 - 0.8**5) / (1 - 0.8)
    from course_lib.engine.speculative.theory import best_gamma

    yield "04.2", lambda a: ch04.check_best_gamma(a, alpha=0.7, c=0.1), best_gamma(0.7, 0.1)
    yield "04.4", lambda a: ch04.check_ridge_batch(a, ridge=RIDGE, gamma=4), int(2 * RIDGE // 5)
    yield "05.1", lambda a: ch05.check_kv_bytes_per_token(a, "llama-3-8b", "bf16"), 2 * 32 * 8 * 128 * 2
    yield (
        "05.2",
        lambda a: ch05.check_fit_requests(a, "llama-3-8b", "H100 SXM", 8192),
        int((0.9 * 80 * 2**30 - weight_bytes(l3, "bf16")) // (kv_bytes_per_token(l3, "bf16") * 8192)),
    )
    yield (
        "05.4",
        lambda a: ch05.check_kv_stream_ms(a, bandwidth=BW, model="llama-2-7b", batch=16, context=4096),
        formulas.kv_gb("llama-2-7b", "fp16", 4096, 16) * 1e9 / BW * 1e3,
    )
    yield "06.1", lambda a: ch06.check_static_steps(a), max(12, 3, 40, 5) + max(8, 30, 2, 6)
    yield (
        "06.2",
        lambda a: ch06.check_goodput(a, [0.5, 2.0, 0.3], [0.010, 0.010, 0.040], duration_s=10.0),
        2 / 10,
    )
    yield (
        "06.4",
        lambda a: ch06.check_decode_ceiling(a, bandwidth=BW, weight_bytes=weight_bytes(tiny, "fp32"), batch=16),
        16 * BW / weight_bytes(tiny, "fp32"),
    )
    yield "07.1", lambda a: ch07.check_bubble(a, p=4, m=12), (4 - 1) / (12 + 4 - 1)
    yield (
        "07.2",
        lambda a: ch07.check_allreduce_us(a, nbytes=16e6, p=8, link="nvlink4"),
        (lk.base + 2 * 7 * lk.alpha + 2 * 7 / 8 * 16e6 * lk.beta) * 1e6,
    )
    yield "08.1", lambda a: ch08.check_reusable_tokens(a, prefix_tokens=141, block_size=16), 141 // 16 * 16
    tp, fp, fn, tn = 7, 2, 3, 8
    yield "08.2", lambda a: ch08.check_rates(a, tp, fp, fn, tn), (fp / (fp + tn), fn / (fn + tp))
    yield "08.4", lambda a: ch08.check_break_even(a, usd_per_hour=0.08, api_usd_per_request=5e-5), 0.08 * 730 / 5e-5
    yield "08-2.1", lambda a: ch08.check_agent_tokens(a, first_prompt=140, per_step=60, calls=5), 1300


CASES = list(_cases())


def _wrong(answer):
    """A clearly wrong answer of the same type (a counter-example each check must reject)."""
    if isinstance(answer, str):
        return "memory-bound" if answer != "memory-bound" else "compute-bound"
    if isinstance(answer, tuple):
        return tuple(_wrong(x) for x in answer)
    if isinstance(answer, (int, np.integer)) and not isinstance(answer, bool):
        return int(answer) * 2 + 3
    return float(answer) * 1.5 + 0.1


@pytest.mark.parametrize("name,checker,answer", CASES, ids=[c[0] for c in CASES])
def test_official_answer_passes_and_a_wrong_one_fails(name, checker, answer):
    assert checker(answer), f"exercise {name}: the official answer fails its own checker"
    with pytest.raises(AssertionError):
        checker(_wrong(answer))


def test_remeasuring_checks_accept_their_own_measurement_and_reject_no_gain(monkeypatch):
    """Exercise 06.3: the official answer (the ratio the check re-measures) passes; "no gain" (1.0) fails."""
    import course_lib.serving.simulator.wall_clock as wc

    class Run:
        def __init__(self, tput):
            self.throughput = tput

    monkeypatch.setattr(wc, "run_real", lambda engine, trace, cfg: Run(180.0 if cfg.policy == "continuous" else 100.0))
    assert ch06.check_continuous_gain(1.8, engine=None, trace=None)
    for wrong in (1.0, 1.3, 2.5):
        with pytest.raises(AssertionError):
            ch06.check_continuous_gain(wrong, engine=None, trace=None)
