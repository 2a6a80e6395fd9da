"""Pruning (course_lib.compression.prune) and the engine-side evaluation (course_lib.compression.evaluate)."""

import math

import numpy as np
import pytest
import torch

from course_lib.compression import prune
from course_lib.compression.evaluate import (
    decode_step_time,
    evaluate,
    greedy_agreement,
    perplexity,
    validation_tokens,
)
from course_lib.engine import SamplingParams

TOKENS = 2048  # validation tokens per perplexity: 8 windows of 256, well under a second


def fresh():
    from course_lib.engine import Engine

    return Engine("tiny-target")


@pytest.fixture(scope="module")
def engine():
    return fresh()


@pytest.fixture(scope="module")
def dense_ppl(engine):
    return perplexity(engine, max_tokens=TOKENS)


def test_perplexity_matches_hf_evaluate(engine, dense_ppl):
    from course_lib.models.evaluation import evaluate as hf_evaluate

    val = validation_tokens(engine)
    ref = hf_evaluate(engine.hf_model, val, max_tokens=TOKENS)
    assert dense_ppl == pytest.approx(ref["perplexity"], rel=0.01)
    ours = evaluate(engine, val, max_tokens=TOKENS)
    assert ours["tokens"] == ref["tokens"] and ours["top1"] == pytest.approx(ref["top1"], abs=0.01)


@pytest.mark.parametrize("sparsity", [0.3, 0.7])
def test_layer_masks_reach_sparsity(engine, sparsity):
    masks = prune.magnitude_masks(engine, sparsity)
    assert set(masks) == set(prune.prunable(engine)) and "lm_head" not in masks
    for name, mask in masks.items():
        assert mask.dtype == torch.bool
        assert 1 - mask.float().mean().item() == pytest.approx(sparsity, abs=0.01), name
    # the pruned weights are the smallest ones of their layer
    w, m = engine.model.layers[0].qkv.weight.abs(), masks["layers.0.qkv"]
    assert w[~m].max() <= w[m].min()
    assert "lm_head" in prune.magnitude_masks(engine, sparsity, include_lm_head=True)


def test_global_scope_same_total_different_layers(engine):
    masks = prune.magnitude_masks(engine, 0.5, scope="global")
    kept = sum(m.sum().item() for m in masks.values())
    total = sum(m.numel() for m in masks.values())
    assert 1 - kept / total == pytest.approx(0.5, abs=0.01)
    per_layer = [1 - m.float().mean().item() for m in masks.values()]
    assert max(per_layer) - min(per_layer) > 0.05  # one threshold: layers lose different fractions
    # one threshold: every pruned |w| is at most every kept |w|, across layers
    layers = prune.prunable(engine)
    pruned_max = max(layers[n].weight.abs()[~m].max().item() for n, m in masks.items())
    kept_min = min(layers[n].weight.abs()[m].min().item() for n, m in masks.items())
    assert pruned_max <= kept_min


def test_apply_masks_zeroes_engine_and_hf():
    e = fresh()
    x = torch.randint(0, e.model.vocab_size, (1, 16))
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    e.generate([x[0].tolist()], params)  # decode once: SkinnyLinear packs the dense weights
    prune.apply_masks(e, prune.magnitude_masks(e, 0.5))
    assert prune.sparsity_of(e) == pytest.approx(0.5, abs=0.01)
    assert all(s == pytest.approx(0.5, abs=0.01) for s in prune.layer_sparsity(e).values())
    gate = e.hf_model.model.layers[0].mlp.gate_proj.weight  # a view of the fused gate_up tensor
    assert 0.3 < (gate == 0).float().mean().item() < 0.7
    with torch.no_grad():
        assert torch.allclose(e.model.dense_logits(x), e.hf_model(input_ids=x).logits, atol=1e-4)
        hf = e.hf_model.generate(x, max_new_tokens=4, min_new_tokens=4, do_sample=False)[0, 16:].tolist()
    assert e.generate([x[0].tolist()], params)[0].output_ids == hf  # decode uses the pruned weights, not stale packs


