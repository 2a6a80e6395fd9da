"""Capacity (weights + KV cache vs GPU memory), training-vs-decode MFU bounds, and more chips vs faster memory."""

import pytest

from course_lib.bottlenecks.capacity import fits_in_memory
from course_lib.bottlenecks.llm_phases import llm_phases
from course_lib.bottlenecks.mfu_bound import training_vs_inference
from course_lib.bottlenecks.time_floors import decode_time, decode_time_options
from course_lib.measure.hardware import gpu_spec
from course_lib.models import accounting

L7 = accounting.ModelShape.from_name("llama-2-7b")


def test_h100_batch_256_at_512_tokens_needs_about_82_gb():
    cap = fits_in_memory("llama-2-7b", "H100 SXM", batch=256, context_len=512)
    assert cap.weights_bytes == pytest.approx(13.48e9, rel=1e-3)
    assert cap.kv_bytes == 256 * 512 * 512 * 1024  # 512 KiB per token
    assert cap.total_bytes == pytest.approx(82.2e9, rel=1e-3)
    assert cap.device_bytes == 80 * 2**30  # the datasheet's "80GB" is 80 GiB = 85.9e9 bytes
    assert cap.usable == 0.9 and cap.usable_bytes == pytest.approx(77.3e9, rel=1e-3)
    assert not cap.fits and cap.overflow == "kv cache"  # 82.2 GB > the 90% an engine may fill
    per_seq = 512 * 512 * 1024
    assert cap.max_batch == int((0.9 * 80 * 2**30 - cap.weights_bytes) // per_seq) == 237
    text = str(cap)
    assert "weights 13.5 GB + KV cache 68.7 GB = 82.2 GB > 77.3 GB (90% of the H100 SXM's 80 GiB)" in text
    assert "the KV cache overflows; at most 237 sequences of 512 tokens fit" in text
    whole = fits_in_memory("llama-2-7b", "H100 SXM", batch=256, context_len=512, usable=1.0)
    assert whole.fits and whole.max_batch == 269  # on paper, every byte used and activations ignored


def test_kv_cache_overflow():
    cap = fits_in_memory(L7, gpu_spec("H100 SXM"), batch=512, context_len=512)
    assert not cap.fits and cap.overflow == "kv cache"
    assert cap.max_batch == 237
    assert "the KV cache overflows; at most 237 sequences of 512 tokens fit" in str(cap)
    assert "weights" not in str(cap).split(":")[1]  # the weights are not blamed
    none = fits_in_memory("llama-2-7b", "T4", batch=1, context_len=32768)  # 17 GB of KV per sequence
    assert none.overflow == "kv cache" and none.max_batch == 0
    assert "not even one sequence" in str(none)
    with pytest.raises(ValueError, match="usable"):
        fits_in_memory(L7, "H100 SXM", batch=1, context_len=1, usable=1.5)


def test_weights_overflow():
    cap = fits_in_memory("llama-2-70b", "H100 SXM", batch=1, context_len=512)
    assert not cap.fits and cap.overflow == "weights" and cap.max_batch == 0
    assert "the weights alone overflow" in str(cap)
    # 138 GB of bf16 weights: on paper they fit in an H200's 141 GiB, not in the 90% an engine may fill
    assert fits_in_memory("llama-2-70b", "H200 SXM", batch=1, context_len=512, usable=1.0).fits
    assert fits_in_memory("llama-2-70b", "H200 SXM", batch=1, context_len=512).overflow == "weights"


def test_kv_dtype_halves_the_cache():
    bf16 = fits_in_memory("llama-3-8b", "L4", batch=8, context_len=4096)
    fp8 = fits_in_memory("llama-3-8b", "L4", batch=8, context_len=4096, kv_dtype="fp8")
    assert fp8.kv_bytes == bf16.kv_bytes / 2 and fp8.weights_bytes == bf16.weights_bytes
    assert fp8.max_batch >= 2 * bf16.max_batch


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(batch=0, context_len=512), "batch must be a positive int"),
        (dict(batch=1, context_len=-3), "context_len must be a positive int"),
        (dict(batch=1.5, context_len=512), "batch must be a positive int"),
    ],
)
def test_capacity_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fits_in_memory("llama-2-7b", "H100 SXM", **kwargs)


