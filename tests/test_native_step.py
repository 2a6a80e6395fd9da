"""The whole decode step in one C call (engine/native_step.py, kernels/cpu_gemv/step.c) against the eager reference."""

import warnings

import pytest
import torch

from course_lib.compression.linear import WeightOnlyLinear
from course_lib.compression.quantize import QuantConfig, quantize
from course_lib.engine import Engine, SamplingParams, SchedulerConfig
from course_lib.engine.fast_decode import FastDecoder
from course_lib.engine.native_step import NativeStep
from course_lib.kernels import cpu_gemv

pytestmark = pytest.mark.skipif(not cpu_gemv.available(), reason="kernels.cpu_gemv is not built on this machine")

PROMPTS = ["def fib(n):", "import os\nimport sys\n\n\nclass Foo:\n    x", "x = 1 +", "for i in range(10):\n"]
INT8 = QuantConfig(bits=8, granularity="channel", symmetric=True)
INT4 = QuantConfig(bits=4, granularity="group", group_size=32, symmetric=False)


@pytest.fixture(scope="module")
def tiny():
    return Engine("tiny-target", config=SchedulerConfig(max_model_len=256, max_num_seqs=4))


@torch.inference_mode()
def _step_logits(engine, prompts, fast):
    """Prefill ``prompts`` with the reference, then one decode step's logits: eager, and through ``fast``."""
    be, rows, ids = engine.backend, [], engine.encode(prompts)
    saved = engine.fast
    engine.fast = None
    for p in ids:
        row = be.allocate()
        be.append(row, len(p))
        engine.forward([row], [p], [0])
        be.append(row, 1)
        rows.append(row)
    nxt, starts = [[p[-1]] for p in ids], [len(p) for p in ids]
    try:
        ref = engine.forward(rows, nxt, starts)
        engine.fast = fast
        out = engine.forward(rows, nxt, starts)
    finally:
        engine.fast = saved
        for r in rows:
            be.free(r)
    return ref, out


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_logits_match_eager(tiny, batch):
    fast = FastDecoder(tiny.model, "native")
    ref, out = _step_logits(tiny, PROMPTS[:batch], fast)
    assert fast._native._key is not None  # the C step ran, not the reference
    assert out.shape == ref.shape == (batch, tiny.model.vocab_size)
    assert (out - ref).abs().max().item() < 1e-5 * max(1.0, ref.abs().max().item())
    assert torch.equal(out.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_output_identical(tiny, batch):
    p = SamplingParams(max_new_tokens=21, ignore_eos=True)
    want = [r.output_ids for r in tiny.generate(PROMPTS[:batch], p)]
    native = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, decode="native")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every step is taken: no "does not take this step" warning
        assert [r.output_ids for r in native.generate(PROMPTS[:batch], p)] == want


def test_greedy_equals_transformers_generate(tiny):
    native = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, decode="native")
    ids = tiny.tokenizer(PROMPTS[1], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hf = tiny.hf_model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24,
            do_sample=False, pad_token_id=tiny.tokenizer.pad_token_id,
        )  # fmt: skip
    out = native.generate([PROMPTS[1]], SamplingParams(max_new_tokens=24, ignore_eos=True))[0].output_ids
    assert out == hf[0, ids.shape[1] :].tolist()


def _quantized(engine, config, path="gemv"):
    eng = Engine(engine.hf_model, engine.tokenizer, config=engine.config, linear="reference")
    with torch.no_grad():
        for name, lin in list(eng.model.linears()):
            eng.model.set_linear(name, WeightOnlyLinear(quantize(lin.weight, config), lin.bias, path=path))
    return eng


@pytest.mark.parametrize("config", [INT8, INT4], ids=["int8", "int4"])
def test_quantized_layers_match_their_eager_kernels(tiny, config):
    """One row: eager runs the same int8/int4 kernels per product; 3 rows: each row as it is alone."""
    eng = _quantized(tiny, config)
    fast = FastDecoder(eng.model, "native")
    ref, out = _step_logits(eng, PROMPTS[:1], fast)
    assert (out - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())
    _, three = _step_logits(eng, PROMPTS[:3], fast)
    alone = torch.cat([_step_logits(eng, [p], fast)[1] for p in PROMPTS[:3]])
    assert (three - alone).abs().max().item() < 1e-4 * max(1.0, alone.abs().max().item())