def test_perplexity_grows_with_sparsity(dense_ppl):
    ppl = [dense_ppl]
    for s in (0.5, 0.9):
        e = fresh()
        prune.apply_masks(e, prune.magnitude_masks(e, s))
        ppl.append(perplexity(e, max_tokens=TOKENS))
    assert ppl[0] < ppl[1] < ppl[2], ppl


def test_greedy_agreement(engine):
    assert greedy_agreement(engine, engine, max_tokens=512) == 1.0
    e = fresh()
    prune.apply_masks(e, prune.magnitude_masks(e, 0.7))
    a = greedy_agreement(engine, e, max_tokens=512)
    assert 0.0 < a < 1.0


def test_recover_keeps_zeros():
    e = fresh()
    masks = prune.magnitude_masks(e, 0.5)
    before = e.model.layers[1].gate_up.weight.clone()
    log = prune.recover(e, masks, steps=3, batch=2, seq_len=32, lr=1e-3)
    assert [r["step"] for r in log] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in log)
    for name, lin in prune.prunable(e).items():
        assert (lin.weight[~masks[name]] == 0).all(), name
    after = e.model.layers[1].gate_up.weight
    kept = masks["layers.1.gate_up"]
    assert not torch.equal(after[kept], before[kept])  # the engine sees the trained weights (shared storage)
    x = torch.randint(0, e.model.vocab_size, (1, 16))
    with torch.no_grad():
        assert torch.allclose(e.model.dense_logits(x), e.hf_model(input_ids=x).logits, atol=1e-4)
    assert not e.hf_model.training


def test_structured_pruning_shrinks_and_runs(engine):
    x = torch.randint(0, engine.model.vocab_size, (2, 24))
    with torch.no_grad():
        ref = engine.model.dense_logits(x)
    e = fresh()
    report = prune.prune_mlp_channels(e, 0.0)
    assert report.ffn_after == report.ffn_before and report.params_after == report.params_before
    with torch.no_grad():
        assert torch.equal(e.model.dense_logits(x), ref)

    e = fresh()
    ffn = e.model.ffn_size
    report = prune.prune_mlp_channels(e, 0.25)
    assert report.ffn_after == ffn - round(0.25 * ffn) == e.model.ffn_size
    assert report.params_after < report.params_before and report.bytes_after < report.bytes_before
    for layer in e.model.layers:
        assert tuple(layer.gate_up.weight.shape) == (2 * report.ffn_after, e.model.config.hidden_size)
        assert tuple(layer.down.weight.shape) == (e.model.config.hidden_size, report.ffn_after)
    with torch.no_grad():
        out = e.model.dense_logits(x)
    assert out.shape == ref.shape and torch.isfinite(out).all() and not torch.equal(out, ref)
    assert decode_step_time(e, new_tokens=2, repeats=1) > 0
    with pytest.raises(ValueError, match="out of sync"):
        prune.recover(e, {}, steps=1)
    with pytest.raises(ValueError, match="fraction"):
        prune.prune_mlp_channels(fresh(), 1.0)
    with pytest.raises(ValueError, match="multiple_of"):
        prune.prune_mlp_channels(fresh(), 0.5, multiple_of=0)


def test_two_four_mask():
    torch.manual_seed(0)
    w = torch.randn(8, 16)
    mask = prune.two_four_mask(w)
    assert mask.shape == w.shape and (mask.view(8, 4, 4).sum(-1) == 2).all()
    groups, kept = w.abs().view(8, 4, 4), mask.view(8, 4, 4)
    # every kept weight is at least as large as every dropped one in its group
    assert (groups.masked_fill(~kept, math.inf).amin(-1) >= groups.masked_fill(kept, -math.inf).amax(-1)).all()
    with pytest.raises(ValueError, match=r"\(8, 6\)"):
        prune.two_four_mask(torch.randn(8, 6))
    with pytest.raises(ValueError, match="2-D"):
        prune.two_four_mask(torch.randn(16))


