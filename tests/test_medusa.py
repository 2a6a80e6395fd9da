"""Medusa heads (course_lib.engine.speculative.medusa, .medusa_tree; course_lib.decoding.medusa_train, .medusa_speed):
fingerprint, shapes, greedy identity (chain and tree), tree mask, training, measurement."""

import math

import pytest
import torch

from course_lib.decoding.medusa_speed import format_medusa_table, measure_medusa
from course_lib.decoding.medusa_train import target_hidden, train_heads
from course_lib.engine import Engine, SamplingParams
from course_lib.engine.speculative import SpeculativeDecoder
from course_lib.engine.speculative.medusa import (
    MedusaHeads,
    MedusaProposer,
    load_medusa,
    medusa_decoder,
    save_medusa,
)
from course_lib.engine.speculative.medusa_tree import MedusaTreeDecoder, check_tree, tree_from_top, tree_mask
from tests.conftest import random_llama

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\nimport re", "class Stack:\n    def", "x = 1\ny = 2\nx = 1\n"]


pytestmark = pytest.mark.usefixtures("one_thread")  # target: the conftest fixture


@pytest.fixture(scope="module")
def heads(target):
    return load_medusa("tiny-target-medusa", target)


def _reference(engine, ids, n):
    return [r.output_ids for r in engine.generate(ids, SamplingParams(max_new_tokens=n, ignore_eos=True))]


def _assert_close(actual, expected, name, atol, rtol=0.0):
    diff = (actual - expected).abs()
    ok = torch.allclose(actual, expected, atol=atol, rtol=rtol)
    assert ok, f"{name}: max diff {diff.max():.3g}, mean {diff.mean():.3g} (atol {atol})"


# ------------------------------------------------------------------------------------------ bad input


def test_heads_trained_for_another_model_are_refused(target, tokenizer, tmp_path):
    other = Engine(random_llama(tokenizer), tokenizer)  # hidden 64, 2 layers
    save_medusa(MedusaHeads(other, 2), tmp_path / "other")
    with pytest.raises(ValueError, match="Medusa heads trained for another model.*hidden_size"):
        load_medusa(tmp_path / "other", target)
    with pytest.raises(ValueError, match="Medusa heads trained for another model"):
        MedusaProposer(MedusaHeads(other, 2), target)
    with pytest.raises(ValueError, match="Medusa heads trained for another model"):
        MedusaTreeDecoder(target, MedusaHeads(other, 2))
    same_shape = MedusaHeads(target, 1)  # same shapes, other LM-head weights
    same_shape.fingerprint["lm_head_probe"] = [v + 0.5 for v in same_shape.fingerprint["lm_head_probe"]]
    save_medusa(same_shape, tmp_path / "same_shape")
    with pytest.raises(ValueError, match="Medusa heads trained for another model: LM-head weights differ"):
        load_medusa(tmp_path / "same_shape", target)


def test_bad_arguments(target, heads, tmp_path):
    for bad in (0, -1, 2.0, True, "4"):
        with pytest.raises(ValueError, match="num_heads"):
            MedusaHeads(target, bad)
    with pytest.raises(ValueError, match="target must be an Engine"):
        MedusaHeads("tiny-target", 2)
    with pytest.raises(ValueError, match=r"hidden must be a tensor \(\.\.\., 256\)"):
        heads(torch.zeros(3, 17))
    with pytest.raises(ValueError, match="path: no Medusa weights"):
        load_medusa(tmp_path / "nothing", target)
    with pytest.raises(ValueError, match="target must be an Engine"):
        load_medusa("tiny-target-medusa", "tiny-target")
    with pytest.raises(ValueError, match="heads must be MedusaHeads"):
        MedusaProposer(object())
    with pytest.raises(ValueError, match="top must be"):
        tree_from_top([])
    with pytest.raises(ValueError, match="only 4 heads"):
        check_tree(tree_from_top((1,) * 5), 4)
    with pytest.raises(ValueError, match="no parent"):
        check_tree([(0,), (1, 0)], 4)
    with pytest.raises(ValueError, match="repeated"):
        check_tree([(0,), (0,)], 4)
    with pytest.raises(ValueError, match="max_nodes"):
        check_tree(tree_from_top((4, 4, 4)), 4, max_nodes=16)
    with pytest.raises(ValueError, match="greedy only"):
        MedusaTreeDecoder(target, heads).generate(["x"], SamplingParams(temperature=0.8))
    with pytest.raises(ValueError, match="steps"):
        train_heads(target, steps=0)
    with pytest.raises(ValueError, match="lr"):
        train_heads(target, lr=-1.0)
    with pytest.raises(ValueError, match="seq_len"):
        train_heads(target, num_heads=4, seq_len=5)


