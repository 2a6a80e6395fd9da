"""Speculative decoding (course_lib.engine.speculative): greedy identity, rollback, distribution, theory."""

import math

import pytest
import torch

from course_lib.engine import Engine, SamplingParams, SchedulerConfig
from course_lib.engine.speculative import (
    DraftProposer,
    PromptLookupProposer,
    SpeculativeDecoder,
    best_gamma,
    expected_speedup,
    expected_tokens,
)
from tests.conftest import random_llama

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n", "class Stack:\n    def"]
REPETITIVE = "x = 1\ny = 2\nz = 3\nx = 1\ny = 2\nz = 3\nx = 1\ny = 2\nz = 3\nx = 1\n"


pytestmark = pytest.mark.usefixtures("one_thread")  # target: the conftest fixture


@pytest.fixture(scope="module")
def draft():
    return Engine("tiny-draft")


def _reference(engine, ids, n):
    return [r.output_ids for r in engine.generate(ids, SamplingParams(max_new_tokens=n, ignore_eos=True))]


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_identity_with_draft_model(target, draft, gamma):
    ids = target.encode(PROMPTS)
    ref = _reference(target, ids, 28)
    out = SpeculativeDecoder(target, DraftProposer(draft), gamma).generate(
        ids, SamplingParams(ignore_eos=True), max_new_tokens=28
    )
    assert [r.output_ids for r in out] == ref
    s = out.stats
    assert 0 < s.accepted < s.proposed
    assert s.target_forwards < 28  # fewer target forwards than tokens
    # rows of one batch accepted different numbers of drafts in the same step
    assert any(len({a for a in step if a is not None}) > 1 for step in s.history)
    assert sum(s.proposed_at) == s.proposed and sum(s.accepted_at) == s.accepted
    assert all(a <= p for a, p in zip(s.accepted_at, s.proposed_at))
    # rollback invariant: the target's cache holds prompt + generated − 1 tokens (the newest is pending);
    # the draft's holds a prefix of that, never a rejected token
    for r in out:
        assert r.kv_length == len(r.prompt_ids) + len(r.output_ids) - 1
        assert r.draft_kv_length <= r.kv_length


def test_greedy_identity_with_prompt_lookup(target):
    ids = target.encode([REPETITIVE, PROMPTS[0]])
    ref = _reference(target, ids, 32)
    out = SpeculativeDecoder(target, PromptLookupProposer(ngram=2, max_ngram=4), 4).generate(
        ids, SamplingParams(ignore_eos=True), max_new_tokens=32
    )
    assert [r.output_ids for r in out] == ref
    assert out[0].accepted > 0
    assert all(r.kv_length == len(r.prompt_ids) + len(r.output_ids) - 1 for r in out)


def test_rollback_leaves_the_same_cache_as_a_fresh_prefill(target, draft):
    """After speculative steps with rejections, the target's K/V equal a plain prefill of the kept tokens."""
    ids = target.encode(PROMPTS[:2])
    dec = SpeculativeDecoder(target, DraftProposer(draft), 4)
    kv = target.backend
    captured = {}
    orig_free = kv.free

    def capture(handle):  # snapshot each row's cache just before the decoder frees it
        n = kv.length(handle)
        captured[handle] = (n, [k[handle, :, :n].clone() for k in kv.k])
        orig_free(handle)

    kv.free = capture
    try:
        out = dec.generate(ids, SamplingParams(ignore_eos=True), max_new_tokens=20)
    finally:
        kv.free = orig_free
    assert out.stats.accepted < out.stats.proposed  # there were rejections to roll back
    assert len(captured) == 2
    for r, (n, ks) in zip(out, captured.values()):
        seq = r.prompt_ids + r.output_ids
        assert n == len(seq) - 1
        h = kv.allocate()
        try:
            kv.append(h, n)
            with torch.inference_mode():
                target.forward([h], [seq[:n]], [0])
            for k_spec, k in zip(ks, kv.k):
                torch.testing.assert_close(k_spec, k[h, :, :n], rtol=1e-4, atol=1e-5)
        finally:
            orig_free(h)


