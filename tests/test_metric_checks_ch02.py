"""Chapter 02's verdicts (course_lib.serving.latency_checks, utilization_checks, batch_efficiency): each one
computed from numbers, and each fed a counter-example that must make it fail."""

import numpy as np
import pytest
import torch

from course_lib.engine import Engine
from course_lib.measure.metrics import RequestTrace
from course_lib.models import accounting
from course_lib.serving import batch_efficiency as be
from course_lib.serving import client
from course_lib.serving import latency_checks as lc
from course_lib.serving import utilization_checks as uc
from tests.conftest import random_llama

PEAK, BW = 150e9, 30e9


# ----------------------------------------------------------------------------- 02-1
def test_growth_split_and_its_verdict():
    mm, rest = lc.growth_split(5.6e-3, 7.5e-3, 1.8e-3, 4.6e-3)  # the matmuls jump, the rest shrinks
    assert mm == pytest.approx(2.8 / 1.9) and rest == pytest.approx(-0.9 / 1.9)
    assert lc.growth_in_matmuls(16, 32, 5.6e-3, 7.5e-3, 1.8e-3, 4.6e-3)
    assert not lc.growth_in_matmuls(16, 32, 5.6e-3, 7.5e-3, 1.8e-3, 2.0e-3)  # counter-example: the rest grew
    assert not lc.growth_in_matmuls(16, 32, 5.6e-3, 5.0e-3, 1.8e-3, 2.0e-3)  # no growth at all: nothing to place


def test_kernel_switch_verdict():
    assert lc.kernel_switch(32, 4.6e-3, 1.9e-3)
    assert not lc.kernel_switch(32, 2.0e-3, 1.9e-3)  # counter-example: MKL as fast as oneDNN


def test_step_split_and_dispatch_verdict():
    s = lc.StepSplit(step_s=3.8e-3, matmul_s=1.0e-3, n_ops=223, empty_op_s=2.7e-6)
    assert s.dispatch_s == pytest.approx(223 * 2.7e-6)
    assert s.other_s == pytest.approx(3.8e-3 - 1.0e-3 - 223 * 2.7e-6)
    assert s.per_other_op_s / s.empty_op_s == pytest.approx(2.8e-3 / 223 / 2.7e-6)
    assert "empty-op dispatch" in s.describe()
    assert not lc.dispatch_is_most(s)  # 0.6 ms of 3.8 ms: dispatch is not most of the step
    assert lc.dispatch_is_most(lc.StepSplit(1.0e-3, 0.1e-3, 300, 2.7e-6))  # 0.81 ms of 1 ms: it is


def _traces(prompts, outs, ttft0=5e-3, per_tok=50e-6, tpot=3e-3, slow=()):
    out = []
    for i, (p, n) in enumerate(zip(prompts, outs)):
        t0 = ttft0 + per_tok * p
        times = [t0 + tpot * k * (3.0 if i in slow else 1.0) for k in range(n)]
        out.append(RequestTrace(i, 0.0, p, times))
    return out


def test_latency_model_recovers_its_parameters_and_the_verdict_fails_on_slow_requests():
    rng = np.random.default_rng(0)
    prompts, outs = rng.integers(16, 257, 100).tolist(), rng.integers(2, 80, 100).tolist()
    tr = _traces(prompts, outs)
    m = lc.fit_latency_model(tr)
    assert m.ttft0_s == pytest.approx(5e-3) and m.ttft_per_token_s == pytest.approx(50e-6)
    assert m.tpot_s == pytest.approx(3e-3)
    assert lc.residual_share(tr, m) == pytest.approx(0, abs=1e-9)
    assert lc.per_request_prediction(lc.residual_share(tr, m))
    slow = _traces(prompts, outs, slow=set(range(0, 100, 5)))  # every fifth request decodes 3x slower
    assert not lc.per_request_prediction(lc.residual_share(slow, lc.fit_latency_model(slow)))
    with pytest.raises(ValueError):
        lc.fit_latency_model(tr[:2])
    assert lc.miss_reason(tr, m) == ""  # nothing missed: no reason
    why = lc.miss_reason(slow, lc.fit_latency_model(slow))
    assert why.startswith("20 of 100 requests missed by more than 10%, 20 of them slower") and "mostly slower" in why


def test_p99_spread_shrinks_with_n():
    values = np.random.default_rng(1).lognormal(size=5000)
    table = lc.p99_spread_table(values, (30, 100, 1000, 5000))
    spreads = [sp for _, sp in table]
    assert spreads[0] > spreads[1] > spreads[2] > spreads[3]
    assert spreads[1] > 2 * spreads[3]  # 100 requests: several times the spread of thousands
    assert lc.bootstrap_ratio_spread(values[:100]) > lc.bootstrap_ratio_spread(values)
    with pytest.raises(ValueError):
        lc.bootstrap_percentile_spread([1.0], 10)


def test_time_packed_matmuls_matches_the_model_and_counts_bytes(tokenizer):
    torch.manual_seed(0)
    eng = Engine(random_llama(tokenizer), tokenizer)
    t = lc.time_packed_matmuls(eng, 4, repeats=2)
    lins = [lin for _, lin in eng.model.linears()]
    assert t.bytes == sum(lin.weight.numel() * 4 for lin in lins)
    assert t.flops == 2 * 4 * sum(lin.weight.numel() for lin in lins)
    with pytest.raises(ValueError):
        lc.time_packed_matmuls(eng, 0)