def test_llm_phases_uses_capacity_and_per_step_bytes():
    rep = llm_phases("H100 SXM", "llama-2-7b", batch=1024, context_len=512)
    assert rep.capacity.overflow == "kv cache" and not rep.fits_in_memory
    assert "the KV cache overflows" in str(rep) and "do NOT fit" not in str(rep)
    assert rep.decode.bytes == accounting.decode_step_bytes(L7, 512, 1024, "bf16")
    assert rep.prefill.bytes == accounting.prefill_step_bytes(L7, 512, 1024, "bf16")
    # fp8 weights on an A100 (no fp8 tensor cores): fp8 bytes against the bf16 roof
    rep = llm_phases("A100 80GB SXM", "llama-2-7b", dtype="fp8", compute_dtype="bf16")
    assert rep.roof.peak_flops == gpu_spec("A100 80GB SXM").peak_flops("bf16")
    assert rep.decode.bytes == accounting.decode_step_bytes(L7, 512, 1, "fp8")
    assert "(bf16 roof)" in str(rep)


def test_batch_1_decode_time_is_the_streamed_weights_over_bandwidth():
    spec = gpu_spec("H100 SXM")
    t = decode_time(L7, 1, spec.peak_flops(), spec.bandwidth, "bf16")
    streamed = accounting.weight_bytes(L7) - (32000 - 1) * 4096 * 2 + accounting.kv_bytes_per_token(L7)
    assert t == pytest.approx(streamed / spec.bandwidth)


def test_training_reaches_a_higher_mfu_bound_than_decode():
    train, decode = training_vs_inference("llama-2-7b", "H100 SXM", seq_len=2048, seqs=16)
    assert train.flops == pytest.approx(3 * accounting.prefill_flops(L7, 2048, 16))
    assert train.flops == pytest.approx(6 * 6.6e9 * 2048 * 16, rel=0.1)  # ≈ 6·N·tokens
    weights_only = training_vs_inference("llama-2-7b", "H100 SXM", seq_len=2048, seqs=16, activations=False)[0]
    assert weights_only.bytes == accounting.param_count(L7) * 34  # bf16 weights/grads + fp32 master and Adam moments
    act = 2 * 34 * 32 * 4096 * 2048 * 16  # written in the forward, read in the backward (Korthikanti et al.)
    assert train.bytes == pytest.approx(weights_only.bytes + act)
    assert 1.5 < weights_only.intensity / train.intensity < 3  # activations more than double the traffic here
    assert train.mfu_bound == 1.0 and train.intensity > 5 * train.ridge  # still far right of the ridge
    assert decode.intensity == pytest.approx(accounting.decode_intensity(L7, 512, 1))
    assert (
        decode.mfu_bound == pytest.approx(decode.intensity / gpu_spec("H100 SXM").ridge()) and decode.mfu_bound < 0.01
    )
    assert "MFU <=" in str(train) and "decode" in str(decode)
    few = training_vs_inference(L7, "H100 SXM", seq_len=8, seqs=1)[0]
    assert few.mfu_bound < 1  # a tiny token batch cannot amortise the optimizer's traffic


def test_more_chips_vs_faster_memory():
    rows = decode_time_options("llama-2-7b", ("H100 SXM", "H200 SXM"), batch=1, context_len=512, chips=(1, 2))
    by = {(r.gpu, r.chips): r for r in rows}
    assert len(rows) == 4 and all(r.fits and r.bound == "memory-bound" for r in rows)
    one = by["H100 SXM", 1]
    assert one.bytes_per_chip == accounting.decode_step_bytes(L7, 512, 1, "bf16")
    assert one.seconds == pytest.approx(one.bytes_per_chip / 3.35e12)
    assert by["H100 SXM", 2].seconds == pytest.approx(one.seconds / 2)  # communication ignored
    assert by["H200 SXM", 1].seconds == pytest.approx(one.seconds * 3.35 / 4.8)
    assert by["H200 SXM", 1].tokens_per_s == pytest.approx(1 / by["H200 SXM", 1].seconds)
    assert "1 x H100 SXM" in str(one)
    # GQA: 8 KV heads on 16 chips -> each chip still holds a whole head (replicated), 1/8 of the cache
    big = decode_time_options("llama-2-70b", "H100 SXM", batch=64, context_len=2048, chips=(1, 16))
    kv = accounting.kv_bytes_per_token(accounting.ModelShape.from_name("llama-2-70b")) * 2048 * 64
    assert not big[0].fits and big[1].fits
    w = accounting.weights_read_per_step(accounting.ModelShape.from_name("llama-2-70b"), 64)
    assert big[1].bytes_per_chip == pytest.approx(w / 16 + kv / 8)
    with pytest.raises(ValueError, match="chips"):
        decode_time_options("llama-2-7b", "H100 SXM", chips=(3,))
    with pytest.raises(ValueError, match="chips"):
        decode_time_options("llama-2-7b", "H100 SXM", chips=(0,))
