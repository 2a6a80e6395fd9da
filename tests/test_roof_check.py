"""bottlenecks.roof_check: measured TTFT/TPOT beside their roofline floors, and each phase's MFU/MBU."""

import math

import pytest

from course_lib.bottlenecks import roof_check, time_floors
from course_lib.measure import metrics
from course_lib.measure.claims import claim
from course_lib.models import accounting

# SmolLM2-135M-Instruct's shape (data/models/smollm2-135m-instruct.md), no weights needed
SMOL = accounting.ModelShape("smollm2", 49152, 576, 1536, 30, 9, 3, 64, tie_embeddings=True, max_position=8192)
PEAK, BW = 140e9, 31e9  # a 2-core Zen 4 VM's measured fp32 matmul peak and DRAM bandwidth


def test_the_shape_is_smollm2():
    assert accounting.param_count(SMOL) == 134_515_008


def test_a_ttft_on_the_floor_is_on_the_roof_and_prefill_is_compute_bound():
    floor = {n: time_floors.prefill_time(SMOL, n, PEAK, BW, "fp32") for n in (16, 512, 2048)}
    rows = roof_check.compare_prefill(SMOL, floor, PEAK, BW)
    assert [r.size for r in rows] == [16, 512, 2048]
    for r in rows:
        assert r.ratio == pytest.approx(1.0) and r.share_of_roof == pytest.approx(1.0)
        assert r.bound == "compute"
        assert r.floor_s == pytest.approx(r.flops / PEAK)  # compute-bound: FLOPs over the peak
    # at 512 tokens the compute floor is many times the byte floor
    assert rows[1].flops / PEAK > 5 * rows[1].bytes / BW


def test_the_prefill_verdict_fails_on_a_slow_run():
    floor = time_floors.prefill_time(SMOL, 512, PEAK, BW, "fp32")
    good = roof_check.compare_prefill(SMOL, {512: 1.5 * floor}, PEAK, BW)[0]
    slow = roof_check.compare_prefill(SMOL, {512: 3 * floor}, PEAK, BW)[0]
    assert slow.ratio == pytest.approx(3) and slow.share_of_roof == pytest.approx(1 / 3)
    statement = "within 2x of FLOPs / the matmul peak"
    assert claim(statement, good.ratio, at_most=2.0)
    assert not claim(statement, slow.ratio, at_most=2.0)


def test_decode_at_batch_1_is_memory_bound_and_its_share_is_the_mbu():
    floor = time_floors.decode_time(SMOL, 64, PEAK, BW, "fp32")
    tpot = 1.25 * floor
    [row] = roof_check.compare_decode(SMOL, {1: tpot}, PEAK, BW, context_len=64)
    assert row.bound == "memory" and row.ratio == pytest.approx(1.25)
    mbu = metrics.mbu(accounting.param_count(SMOL), 4, 1 / tpot, BW, accounting.kv_bytes_per_token(SMOL, "fp32") * 64)
    assert row.share_of_roof == pytest.approx(mbu)  # tied embeddings: a step reads every parameter once
    assert not claim(
        "MBU >= 50%", roof_check.compare_decode(SMOL, {1: 3 * floor}, PEAK, BW)[0].share_of_roof, at_least=0.5
    )


def test_utilization_per_phase():
    t_pre, tpots = 4.0, {1: 0.02, 8: 0.03}
    u = roof_check.utilization(
        SMOL, prompt_len=2048, ttft_s=t_pre, context_len=96, tpot_by_batch=tpots, peak_flops=PEAK, bandwidth=BW
    )
    assert list(u) == ["prefill", "decode b=1", "decode b=8"]
    assert u["prefill"]["mfu"] == pytest.approx(accounting.prefill_flops(SMOL, 2048) / t_pre / PEAK)
    assert u["decode b=8"]["mfu"] == pytest.approx(accounting.decode_flops(SMOL, 96, 8) / 0.03 / PEAK)
    # Huyen's ordering for these times: prefill has the higher MFU, decode the higher MBU
    assert u["prefill"]["mfu"] > u["decode b=1"]["mfu"] and u["decode b=1"]["mbu"] > u["prefill"]["mbu"]
    # a batch of 8 shares the weight reads: 8 tokens per step, in 1.5x the step time of batch 1
    assert u["decode b=8"]["mfu"] / u["decode b=1"]["mfu"] == pytest.approx(8 * 0.02 / 0.03, rel=0.01)


def test_attention_share_grows_with_the_length():
    shares = [roof_check.attention_share(SMOL, n) for n in (1, 256, 2048, 8192)]
    assert all(0 < s < 1 for s in shares) and shares == sorted(shares)
    n = 2048
    att = 4 * 30 * 9 * 64 * n * (n + 1) / 2
    assert shares[2] == pytest.approx(att / (2 * accounting.matmul_params(SMOL) * n + att))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: roof_check.compare_prefill(SMOL, {}, PEAK, BW), "measured"),
        (lambda: roof_check.compare_prefill(SMOL, {512: -1.0}, PEAK, BW), "TTFT at 512"),
        (lambda: roof_check.compare_prefill(SMOL, {0: 1.0}, PEAK, BW), "prompt length"),
        (lambda: roof_check.compare_decode(SMOL, {1: 0.02}, 0, BW), "peak_flops"),
        (lambda: roof_check.compare_decode(SMOL, {1: 0.02}, PEAK, BW, context_len=0), "context_len"),
        (
            lambda: roof_check.utilization(
                SMOL,
                prompt_len=8,
                ttft_s=math.nan,
                context_len=8,
                tpot_by_batch={1: 1.0},
                peak_flops=PEAK,
                bandwidth=BW,
            ),
            "ttft_s",
        ),
        (
            lambda: roof_check.utilization(
                SMOL, prompt_len=8, ttft_s=1.0, context_len=8, tpot_by_batch={}, peak_flops=PEAK, bandwidth=BW
            ),
            "tpot_by_batch",
        ),
        (lambda: roof_check.attention_share(SMOL, 0), "n_tokens"),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
