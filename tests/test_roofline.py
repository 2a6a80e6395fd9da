"""Roofline maths against hand-computed cases, and LLM phases and time predictions against the accounting
formulas."""

import numpy as np
import pytest

from course_lib.bottlenecks.llm_phases import batch_to_reach, llm_phases
from course_lib.bottlenecks.time_floors import decode_time, generation_flops, output_input_ratio, prefill_time
from course_lib.measure import roofline
from course_lib.measure.hardware import gpu_spec
from course_lib.measure.roofline import Point, Roof
from course_lib.models import accounting


def test_hand_computed_roofline():
    # 100 TFLOP/s and 2 TB/s: ridge 50 FLOP/byte
    peak, bw = 100e12, 2e12
    assert roofline.ridge_point(peak, bw) == 50
    assert roofline.attainable(10, peak, bw) == 20e12  # left of the ridge: I · BW
    assert roofline.attainable(50, peak, bw) == 100e12
    assert roofline.attainable(1000, peak, bw) == 100e12  # flat roof
    assert np.allclose(roofline.attainable(np.array([1, 25, 400]), peak, bw), [2e12, 50e12, 100e12])
    assert roofline.bound(49.9, peak, bw) == "memory-bound" and roofline.bound(50, peak, bw) == "compute-bound"
    assert roofline.arithmetic_intensity(8e9, 4e9) == 2
    # 1 GB moved at 2 TB/s = 0.5 ms; 1 TFLOP at 100 TFLOP/s = 10 ms: compute wins
    assert roofline.min_time(1e12, 1e9, peak, bw) == pytest.approx(0.01)
    assert roofline.min_time(1e9, 1e9, peak, bw) == pytest.approx(5e-4)


def test_roof_from_spec_matches_table():
    roof = Roof.from_spec("H100 SXM", "bf16")
    assert roof.ridge == pytest.approx(989 / 3.35)
    assert roof.attainable(1.0) == pytest.approx(3.35e12)


def test_point_from_timing():
    from course_lib.measure.bench import Timing

    t = Timing("x", "cpu", (2.0, 2.0, 2.0), flops=8.0, bytes=4.0)
    p = Point.from_timing(t)
    assert p.intensity == 2 and p.achieved == 4
    with pytest.raises(ValueError, match="flops and bytes"):
        Point.from_timing(Timing("y", "cpu", (1.0,)))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: roofline.ridge_point(0, 1), "peak_flops must be positive"),
        (lambda: roofline.ridge_point(1, -1), "bandwidth must be positive"),
        (lambda: roofline.arithmetic_intensity(1, 0), "bytes must be positive"),
        (lambda: roofline.arithmetic_intensity(-1, 1), "flops must be a non-negative"),
        (lambda: roofline.attainable(-1, 1, 1), "intensity must be non-negative"),
        (lambda: Roof("x", 1, 1, kind="guess"), "kind must be"),
        (lambda: Roof.from_spec("H900"), "unknown GPU name"),
        (lambda: llm_phases("H100 SXM", "llama-2-7b", batch=0), "batch must be a positive int"),
        (lambda: llm_phases("H100 SXM", "llama-9"), "unknown model preset"),
        (lambda: llm_phases("T4", "llama-2-7b", dtype="bf16"), "no bf16 support"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_llm_phases_agree_with_accounting():
    shape = accounting.ModelShape.from_name("llama-2-7b")
    rep = llm_phases("A100 80GB SXM", "llama-2-7b", batch=4, prompt_len=256, context_len=256)
    assert rep.decode.intensity == pytest.approx(accounting.decode_intensity(shape, 256, 4, "bf16"))
    assert rep.prefill.intensity == pytest.approx(accounting.prefill_intensity(shape, 256, 4, "bf16"))
    assert rep.decode.bound == "memory-bound" and rep.prefill.bound == "compute-bound"
    # batch-1 decode on A100 reads ~13.5 GB of weights at 2.039 TB/s: ~6.6 ms, <= ~150 tok/s
    one = llm_phases("A100 80GB SXM", "llama-2-7b", batch=1, context_len=1)
    assert one.decode.seconds == pytest.approx(accounting.weights_read_per_step(shape, 1) / 2.039e12, rel=0.01)
    assert one.fits_in_memory
    assert not llm_phases("H100 SXM", "llama-2-70b").fits_in_memory
    assert "decode" in str(rep)


def test_decode_intensity_climbs_with_batch_until_ridge():
    rep = [llm_phases("H100 SXM", "llama-3-8b", batch=b, context_len=1) for b in (1, 8, 64, 512)]
    intens = [r.decode.intensity for r in rep]
    assert intens == sorted(intens) and intens[0] < 2 < intens[-1]
    ridge = rep[0].roof.ridge
    b = batch_to_reach(ridge, "llama-3-8b", context_len=1)
    shape = accounting.ModelShape.from_name("llama-3-8b")
    assert accounting.decode_intensity(shape, 1, b) >= ridge > accounting.decode_intensity(shape, 1, b - 1)
    # long contexts: the KV cache grows with batch as fast as the FLOPs, so decode never gets there
    assert batch_to_reach(ridge, "llama-2-7b", context_len=32768) is None


def test_predictions_follow_the_roofline():
    shape = accounting.ModelShape.from_name("llama-2-7b")
    spec = gpu_spec("H100 SXM")
    peak, bw = spec.peak_flops("bf16"), spec.bandwidth
    step = decode_time(shape, 1, peak, bw, "bf16")
    assert step == pytest.approx(accounting.decode_step_bytes(shape, 1, 1, "bf16") / bw)
    assert prefill_time(shape, 512, peak, bw, "bf16") == pytest.approx(accounting.prefill_flops(shape, 512) / peak)
    # one output token ≈ (bytes per param / 2) × ridge input tokens
    ratio = output_input_ratio(shape, peak, bw, "bf16")
    assert ratio == pytest.approx(spec.ridge("bf16"), rel=0.05)
    assert output_input_ratio(shape, peak, bw, "fp32") == pytest.approx(2 * ratio, rel=1e-6)
    # a big batch crosses the ridge: the step becomes compute-bound
    assert decode_time(shape, 1, peak, bw, "bf16", batch=1024) == pytest.approx(
        accounting.decode_flops(shape, 1, 1024) / peak
    )
    total = generation_flops(shape, 10, 3)
    assert total == pytest.approx(
        accounting.prefill_flops(shape, 10) + accounting.decode_flops(shape, 11) + accounting.decode_flops(shape, 12)
    )
    assert generation_flops(shape, 10, 1) == accounting.prefill_flops(shape, 10)
