"""Quantization formats (compression.quantize), weight-only layers (compression.linear) and the engine
with quantized weights (compression.apply): bounds, bytes, paths against the reference, bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.compression.apply import quantize_engine
from course_lib.compression.linear import WeightOnlyLinear, cpu_supports
from course_lib.compression.quantize import (
    QuantConfig,
    dequantize,
    expected_nbytes,
    fp8_roundtrip,
    max_error,
    pack_int4,
    quantize,
    unpack_int4,
)
from course_lib.engine import Engine
from course_lib.engine.layers import Linear
from course_lib.engine.sampling import SamplingParams

CONFIGS = [
    QuantConfig(8, True, "tensor"),
    QuantConfig(8, True, "channel"),
    QuantConfig(8, False, "channel"),
    QuantConfig(8, True, "group", 32),
    QuantConfig(4, True, "channel"),
    QuantConfig(4, False, "group", 32),
    QuantConfig(4, True, "group", 64),
]


@settings(max_examples=25, deadline=None)
@given(
    out=st.integers(1, 40),
    groups=st.integers(1, 4),
    config=st.sampled_from(CONFIGS),
    seed=st.integers(0, 2**16),
    spread=st.floats(0.01, 100.0),
)
def test_rtn_error_within_half_a_step_and_bytes_match_the_formula(out, groups, config, seed, spread):
    inp = groups * (config.group_size if config.granularity == "group" else 16)
    w = torch.randn(out, inp, generator=torch.Generator().manual_seed(seed)) * spread
    qw = quantize(w, config)
    err = (dequantize(qw) - w).abs().reshape(out, qw.scale.shape[1], -1)
    assert (err <= max_error(qw)[..., None] * (1 + 1e-5) + 1e-6).all()
    assert qw.nbytes == expected_nbytes((out, inp), config)
    q = qw.int_values()
    assert int(q.min()) >= config.qmin and int(q.max()) <= config.qmax
    if config.symmetric:
        assert (qw.zero == 0).all()


def test_pack_unpack_round_trip_and_layout():
    u = torch.randint(0, 16, (5, 12), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    p = pack_int4(u)
    assert p.shape == (5, 6) and p.dtype == torch.uint8
    assert torch.equal(unpack_int4(p), u)
    assert int(p[0, 0]) == int(u[0, 0]) | (int(u[0, 1]) << 4)  # low nibble = even column
    with pytest.raises(ValueError, match="even"):
        pack_int4(torch.zeros(2, 3, dtype=torch.uint8))


def test_more_bits_and_smaller_groups_mean_less_error():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))

    def rms(config):
        return (dequantize(quantize(w, config)) - w).pow(2).mean().sqrt().item()

    assert rms(QuantConfig(8, True, "channel")) < rms(QuantConfig(4, True, "channel")) / 8
    assert rms(QuantConfig(4, False, "group", 32)) < rms(QuantConfig(4, False, "group", 128))
    assert rms(QuantConfig(8, True, "channel")) <= rms(QuantConfig(8, True, "tensor"))


def test_outlier_hurts_per_tensor_more_than_per_channel():
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(2))
    w[3, 5] = 100.0  # one outlier stretches the per-tensor scale for every row

    def rms(config):
        d = dequantize(quantize(w, config)) - w
        d[3] = 0  # judge the other rows
        return d.pow(2).mean().sqrt().item()

    assert rms(QuantConfig(8, True, "tensor")) > 5 * rms(QuantConfig(8, True, "channel"))


def test_bad_input():
    w = torch.randn(8, 96)
    with pytest.raises(ValueError, match="group_size 64 does not divide the input dimension 96"):
        quantize(w, QuantConfig(4, True, "group", 64))
    with pytest.raises(ValueError, match="bits must be one of"):
        QuantConfig(bits=3)
    with pytest.raises(ValueError, match="granularity"):
        QuantConfig(granularity="row")
    with pytest.raises(ValueError, match="already quantized"):
        quantize(quantize(w), QuantConfig())
    with pytest.raises(ValueError, match="2-D floating-point"):
        quantize(torch.ones(4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="even"):
        quantize(torch.randn(4, 7), QuantConfig(4, True, "channel"))
    lin = WeightOnlyLinear.from_linear(Linear(torch.randn(16, 64)), QuantConfig(8, True, "channel"))
    with pytest.raises(ValueError, match="already quantized"):
        WeightOnlyLinear.from_linear(lin, QuantConfig(4, True, "group", 32))
    with pytest.raises(ValueError, match="path must be one of"):
        WeightOnlyLinear(lin.qw, path="gpu")
    with pytest.raises(ValueError, match="path='cpu' needs"):
        WeightOnlyLinear(quantize(torch.randn(16, 64), QuantConfig(8, False, "channel")), path="cpu")


@pytest.mark.parametrize("config", [QuantConfig(8, True, "channel"), QuantConfig(4, False, "group", 64)])
@pytest.mark.parametrize("rows", [1, 3, 16, 40])
def test_cpu_packed_path_matches_the_reference(config, rows):
    gen = torch.Generator().manual_seed(rows)
    lin = Linear(torch.randn(48, 128, generator=gen) * 0.05, torch.randn(48, generator=gen))
    if not cpu_supports(quantize(lin.weight, config)):
        pytest.skip("this torch has no packed CPU kernels")
    layer = WeightOnlyLinear.from_linear(lin, config, path="cpu")
    assert layer.path == "cpu"
    x = torch.randn(rows, 128, generator=gen)
    ref = layer.reference(x)
    torch.testing.assert_close(layer(x), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())  # bf16 activations
    x3 = x.reshape(1, rows, 128)  # leading dims pass through
    assert layer(x3).shape == (1, rows, 48)


@pytest.mark.parametrize("config", [QuantConfig(8, True, "channel"), QuantConfig(4, False, "group", 32)])
@pytest.mark.parametrize("rows", [1, 2, 4, 7, 40])
def test_gemv_path_matches_the_reference_with_fp32_activations(config, rows):
    """The course's CPU kernels: auto's choice where they are built; fp32 activations, so int8 agrees with the
    reference to fp32 rounding and int4 to its fp16 scales (the bf16 ``cpu`` path is ~100x looser)."""
    from course_lib.compression.linear import gemv_supports

    gen = torch.Generator().manual_seed(rows + config.bits)
    lin = Linear(torch.randn(48, 128, generator=gen) * 0.05, torch.randn(48, generator=gen))
    layer = WeightOnlyLinear.from_linear(lin, config)
    if not gemv_supports(layer.qw):
        pytest.skip("the CPU GEMV kernels are not built here")
    assert layer.path == "gemv"
    x = torch.randn(rows, 128, generator=gen)
    ref = layer.reference(x)
    from course_lib.compression.linear import GEMV_ROWS

    if rows <= GEMV_ROWS:
        tol = (1e-5 if config.bits == 8 else 2e-3) * ref.abs().max().item()
    else:  # more rows: the bf16 ``cpu`` path
        tol = 2e-2 * ref.abs().max().item()
    torch.testing.assert_close(layer(x), ref, rtol=0, atol=tol)
    assert layer(x.reshape(1, rows, 128)).shape == (1, rows, 48)


def test_reference_path_for_formats_the_kernels_do_not_take():
    lin = Linear(torch.randn(20, 64))  # 20 rows: not divisible by 16 for the int4 CPU kernel; groups of 16
    layer = WeightOnlyLinear.from_linear(lin, QuantConfig(4, False, "group", 16))
    assert layer.path == "reference"
    x = torch.randn(2, 64)
    torch.testing.assert_close(layer(x), x @ dequantize(layer.qw).T)


def test_fp8_roundtrip_is_close():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(3))
    back = fp8_roundtrip(w)
    if back is None:
        pytest.skip("no float8 in this torch")
    rel = ((back - w).abs() / w.abs().amax(dim=1, keepdim=True)).max().item()
    assert rel < 0.07  # e4m3 keeps 3 mantissa bits: ~6% relative steps at worst


def test_quantized_engine_reads_fewer_bytes_and_still_generates():
    eng = Engine("tiny-target")
    fp = Engine(eng.hf_model, eng.tokenizer)
    report = quantize_engine(eng, QuantConfig(8, True, "channel"))
    assert len(report.layers) == 6 * 4 + 1 and 3.8 < report.ratio < 4.0
    prompt = eng.tokenizer("def fibonacci(n):")["input_ids"]
    ours = eng.generate([prompt], SamplingParams(max_new_tokens=8, ignore_eos=True))[0].output_ids
    ref = fp.generate([prompt], SamplingParams(max_new_tokens=8, ignore_eos=True))[0].output_ids
    assert len(ours) == 8 and sum(a == b for a, b in zip(ours, ref)) >= 6  # int8 rarely changes a greedy token
    with pytest.raises(ValueError, match="already quantized"):
        quantize_engine(eng, QuantConfig(4, False, "group", 64))
    r4 = quantize_engine(fp, QuantConfig(4, False, "group", 64), include_lm_head=False)
    assert "lm_head" not in r4.layers and r4.ratio > 6


def test_quantizing_a_weight_that_requires_grad_keeps_no_autograd_graph():
    # a tied LM head is the embedding's Parameter: quantizing it must not record (and keep) a graph
    w = torch.nn.Parameter(torch.randn(64, 32))
    for config in (QuantConfig(8, True, "channel"), QuantConfig(4, False, "group", 16)):
        qw = quantize(w, config)
        assert qw.scale.grad_fn is None and qw.zero.grad_fn is None and not qw.scale.requires_grad
        ref = quantize(w.detach().clone(), config)
        assert torch.equal(qw.data, ref.data) and torch.equal(qw.scale, ref.scale)
