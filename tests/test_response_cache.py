"""Response caches in front of the engine: exact (LRU) and semantic (threshold), stats, false-hit curve."""

import numpy as np
import pytest
import torch

from course_lib.engine import SamplingParams
from course_lib.serving.response_cache import (
    LABELLED_PAIRS,
    CachedEngine,
    ExactCache,
    HiddenStateEmbedder,
    PromptPair,
    SemanticCache,
    cached_generate,
    compare_latency,
    normalize_prompt,
    threshold_curve,
)

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = SamplingParams(max_new_tokens=4)


def toy_embed(texts):
    """Bag of letters a-z: deterministic, instant, and similar for similar strings."""
    out = torch.zeros(len(texts), 26)
    for i, t in enumerate(texts):
        for ch in t.lower():
            if "a" <= ch <= "z":
                out[i, ord(ch) - 97] += 1
    return out


def test_exact_hits_normalisation_params_and_stats():
    c = ExactCache(capacity=4)
    assert c.get("def f():", GREEDY) is None
    c.put("def f():", GREEDY, "pass")
    assert c.get("def f():", GREEDY) == "pass"
    assert c.get("def F():", GREEDY) is None  # case kept: code is case-sensitive
    assert c.get("def f():", SamplingParams(max_new_tokens=5)) is None  # other params, other entry
    assert (c.stats.hits, c.stats.misses) == (1, 3) and c.stats.hit_rate == 0.25
    assert ExactCache(lowercase=True).key("DEF f()") == ExactCache(lowercase=True).key("def f()")
    c.reset()
    assert len(c) == 0 and c.stats.lookups == 0


def test_exact_cache_keeps_whitespace():
    """Exact means exact: Python that differs only in indentation is another program, another entry."""
    c = ExactCache()
    c.put("if x:\n    y()\nz()", GREEDY, "a")
    assert c.get("if x:\n    y()\n    z()", GREEDY) is None  # z() inside the if: another program
    assert c.get("  if x:\n    y()\nz()", GREEDY) is None
    assert c.get("if x:\n    y()\nz()", GREEDY) == "a"
    assert c.get("cafe\u0301", GREEDY) is None and ExactCache().key("caf\u00e9") == ExactCache().key("cafe\u0301")
    loose = ExactCache(collapse_whitespace=True)  # the opt-in for prose
    assert loose.key("  a   b\n") == loose.key("a b")


def test_exact_lru_eviction():
    c = ExactCache(capacity=2)
    c.put("a", None, 1)
    c.put("b", None, 2)
    assert c.get("a") == 1  # a is now the most recently used
    c.put("c", None, 3)  # evicts b
    assert "b" not in c and "a" in c and "c" in c
    assert c.stats.evictions == 1 and len(c) == 2


def test_semantic_threshold_and_lru():
    c = SemanticCache(toy_embed, threshold=0.99, capacity=2)
    c.put("sort a list", None, "sorted(xs)")
    resp, sim = c.lookup("list a sort", None)  # same letters: similarity 1
    assert resp == "sorted(xs)" and sim == pytest.approx(1.0)
    resp, sim = c.lookup("reverse a string", None)
    assert resp is None and sim < 0.99
    assert c.get("sort a list", GREEDY) is None  # other params never match
    loose = SemanticCache(toy_embed, threshold=0.5)
    loose.put("sort a list", None, "sorted(xs)")
    assert loose.get("sort the list", None) == "sorted(xs)"
    assert (c.stats.hits, c.stats.misses) == (1, 2)
    c.put("b", None, 2)
    c.put("c", None, 3)
    assert len(c) == 2 and c.stats.evictions == 1


def test_bad_input():
    with pytest.raises(ValueError, match="capacity"):
        ExactCache(capacity=0)
    with pytest.raises(ValueError, match="capacity"):
        SemanticCache(toy_embed, capacity=-1)
    with pytest.raises(ValueError, match="threshold"):
        SemanticCache(toy_embed, threshold=1.5)
    with pytest.raises(ValueError, match="threshold"):
        SemanticCache(toy_embed, threshold=-1.01)
    with pytest.raises(ValueError, match="embed"):
        SemanticCache("not callable")
    with pytest.raises(ValueError, match="prompt"):
        normalize_prompt("   ")
    with pytest.raises(ValueError, match="params"):
        ExactCache().get("x", {"temperature": 0})
    with pytest.raises(ValueError, match="pairs"):
        threshold_curve(toy_embed, [PromptPair("a", "a", True)])
    with pytest.raises(ValueError, match="prompts"):
        cached_generate(None, ExactCache(), "one string")


def test_threshold_curve_monotone():
    curve = threshold_curve(toy_embed, LABELLED_PAIRS, [0.5, 0.8, 0.9, 0.99, 1.0])
    hits = [p.hit_rate for p in curve]
    false = [p.false_hit_rate for p in curve]
    assert hits == sorted(hits, reverse=True) and false == sorted(false, reverse=True)
    assert all(0 <= x <= 1 for x in hits + false)


def test_hidden_state_embedder_matches_hf_and_cached_engine(target):
    emb = HiddenStateEmbedder(target)
    texts = ["def add(a, b): return a + b", "print('hi')"]
    v = emb(texts)
    assert v.shape == (2, target.model.embed_weight.shape[1])
    assert torch.allclose(v.norm(dim=-1), torch.ones(2), atol=1e-5)
    ids = target.tokenizer(texts[:1], return_tensors="pt")
    with torch.no_grad():
        hf = target.hf_model(**ids, output_hidden_states=True).hidden_states[-1][0].mean(0)
    assert torch.nn.functional.cosine_similarity(hf, v[0], dim=0) > 1 - 1e-5
    ce = CachedEngine(target, ExactCache())
    out = ce.generate(["def f(x):", "def f(x):"], GREEDY)
    assert [r.hit for r in out] == [False, True] and out[0].text == out[1].text
    assert ce.stats.hit_rate == 0.5
    cmp = compare_latency(target, ExactCache(), ["def g():", "def g():"], GREEDY)
    assert cmp.hits == [False, True] and cmp.cached_s[1] < cmp.uncached_s[1]
    curve = threshold_curve(emb, LABELLED_PAIRS, [0.9, 0.99])
    assert len(curve) == 2


def test_zipf_mix_repeats_follow_the_distribution():
    from course_lib.serving.response_cache import expected_hit_rate, zipf_mix

    prompts = [f"def task_{i}(x):" for i in range(40)]
    rates = []
    for seed in range(30):
        mix = zipf_mix(prompts, 60, 1.1, seed)
        rates.append(1 - len(set(mix)) / len(mix))  # an unbounded exact cache's hit rate on the mix
    assert abs(np.mean(rates) - expected_hit_rate(40, 60, 1.1)) < 0.03
    assert np.std(rates) > 0  # the draw decides, not the input
    assert expected_hit_rate(40, 60, 0.0) < expected_hit_rate(40, 60, 2.0)
    with pytest.raises(ValueError, match="exponent"):
        zipf_mix(prompts, 5, -1)