def test_batch_run_keeps_every_runs_tpot(tokenizer):
    eng = Engine(random_llama(tokenizer), tokenizer)
    pool = list(range(5, 95)) * 4
    [run] = client.tpot_sweep(eng, pool, [2], prompt_len=8, new_tokens=3, repeats=3, warmup=0)
    assert len(run.tpot_samples_s) == 3 and run.tpot_s == pytest.approx(float(np.median(run.tpot_samples_s)))


# ----------------------------------------------------------------------------- 02-2
def test_roofline_orderings_and_their_verdicts():
    shape = accounting.ModelShape.from_name("llama-2-7b")
    mfu_r, mbu_r = uc.roofline_orderings(shape, prompt_len=256, context_len=64, peak_flops=PEAK, bandwidth=BW)
    assert mfu_r > 5 and mbu_r > 5  # both phases at their roofs: large factors, not "> 1"
    assert uc.ordering("prefill's MFU beats decode's", 0.6 * mfu_r, mfu_r)
    assert not uc.ordering("prefill's MFU beats decode's", 1.5, mfu_r)  # counter-example: higher, but barely


def test_mfu_two_peaks_and_their_bars():
    two = uc.mfu_two_peaks(120e9, 150e9, 300e9)
    assert two == {"measured": pytest.approx(0.8), "theoretical": pytest.approx(0.4)}
    assert uc.mfu_near_measured(two["measured"]) and not uc.mfu_good_theoretical(two["theoretical"])
    assert not uc.mfu_near_measured(0.5) and uc.mfu_good_theoretical(0.6)
    assert uc.mfu_two_peaks(1.0, 2.0, None)["theoretical"] is None
    assert uc.bf16_theoretical(100e9, ("avx512f", "avx512_bf16")) == 200e9
    assert uc.bf16_theoretical(100e9, ("avx512f",)) is None and uc.bf16_theoretical(None, ("avx512_bf16",)) is None


def test_utilization_is_not_the_goal_verdict():
    assert uc.binding_use(0.04, 0.6) == 0.6
    assert uc.low_mfu_can_be_optimal(0.04, 0.6, 0.9, 0.05)  # 4% MFU but 60% MBU vs a 90% MFU prefill
    assert not uc.low_mfu_can_be_optimal(0.01, 0.2, 0.9, 0.05)  # counter-example: low MFU and low MBU


def test_busy_blind_verdicts():
    differ, blind = uc.busy_blind(1.0, 0.98, 0.03, 0.6)
    assert differ and blind
    differ, blind = uc.busy_blind(0.3, 0.98, 0.03, 0.6)  # counter-example: busy tracked the work
    assert differ and not blind
    differ, _ = uc.busy_blind(1.0, 1.0, 0.3, 0.6)
    assert not differ


def test_bootstrap_fit_ratio_covers_the_truth_and_the_agreement_verdict():
    rng = np.random.default_rng(0)
    pts = [(i, o, 1e-3 + 1e-4 * i + 3e-3 * o + rng.normal(0, 2e-3)) for i in (16, 64, 128, 256) for o in (4, 16, 48)]
    lo, mid, hi = uc.bootstrap_fit_ratio(pts)
    assert lo < 30 < hi and lo < mid < hi
    assert uc.ratios_agree(30, (lo, mid, hi))
    assert not uc.ratios_agree(10 * hi, (lo, mid, hi))  # counter-example: the parts say something else
    assert uc.parts_ratio(3e-3, 10e-3, 50e-3, 64, 464) == pytest.approx(30)
    with pytest.raises(ValueError):
        uc.parts_ratio(3e-3, 10e-3, 50e-3, 64, 64)
    with pytest.raises(ValueError):
        uc.bootstrap_fit_ratio(pts[:3])


# ----------------------------------------------------------------------------- lengths, precomputing
def test_equal_mean_workloads_and_static_efficiency():
    pool = list(range(1000))
    const, var = be.equal_mean_workloads(pool, 16, mean_output=16, sigma=1.0, seed=2)
    assert [r.prompt_ids for r in const] == [r.prompt_ids for r in var]
    assert sum(r.max_new_tokens for r in const) == sum(r.max_new_tokens for r in var) == 16 * 16
    assert np.std([r.max_new_tokens for r in var]) > 3
    assert be.static_efficiency([r.max_new_tokens for r in const], 8) == 1.0
    assert be.static_efficiency([2, 10, 4, 4], 2) == pytest.approx(20 / (2 * 10 + 2 * 4))
    assert be.consistent_is_faster(1.9, 2.0) and not be.consistent_is_faster(1.1, 2.0)
    with pytest.raises(ValueError):
        be.static_efficiency([], 2)
    with pytest.raises(ValueError):
        be.equal_mean_workloads(pool, 4, sigma=0)


def test_precompute_breakeven_and_input_space():
    assert be.precompute_breakeven(25e-3, 130e-3) == pytest.approx(25 / 130)
    assert be.input_space_log10(4096, 20) == pytest.approx(20 * np.log10(4096))
    with pytest.raises(ValueError):
        be.precompute_breakeven(0, 1)


def test_ordering_reason_is_computed_from_each_phase_use_of_its_roof(capsys):
    assert not uc.ordering("decode's MBU beats prefill's", 9.6, 39, uses={"prefill": 1.09, "decode b=1": 0.27})
    out = capsys.readouterr().out
    assert "prefill 109%, decode b=1 27%; the decode b=1, farthest below its roof, narrows the gap" in out
    assert not uc.ordering("decode's MBU beats prefill's", 9.6, 39)
    assert "likely reason" not in capsys.readouterr().out  # no measured shares: no reason printed
