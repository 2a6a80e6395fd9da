"""engine.layers.PackedLinear and Engine(linear="packed"): the oneDNN-packed weight only, the plain copy freed."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.core.memory import trim_heap
from course_lib.engine import Engine, SamplingParams
from course_lib.engine.layers import Linear, PackedLinear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_forward_equals_f_linear_for_every_row_count(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(67, 45, generator=g)  # awkward sizes: not multiples of any block
    b = torch.randn(67, generator=g) if bias else None
    x = torch.randn(rows, 45, generator=g)
    lin = PackedLinear(w, b)
    torch.testing.assert_close(lin(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    x3 = torch.randn(2, rows, 45, generator=g)  # (batch, tokens, in) keeps its leading shape
    torch.testing.assert_close(lin(x3), F.linear(x3, w, b), rtol=1e-5, atol=1e-5)


def test_the_plain_weight_is_gone_and_comes_back_exactly():
    w = torch.randn(33, 20)
    lin = PackedLinear.from_linear(Linear(w))
    assert lin.weight.is_meta and lin.weight.shape == w.shape
    assert (lin.in_features, lin.out_features, lin.nbytes) == (20, 33, w.numel() * 4)
    assert torch.equal(lin.unpacked(), w)  # I · Wᵀ adds only zeros: bit for bit


def test_a_weight_it_cannot_pack_is_refused_by_name():
    with pytest.raises(ValueError, match="fp32 or bf16 weight on a CPU"):
        PackedLinear(torch.randn(8, 8, dtype=torch.float16))


def test_a_packed_engine_decodes_like_the_reference_and_frees_the_hf_weights():
    ref = Engine("tiny-target", linear="reference")
    packed = Engine("tiny-target", linear="packed")
    prompts = ["def add(a, b):", "import os", "class Stack:\n    def push(self, x):"]
    params = SamplingParams(max_new_tokens=24)
    assert [r.output_ids for r in packed.generate(prompts, params)] == [
        r.output_ids for r in ref.generate(prompts, params)
    ]
    layer = packed.hf_model.model.layers[0]
    assert layer.self_attn.q_proj.weight.is_meta and layer.mlp.down_proj.weight.is_meta
    assert all(isinstance(lin, PackedLinear) for _, lin in packed.model.linears())


@pytest.mark.parametrize("kwargs", [{"dtype": "bf16"}, {"device": "meta"}])
def test_packed_needs_fp32_on_the_cpu_before_any_load(kwargs, monkeypatch):
    import course_lib.models.load as load

    monkeypatch.setattr(load, "load_model", lambda *a, **k: pytest.fail("loaded before checking"))
    with pytest.raises(ValueError, match="linear='packed' needs device='cpu' and dtype='fp32'"):
        Engine("tiny-target", linear="packed", **kwargs)


def test_trim_heap_runs():
    assert trim_heap() in (True, False)


def test_return_large_blocks_checks_its_threshold():
    from course_lib.core.memory import return_large_blocks

    with pytest.raises(ValueError, match="threshold must be a positive int"):
        return_large_blocks(0)
    assert return_large_blocks(1 << 20) in (True, False)


def test_an_unpacked_tied_head_shares_the_embedding_and_decodes_the_same():
    ref = Engine("tiny-target", linear="reference")
    if not ref.hf_model.config.tie_word_embeddings:
        pytest.skip("tiny-target's head is not tied")
    shared = Engine("tiny-target", linear="packed", pack_tied_head=False)
    assert not isinstance(shared.model.lm_head, PackedLinear)
    assert shared.model.lm_head.weight.data_ptr() == shared.model.embed_weight.data_ptr()  # no second copy
    params = SamplingParams(max_new_tokens=16)
    prompts = ["def add(a, b):", "import os"]
    assert [r.output_ids for r in shared.generate(prompts, params)] == [
        r.output_ids for r in ref.generate(prompts, params)
    ]


def test_pack_tied_head_must_be_a_bool():
    with pytest.raises(ValueError, match="pack_tied_head must be a bool"):
        Engine("tiny-target", linear="packed", pack_tied_head="no")