# ------------------------------------------------------------------------------------------ the heads


def test_untrained_heads_are_the_base_head(target):
    """W = b = 0 → z + SiLU(0) = z: every head's logits are the base LM head's, so at the hidden state that
    produced the pending token, every untrained head (greedy) proposes the pending token again."""
    fresh = MedusaHeads(target, 3)
    ids = torch.tensor([target.encode(PROMPTS[:1])[0]])
    h = target_hidden(target, ids)[0]  # (T, D)
    base = target.model.head(h)  # (T, V)
    logits = fresh(h)  # (3, T, V)
    for k in range(3):
        _assert_close(logits[k], base, f"head {k + 1}", atol=1e-4)
    seen = []

    class Recording(MedusaProposer):
        def propose_batch(self, keys, contexts, ks, params, generators):
            out = super().propose_batch(keys, contexts, ks, params, generators)
            seen.extend((c[-1], p.tokens) for c, p in zip(contexts, out) if p.tokens)
            return out

    dec = SpeculativeDecoder(target, Recording(fresh, target), gamma=3)
    out = dec.generate(PROMPTS[:2], SamplingParams(ignore_eos=True), max_new_tokens=10)
    assert [r.output_ids for r in out] == _reference(target, target.encode(PROMPTS[:2]), 10)
    assert seen and all(toks == [pending] * len(toks) for pending, toks in seen)


def test_save_load_roundtrip(target, tmp_path):
    torch.manual_seed(0)
    h = MedusaHeads(target, 2)
    with torch.no_grad():
        for p in h.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_medusa(h, tmp_path)
    back = load_medusa(tmp_path, target)
    assert back.num_heads == 2 and not back.training
    x = torch.randn(5, 256)
    _assert_close(back(x), h(x).detach(), "fp16 round trip", atol=5e-2)  # stored in fp16


def test_train_heads_lowers_the_loss(target):
    from course_lib.core.paths import data_dir
    from course_lib.models.tokenizer import load_tokenizer, token_ids

    tok = load_tokenizer(data_dir() / "models" / "tokenizer")
    data = (token_ids(tok, "train"), token_ids(tok, "val")[:4096])
    log = train_heads(
        target, num_heads=2, steps=8, batch=2, seq_len=64, lr=3e-3, eval_every=8, eval_tokens=1024, data=data
    )
    first, last = log["eval"][0], log["eval"][-1]
    assert first["step"] == 0 and last["step"] == 8
    assert sum(last["val"]["loss"]) < sum(first["val"]["loss"])
    assert log["train"][-1]["loss"] < log["train"][0]["loss"]
    assert len(last["val"]["top1"]) == 2 and all(0 <= a <= 1 for a in last["val"]["top1"])


# ------------------------------------------------------------------------------------------ decoding


def _check_stats(s, results):
    assert sum(s.proposed_at) == s.proposed and sum(s.accepted_at) == s.accepted
    assert all(a <= p for a, p in zip(s.accepted_at, s.proposed_at))
    assert all(a >= b for a, b in zip(s.accepted_at, s.accepted_at[1:]))  # accepting draft j needs draft j-1
    assert s.generated == sum(len(r.output_ids) for r in results)
    assert math.isclose(s.tokens_per_forward, s.generated / s.row_steps)
    assert all(r.kv_length == len(r.prompt_ids) + len(r.output_ids) - 1 for r in results)  # newest is pending