def test_semi_structured_shape_constraints():
    # read from torch's own tables (cuSPARSELt: multiples of 16; CUTLASS: rows of 32, cols of 64 for fp16)
    assert prune.semi_structured_shape_problem((384, 256), torch.float16) is None
    assert prune.semi_structured_shape_problem((4096, 4096), torch.bfloat16) is None
    problem = prune.semi_structured_shape_problem((24, 40), torch.float16)
    assert problem is not None and "(24, 40)" in problem
    assert "cuda" in prune.sparse_kernel_problem("cpu", torch.float16).lower()


def test_apply_two_four_on_cpu_is_a_mask():
    e = fresh()
    with pytest.raises(ValueError, match="use_sparse_kernels=True"):
        prune.apply_two_four(e, use_sparse_kernels=True)
    with pytest.raises(ValueError, match="use_sparse_kernels"):
        prune.apply_two_four(e, use_sparse_kernels="yes")
    assert prune.sparsity_of(e) == 0  # the errors came before any change
    report = prune.apply_two_four(e)
    assert not report.sparse_kernels and "no 2:4 speed-up" in report.note
    assert report.sparsity == pytest.approx(0.5, abs=1e-3)
    for name, lin in prune.prunable(e).items():
        assert ((lin.weight != 0).view(lin.weight.shape[0], -1, 4).sum(-1) <= 2).all(), name
    assert math.isfinite(perplexity(e, max_tokens=256))


def test_bad_inputs(engine):
    for bad in (-0.1, 1.0, 1.5, float("nan"), True, "0.5", None):
        with pytest.raises(ValueError, match="sparsity"):
            prune.magnitude_masks(engine, bad)
    with pytest.raises(ValueError, match="scope"):
        prune.magnitude_masks(engine, 0.5, scope="row")
    with pytest.raises(ValueError, match="fraction"):
        prune.prune_mlp_channels(engine, -0.5)  # rejected before any change
    with pytest.raises(ValueError, match="no linear layer"):
        prune.apply_masks(engine, {"layers.99.qkv": torch.ones(2, 2, dtype=torch.bool)})
    with pytest.raises(ValueError, match="shape"):
        prune.apply_masks(engine, {"layers.0.qkv": torch.ones(2, 2, dtype=torch.bool)})
    with pytest.raises(ValueError, match="steps"):
        prune.recover(engine, {}, steps=0)
    with pytest.raises(ValueError, match="seq_len"):
        perplexity(engine, seq_len=10_000)
    with pytest.raises(ValueError, match="token ids"):
        perplexity(engine, data=np.array([0, 1, 10**6] * 200), seq_len=8)
    with pytest.raises(ValueError, match="sparsity"):
        prune.dense_vs_sparse_time(64, 64, sparsity=1.0)
    with pytest.raises(ValueError, match="batch"):
        prune.dense_vs_sparse_time(64, 64, batches=(0,))
    assert prune.sparsity_of(engine) == 0  # nothing above touched the shared engine


def test_dense_vs_sparse_time_rows():
    rows = prune.dense_vs_sparse_time(256, 128, batches=(1, 4), repeats=1)
    formats = {r["format"] for r in rows}
    assert {"dense", "dense, 50% zeros", "CSR (torch.sparse)", "2:4 semi-structured"} <= formats
    assert {r["batch"] for r in rows} == {1, 4}
    by = {(r["format"], r["batch"]): r for r in rows}
    dense = by[("dense", 1)]
    assert (
        dense["bytes"] == 256 * 128 * (2 if dense["device"] == "cuda" else 4)
        and dense["speedup"] == 1.0
        and dense["time_s"] > 0
    )
    assert by[("dense, 50% zeros", 1)]["bytes"] == dense["bytes"]  # zeros are still stored and read
    assert by[("CSR (torch.sparse)", 1)]["bytes"] > dense["bytes"]  # 8-byte index per kept 4-byte value
    assert by[("CSR (torch.sparse)", 1)]["time_s"] > 0
    if not torch.cuda.is_available():
        assert (
            math.isnan(by[("2:4 semi-structured", 1)]["time_s"])
            and "cuda" in by[("2:4 semi-structured", 1)]["note"].lower()
        )
