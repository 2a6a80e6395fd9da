"""compression.decode_formats and compression.requant: the float baseline's packed layer, bytes per step,
chunked quantization, the format comparison's bookkeeping (on tiny-target, so CI stays fast), and the
plain-read loader of models.gguf."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.compression import decode_formats as df
from course_lib.compression import requant
from course_lib.compression.apply import linear_bytes, quantize_engine
from course_lib.compression.linear import WeightOnlyLinear
from course_lib.compression.quantize import QuantConfig, quantize
from course_lib.engine import Engine, SamplingParams
from course_lib.engine.layers import Linear, PackedLinear

pytestmark = pytest.mark.usefixtures("one_thread")
G32 = QuantConfig(4, False, "group", 32)


@pytest.mark.parametrize("rows", [1, 3, 40])
def test_packed_linear_matches_f_linear(rows):
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    x = torch.randn(2, rows, 64, generator=g)
    torch.testing.assert_close(PackedLinear(w, b)(x), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    wb = w.bfloat16()
    if not PackedLinear.available(wb):
        pytest.skip("oneDNN does not pack bf16 on this CPU (it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)")
    got = PackedLinear(wb)(x.bfloat16())
    torch.testing.assert_close(got.float(), F.linear(x.bfloat16(), wb).float(), atol=0.1, rtol=0.02)
    assert PackedLinear(w).out_features == 96 and PackedLinear(w).nbytes == 96 * 64 * 4


def test_packed_linear_refuses_other_dtypes():
    with pytest.raises(ValueError, match="fp32 or bf16 weight"):
        PackedLinear(torch.randn(4, 4).half())


def test_pack_float_engine_keeps_greedy_tokens_and_frees_the_model(target):
    eng = Engine(target.hf_model.__class__(target.hf_model.config), target.tokenizer, linear="reference")
    eng.hf_model.load_state_dict(target.hf_model.state_dict())
    eng = Engine(eng.hf_model, target.tokenizer, linear="reference")
    params = SamplingParams(max_new_tokens=8)
    want = eng.generate(["def f(x):"], params)[0].output_ids
    assert df.pack_float_engine(eng) == len(list(eng.model.linears()))
    assert all(isinstance(lin, PackedLinear) for _, lin in eng.model.linears())
    assert eng.hf_model is None
    assert eng.generate(["def f(x):"], params)[0].output_ids == want
    with pytest.raises(ValueError, match="already packed"):
        df.pack_float_engine(eng)


def test_step_bytes_counts_what_the_kernels_read(target):
    eng = Engine(target.hf_model, target.tokenizer)
    body, head = df.step_bytes(eng)
    assert body + head == linear_bytes(eng)  # float: the weights themselves
    quantize_engine(eng, G32)
    fast = [lin for _, lin in eng.model.linears() if lin.path in ("cpu", "gemv")]
    assert fast, "a CPU int4 kernel (the course's GEMV or torch's packed one) should take g32"
    for lin in fast:  # nibbles + a 16-bit scale and zero per 32 weights: Q4_1's 20 bytes per 32
        n, k = lin.qw.shape
        assert df.layer_bytes(lin) / (n * k) == pytest.approx(20 / 32)
    for path, scale_bytes in (("cpu", 2), ("gemv", 4)):  # a bf16 scale per row, or an fp32 one
        try:
            int8 = WeightOnlyLinear(quantize(torch.randn(64, 32), df.INT8), path=path)
        except ValueError:  # that kernel is not available here
            continue
        assert df.layer_bytes(int8) == 64 * 32 + 64 * scale_bytes


@pytest.mark.parametrize("config", [df.INT8, G32, QuantConfig(4, False, "channel")])
def test_quantize_chunked_is_quantize(config):
    w = torch.randn(100, 64, generator=torch.Generator().manual_seed(1))
    a, b = df.quantize_chunked(w, config, rows=7), quantize(w, config)
    assert torch.equal(a.data, b.data) and torch.equal(a.scale, b.scale) and torch.equal(a.zero, b.zero)
    with pytest.raises(ValueError, match="per-tensor"):
        df.quantize_chunked(w, QuantConfig(8, True, "tensor"))
    with pytest.raises(ValueError, match="rows"):
        df.quantize_chunked(w, config, rows=0)


def test_decode_speeds_refuses_bad_input_before_any_work():
    with pytest.raises(ValueError, match="formats"):
        df.decode_speeds(["fp16"])
    with pytest.raises(ValueError, match="steps"):
        df.decode_speeds(["fp32"], steps=1)
    with pytest.raises(ValueError, match="baseline"):
        df.decode_speeds(["int8 per-channel"])
    with pytest.raises(ValueError, match="without repeats"):
        df.decode_speeds(["fp32", "fp32"])


def test_table_ratios_are_paired_per_repeat():
    rows = [
        df.DecodeRow("fp32", "p", 400, 100, 0.04, (0.04, 0.08)),
        df.DecodeRow("bf16", "p", 200, 50, 0.02, (0.02, 0.03), (0.04, 0.06)),  # its own group
        df.DecodeRow("int4 Q4_1, int8 head", "p", 70, 30, 0.01, (0.01, 0.02), (0.04, 0.08)),
    ]
    text = df.table(rows)
    assert "0.200" in text and "4.00x" in text and "2.00x" in text  # bytes 100/500; 4x fp32, 2x bf16
    # a slow second repeat slowed every format alike: the paired ratio has no spread
    assert df.speedup(rows, "fp32", "int4 Q4_1, int8 head") == pytest.approx((4.0, 0.0))
    assert rows[0].spread == pytest.approx(1 / 3)  # while each row's own time spread ±33%
    assert df.speedup(rows, "bf16", "int4 Q4_1, int8 head")[0] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no row named"):
        df.speedup(rows, "fp32", "int8 per-channel")


def test_int8_from_packed_fp32_is_int8_of_the_plain_weight():
    w = torch.randn(48, 32, generator=torch.Generator().manual_seed(4))
    got = df.int8_from({"a": PackedLinear(w)})["a"]
    want = quantize(w, df.INT8)
    assert torch.equal(got.qw.data, want.data) and torch.equal(got.qw.scale, want.scale)


def test_bf16_from_packed_fp32_is_the_bf16_weight():
    w = torch.randn(48, 32, generator=torch.Generator().manual_seed(3))
    got = df.bf16_from({"a": PackedLinear(w), "b": Linear(w)})
    x = torch.randn(2, 32)
    want = F.linear(x.bfloat16(), w.bfloat16()).float()  # the bf16 weight, whichever kernel runs it
    for lin in got.values():
        torch.testing.assert_close(lin(x), want, atol=0.05, rtol=0.02)


def test_step_times_times_engine_steps_and_leaves_it_idle(target):
    eng = Engine(target.hf_model, target.tokenizer, linear="reference")
    times = df.step_times(eng, steps=3, warmup=1, context_len=8)
    assert len(times) == 3 and all(t > 0 for t in times) and not eng.has_unfinished()


# ----------------------------------------------------------------------------- requant
def test_chat_agreement_counts():
    ref = [[1, 2, 3, 4], [5, 6]]
    assert requant.chat_agreement(ref, ref) == {"identical": 2, "prefix": 1.0, "answers": 2}
    got = requant.chat_agreement(ref, [[1, 2, 9, 9], [5, 6]])
    assert got["identical"] == 1 and got["prefix"] == pytest.approx((2 / 4 + 1) / 2)
    with pytest.raises(ValueError, match="same non-zero number"):
        requant.chat_agreement(ref, ref[:1])


def test_compare_formats_on_the_tiny_model(target):
    eng = Engine(target.hf_model, target.tokenizer, linear="reference")
    windows = requant.held_windows(eng, 2, seq_len=64)
    ids = [eng.tokenizer.encode("def f(x):"), eng.tokenizer.encode("import os\n")]
    before = dict(eng.model.linears())
    formats = {
        "same layers": lambda e: dict(e.model.linears()),  # a control: must agree everywhere
        "int4 g32 RTN": lambda e: requant.quantized_layers(e, G32),
    }
    rows = requant.compare_formats(eng, windows, ids, formats, max_new_tokens=6)
    ref, same, int4 = rows
    assert ref["agreement"] == 1.0 and ref["ppl_rel"] == 0.0
    assert same["agreement"] == 1.0 and same["perplexity"] == ref["perplexity"]
    assert same["chat"]["identical"] == 2
    assert int4["perplexity"] != ref["perplexity"] and 0.0 < int4["agreement"] <= 1.0
    assert all(lin is before[n] for n, lin in eng.model.linears())  # swap gave the float layers back
    # the same loss as the package's evaluation over the same windows
    from course_lib.compression.evaluate import evaluate

    assert ref["perplexity"] == pytest.approx(evaluate(eng, seq_len=64, max_tokens=128)["perplexity"], rel=1e-5)
    assert "int4 g32 RTN" in requant.quality_table(rows)


def test_quantized_layers_uses_given_weights_and_refuses_quantized(target):
    eng = Engine(target.hf_model, target.tokenizer, linear="reference")
    name, lin = next(iter(eng.model.linears()))
    qw = quantize(lin.weight, G32)
    layers = requant.quantized_layers(eng, G32, {name: qw}, head=False)
    assert layers[name].qw is qw and "lm_head" not in layers
    with requant.swap(eng, layers):
        with pytest.raises(ValueError, match="already quantized"):
            requant.quantized_layers(eng, G32)
    with pytest.raises(ValueError, match="unknown names"):
        with requant.swap(eng, {"nope": Linear(torch.zeros(2, 2))}):
            pass
    with pytest.raises(ValueError, match="n_windows"):
        requant.held_windows(eng, 0)
    # the head alone is the head quantized_layers builds
    head = requant.int8_head(eng)
    full = requant.quantized_layers(eng, G32)["lm_head"]
    assert torch.equal(head.qw.data, full.qw.data) and torch.equal(head.qw.scale, full.qw.scale)
    with requant.swap(eng, {"lm_head": head}):
        with pytest.raises(ValueError, match="already quantized"):
            requant.int8_head(eng)


# ----------------------------------------------------------------------------- models.gguf's loader
def test_the_loader_reads_safetensors_exactly_and_casts(tmp_path):
    from safetensors.torch import load_file

    from course_lib.core.paths import data_dir
    from course_lib.models.gguf import _read_safetensors

    path = data_dir() / "models" / "tiny-target" / "model.safetensors"
    stored = load_file(str(path))
    read = _read_safetensors(path, torch.float32)
    assert read.keys() == stored.keys() and all(torch.equal(read[k], stored[k]) for k in stored)
    assert all(t.dtype == torch.bfloat16 for t in _read_safetensors(path, torch.bfloat16).values())
    for cut in (1000, path.stat().st_size - 1000):  # inside the header, inside the last tensor
        bad = tmp_path / f"bad{cut}.safetensors"
        bad.write_bytes(path.read_bytes()[:cut])
        with pytest.raises(ValueError, match="truncated"):
            _read_safetensors(bad, torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        _read_safetensors(path, torch.int8)


def test_paired_z_sees_a_shift_and_not_noise():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(512, generator=g) * 4
    assert requant.paired_z(a + 0.1, a) > 100  # the same tokens, every one worse: far beyond noise
    noise = torch.randn(512, generator=g) * 0.01
    assert abs(requant.paired_z(a + noise, a)) < 4
    with pytest.raises(ValueError, match="same shape"):
        requant.paired_z(a, a[:10])