def test_top1_greedy_identity_batched(target, heads):
    ids = target.encode(PROMPTS)
    out = medusa_decoder(target, heads).generate(ids, SamplingParams(ignore_eos=True), max_new_tokens=24)
    assert [r.output_ids for r in out] == _reference(target, ids, 24)
    s = out.stats
    assert s.gamma == heads.num_heads and 0 < s.accepted < s.proposed
    assert s.target_forwards < 24
    assert any(len({a for a in step if a is not None}) > 1 for step in s.history)  # rows accept differently
    _check_stats(s, out.results)


def test_top1_sampling_runs_and_is_seeded(target, heads):
    dec = medusa_decoder(target, heads)
    params = [SamplingParams(temperature=0.8, seed=s, ignore_eos=True) for s in (1, 2)]
    a = dec.generate(PROMPTS[:2], params, max_new_tokens=16)
    b = dec.generate(PROMPTS[:2], params, max_new_tokens=16)
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert all(len(r.output_ids) == 16 for r in a)
    _check_stats(a.stats, a.results)


def test_tree_mask_against_brute_force():
    for paths in (tree_from_top((2, 2, 1)), check_tree([(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (1, 0)], 3)):
        m = tree_mask(paths)
        nodes = [()] + list(paths)
        for i, a in enumerate(nodes):
            for j, b in enumerate(nodes):
                assert bool(m[i, j]) == (a[: len(b)] == b), (a, b)  # ancestors-or-self only


def test_tree_attention_matches_sequential_forward(target, heads):
    """Every node's hidden state in ONE tree forward equals a plain causal forward of prompt + its path."""
    dec = MedusaTreeDecoder(target, heads, top=(2, 2, 1))
    kv = target.backend
    prompt = target.encode(PROMPTS[:1])[0]
    node_tok = {p: 100 + 7 * i for i, p in enumerate(dec.paths)}  # arbitrary tokens for the 2 + 4 + 4 = 10 nodes
    handle = kv.allocate()
    try:
        with torch.inference_mode():
            dec._forward(handle, prompt[:-1], list(range(len(prompt) - 1)), None)
            s = len(prompt) - 1
            flat = [prompt[-1]] + [node_tok[p] for p in dec.paths]
            hid = dec._forward(handle, flat, [s + d for d in dec.depth], dec.mask)
            for i, p in enumerate(dec.paths, start=1):
                seq = prompt + [node_tok[p[:d]] for d in range(1, len(p) + 1)]
                ref = target_hidden(target, torch.tensor([seq]))[0, -1]
                _assert_close(hid[i], ref, f"node {p}", atol=1e-4)
    finally:
        kv.free(handle)


@pytest.mark.parametrize("top", [(2, 2, 1, 1), (3, 1)])
def test_tree_greedy_identity(target, heads, top):
    ids = target.encode(PROMPTS[:3])
    out = MedusaTreeDecoder(target, heads, top=top).generate(ids, SamplingParams(ignore_eos=True), max_new_tokens=20)
    assert [r.output_ids for r in out] == _reference(target, ids, 20)
    s = out.stats
    assert s.prefills == 3 and s.accepted > 0
    assert s.nodes_per_forward <= len(tree_from_top(top))
    _check_stats(s, out.results)
    assert s.generated == s.prefills + s.accepted + (s.target_forwards - s.prefills)  # no trimming here: 20 ≥ …


def test_tree_stops_at_eos_and_length(target, heads):
    ids = target.encode(PROMPTS[:2])
    params = SamplingParams(max_new_tokens=7)
    out = MedusaTreeDecoder(target, heads).generate(ids, params)
    ref = target.generate(ids, params)
    assert [r.output_ids for r in out] == [r.output_ids for r in ref]
    assert [r.finish_reason for r in out] == [r.finish_reason for r in ref]


def test_measure_medusa_table(target, heads):
    res = measure_medusa(target, heads, prompts=PROMPTS[:1], max_new_tokens=8, repeats=1)
    assert [r["identical"] for r in res["rows"]] == [True, True, True]
    assert len(res["rows"][1]["acceptance_at"]) == heads.num_heads
    assert "tok/fwd" in format_medusa_table(res)