def test_int4_q8_layers_match_their_eager_kernel(tiny):
    """path="gemv-q8" (activations rounded to int8 per block of 32) in the C step. Rounding is a step
    function: fp32 differences of 1e-7 between the two steps' inputs flip a few roundings per layer, and
    over 6 layers those add up to ~0.5% of the logits (measured); so the products are compared where
    one layer's products round (layer 0, and every layer's qkv), each row alone, and the whole model
    checked for its top token."""
    eng = _quantized(tiny, INT4, "gemv-q8")
    fast = FastDecoder(eng.model, "native")
    ref, out = _step_logits(eng, PROMPTS[:1], fast)
    assert fast._native._key is not None and torch.equal(out.argmax(-1), ref.argmax(-1))
    _, three = _step_logits(eng, PROMPTS[:3], fast)
    alone = torch.cat([_step_logits(eng, [p], fast)[1] for p in PROMPTS[:3]])
    assert (three - alone).abs().max().item() < 1e-4 * max(1.0, alone.abs().max().item())
    for picks in (lambda n: n.startswith("layers.0."), lambda n: n.endswith(".qkv")):
        eng = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, linear="reference")
        with torch.no_grad():
            for name, lin in list(eng.model.linears()):
                path = "gemv-q8" if picks(name) else "gemv"
                eng.model.set_linear(name, WeightOnlyLinear(quantize(lin.weight, INT4), lin.bias, path=path))
        ref, out = _step_logits(eng, PROMPTS[:1], FastDecoder(eng.model, "native"))
        assert (out - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())


def test_biases_and_replaced_layers(tiny):
    """Qwen2-style q/k/v biases are added; a projection replaced after the first step is picked up."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tiny.tokenizer), hidden_size=48, intermediate_size=72, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128, attention_bias=True,
        mlp_bias=True, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(3)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    eng = Engine(hf, tiny.tokenizer, config=SchedulerConfig(max_model_len=64, max_num_seqs=2))
    fast = FastDecoder(eng.model, "native")
    ref, out = _step_logits(eng, PROMPTS[:2], fast)
    assert (out - ref).abs().max().item() < 1e-5 * max(1.0, ref.abs().max().item())
    with torch.no_grad():
        lin = eng.model.layers[1].gate_up
        eng.model.set_linear("layers.1.gate_up", WeightOnlyLinear(quantize(lin.weight, INT8), lin.bias, path="gemv"))
    ref, out = _step_logits(eng, PROMPTS[:2], fast)
    assert (out - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())


def test_steps_it_does_not_take_run_the_reference_with_one_warning(tiny):
    p = SamplingParams(max_new_tokens=6, ignore_eos=True)
    want = [r.output_ids for r in tiny.generate(PROMPTS[:2], p)]
    paged = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, kv_cache="paged", decode="native")
    with pytest.warns(UserWarning, match="does not take this step.*PagedBackend") as rec:
        assert [r.output_ids for r in paged.generate(PROMPTS[:2], p)] == want
    assert len([w for w in rec if "does not take" in str(w.message)]) == 1  # once, not once per step
    dyn = Engine(tiny.hf_model, tiny.tokenizer, config=tiny.config, linear="reference", decode="native")
    with torch.no_grad():
        lin = dyn.model.layers[0].o
        dyn.model.set_linear("layers.0.o", WeightOnlyLinear(quantize(lin.weight, INT8), None, path="dynamic"))
    with pytest.warns(UserWarning, match="layers.0.o is a WeightOnlyLinear on path 'dynamic'"):
        dyn.generate(PROMPTS[:1], p)
    fd = FastDecoder(tiny.model, "native")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not fd.supports(tiny.backend, [1] * (cpu_gemv.MAX_ROWS + 1), [5] * (cpu_gemv.MAX_ROWS + 1))
        assert not fd.supports(tiny.backend, [1, 3], [5, 9])


def test_no_kernels_means_the_reference(tiny, monkeypatch):
    monkeypatch.setattr(cpu_gemv, "available", lambda: False)
    fd = FastDecoder(tiny.model, "native")
    row = tiny.backend.allocate()
    try:
        tiny.backend.append(row, 3)
        with pytest.warns(UserWarning, match="kernels.cpu_gemv is unavailable"):
            assert not fd.supports(tiny.backend, [1], [3])
    finally:
        tiny.backend.free(row)


def test_bad_input_is_named(tiny):
    step = NativeStep(tiny.model)
    row = tiny.backend.allocate()
    try:
        tiny.backend.append(row, 4)
        with pytest.raises(ValueError, match="token ids must be in"):
            step(tiny.backend, [row], [tiny.model.vocab_size], [3])
        with pytest.raises(ValueError, match="cache rows must be in"):
            step(tiny.backend, [10_000], [1], [3])
        assert step(tiny.backend, [row], [1], [3]).shape == (1, tiny.model.vocab_size)
    finally:
        tiny.backend.free(row)