def test_eos_and_length_stop(target, draft):
    ids = target.encode(PROMPTS[:2])
    ref = target.generate(ids, SamplingParams(max_new_tokens=24))
    out = SpeculativeDecoder(target, DraftProposer(draft), 3).generate(ids, SamplingParams(max_new_tokens=24))
    assert [r.output_ids for r in out] == [r.output_ids for r in ref]
    assert [r.finish_reason for r in out] == [r.finish_reason for r in ref]
    assert all(len(r.output_ids) <= 24 for r in out)


def test_prompt_lookup_proposer():
    p = PromptLookupProposer(ngram=2)
    assert p.propose([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert p.propose([1, 2, 3, 4, 1, 2], 10) == [3, 4, 1, 2]  # the rest of the context
    assert p.propose([1, 2, 3, 1, 2, 9, 1, 2], 1) == [9]  # the latest occurrence wins
    assert p.propose([1, 2, 3, 4, 5], 3) == []  # nothing found
    assert PromptLookupProposer(ngram=1, max_ngram=3).propose([5, 1, 2, 7, 2, 8, 1, 2], 2) == [7, 2]  # longest first
    with pytest.raises(ValueError, match="ngram"):
        PromptLookupProposer(ngram=0)
    with pytest.raises(ValueError, match="max_ngram"):
        PromptLookupProposer(ngram=3, max_ngram=2)


def test_draft_proposer_propose_matches_greedy(draft):
    [ids] = draft.encode(["def add(a, b):"])
    ref = _reference(draft, [ids], 5)[0]
    assert DraftProposer(draft).propose(ids, 5) == ref


def test_bad_inputs(target, draft):
    with pytest.raises(ValueError, match="gamma"):
        SpeculativeDecoder(target, DraftProposer(draft), 0)
    small = Engine(random_llama(vocab=16), _Tok())
    with pytest.raises(ValueError, match="different vocabularies"):
        SpeculativeDecoder(target, DraftProposer(small), 2)
    with pytest.raises(ValueError, match="stop"):
        SpeculativeDecoder(target, PromptLookupProposer(), 2).generate([[1, 2]], SamplingParams(stop=("x",)))


def test_theory():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_speedup(0.5, 2, 0.0) == pytest.approx(1.75)
    assert expected_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / 0.2 / 1.4)
    assert best_gamma(1.0, 0.0, max_gamma=16) == 16
    assert best_gamma(0.0, 0.1) == 1
    g = best_gamma(0.8, 0.05)
    assert all(expected_speedup(0.8, g, 0.05) >= expected_speedup(0.8, x, 0.05) for x in range(1, 17))
    for bad in (-0.1, 1.1, math.nan):
        with pytest.raises(ValueError, match="alpha"):
            expected_tokens(bad, 2)
    with pytest.raises(ValueError, match="gamma"):
        expected_tokens(0.5, 0)
    with pytest.raises(ValueError, match="c "):
        expected_speedup(0.5, 2, -1)


# ------------------------------------------------------------------ distribution preservation


class _Tok:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return ""


def _tiny_engine(seed: int, scale: float, rows: int) -> Engine:
    hf = random_llama(vocab=8, seed=seed)
    with torch.no_grad():
        hf.lm_head.weight.mul_(scale)  # random init gives near-uniform logits: sharpen them
    return Engine(hf, _Tok(), config=SchedulerConfig(max_num_seqs=rows, max_model_len=16))


N = 3000


@pytest.mark.parametrize("proposer_kind", ["draft", "lookup"])
def test_sampling_preserves_the_target_distribution(proposer_kind):
    """Tokens 1 and 2 of N = 3000 independent rows, vs the target's exact marginals.

    Bound: TV(P̂, P) = max over subsets A of |P̂(A) − P(A)|; 2⁸/2 = 128 distinct subsets of an 8-token vocab,
    Hoeffding per subset P(|P̂(A) − P(A)| ≥ t) ≤ 2·exp(−2·N·t²) = 2·exp(−15) ≈ 6e-7 at t = 0.05, so one
    marginal fails by chance with probability < 128 · 6e-7 ≈ 8e-5, the two together < 2e-4 (and the RNG
    is seeded, so the run is deterministic anyway). A broken rule (e.g. always accepting the draft) moves
    the marginals by far more: the draft is a different random model (TV to the target ≫ 0.05, checked)."""
    torch.manual_seed(0)
    target = _tiny_engine(0, 60.0 if proposer_kind == "draft" else 15.0, N)
    prompt = [1, 2, 3, 1, 2] if proposer_kind == "draft" else [1, 2, 0, 1, 2]
    if proposer_kind == "draft":
        draft = _tiny_engine(1, 60.0, N)
        proposer = DraftProposer(draft)
    else:
        proposer = PromptLookupProposer(ngram=2)  # proposes [0, 1] for this prompt: a deterministic draft
    params = SamplingParams(temperature=1.0, ignore_eos=True)
    out = SpeculativeDecoder(target, proposer, 2).generate([prompt] * N, params, max_new_tokens=3)
    s = out.stats
    assert 0 < s.accepted < s.proposed
    first = torch.bincount(torch.tensor([r.output_ids[0] for r in out]), minlength=8).float() / N
    second = torch.bincount(torch.tensor([r.output_ids[1] for r in out]), minlength=8).float() / N
    with torch.no_grad():
        p1 = target.model.dense_logits(torch.tensor([prompt]))[0, -1].softmax(-1)  # (8,)
        cont = torch.tensor([prompt + [t] for t in range(8)])
        p2_given = target.model.dense_logits(cont)[:, -1].softmax(-1)  # (8, 8)
        p2 = p1 @ p2_given
    tv1 = 0.5 * (first - p1).abs().sum().item()
    tv2 = 0.5 * (second - p2).abs().sum().item()
    assert tv1 < 0.05, (first, p1)
    assert tv2 < 0.05, (second, p2)
    if proposer_kind == "draft":
        with torch.no_grad():
            q1 = draft.model.dense_logits(torch.tensor([prompt]))[0, -1].softmax(-1)
        assert 0.5 * (q1 - p1).abs().sum().item() > 0.15  # the draft really differs
    else:
        # token 1 is the lookup's "0" only as often as the target says, though it is always proposed
        assert abs(first[0].item() - p1[0].item()) < 0.05


class _Oracle:
    """Proposes the target's own greedy continuation, each token right with probability ``a`` (i.i.d.)."""

    def __init__(self, reference: list[int], prompt_len: int, a: float, seed: int = 0) -> None:
        self.reference, self.prompt_len, self.a = reference, prompt_len, a
        self.gen = torch.Generator().manual_seed(seed)

    def propose(self, context_ids, k):
        start = len(context_ids) - self.prompt_len
        out = []
        for j in range(k):
            tok = self.reference[start + j] if start + j < len(self.reference) else 0
            if float(torch.rand((), generator=self.gen)) >= self.a:
                tok = (tok + 1) % 4096  # a wrong guess
            out.append(tok)
        return out


@pytest.mark.parametrize("a", [0.0, 0.6, 1.0])
def test_acceptance_rate_estimates_iid_alpha(target, a):
    """With i.i.d. acceptance at rate a, accepted/examined estimates a (accepted/proposed would not),
    and tokens per forward matches E(a, γ). 240 tokens → ~100 judged drafts: ±0.15 is > 3 standard errors."""
    ids = target.encode(["def fibonacci(n):"])
    n, gamma = 240, 4
    ref = _reference(target, ids, n)[0]
    out = SpeculativeDecoder(target, _Oracle(ref, len(ids[0]), a), gamma).generate(
        ids, SamplingParams(ignore_eos=True), max_new_tokens=n
    )
    s = out.stats
    assert out[0].output_ids == ref
    assert s.accepted <= s.examined <= s.proposed
    assert sum(s.examined_at) == s.examined and s.examined_at[0] <= s.row_steps  # one first draft per step at most
    assert abs(s.acceptance_rate - a) <= 0.15
    if 0 < a < 1:
        assert s.accepted_fraction < s.acceptance_rate  # the naive ratio under-estimates α
        assert abs(s.tokens_per_forward - expected_tokens(a, gamma)) <= 0.35
        assert abs(s.effective_alpha - a) <= 0.15
