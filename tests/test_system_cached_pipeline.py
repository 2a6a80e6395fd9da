"""Chapter 08, pipeline: Zipf probabilities are a distribution (uniform at s = 0), a stream is seeded, the
predicted exact-cache hit rate agrees with simulated streams, and the pipeline serves repeats from its
response cache at no cost, reuses the system prompt's KV blocks only with the prefix cache on, and bills
prefilled tokens (on tiny-target with a plain chat template: fast, no chat model needed)."""

import numpy as np
import pytest

from course_lib.engine import Engine, SchedulerConfig
from course_lib.measure.claims import claim
from course_lib.serving.response_cache import ExactCache
from course_lib.system import cached_pipeline as P
from course_lib.system.gateway import Prices


def test_zipf_and_stream():
    p = P.zipf_probabilities(10, 1.0)
    assert p.sum() == pytest.approx(1.0) and np.all(np.diff(p) < 0)
    assert np.allclose(P.zipf_probabilities(4, 0), 0.25)
    pool = list(range(20))
    assert P.draw_stream(pool, 50, 1.0, seed=3) == P.draw_stream(pool, 50, 1.0, seed=3)
    with pytest.raises(ValueError, match="s must"):
        P.zipf_probabilities(3, -1)
    with pytest.raises(ValueError, match="pool"):
        P.draw_stream([], 3)


def test_expected_hit_rate_matches_simulation():
    pool, n, s = list(range(30)), 25, 1.1
    sims = [1 - len(set(P.draw_stream(pool, n, s, seed=i))) / n for i in range(400)]
    assert np.mean(sims) == pytest.approx(P.expected_hit_rate(len(pool), n, s), abs=0.01)
    assert P.expected_hit_rate(1, 10, 1.0) == pytest.approx(0.9)  # one item: all but the first hit
    lo, hi = P.hit_rate_interval(len(pool), n, s)
    assert lo <= P.expected_hit_rate(len(pool), n, s) <= hi and lo < hi
    with pytest.raises(ValueError, match="q must"):
        P.hit_rate_interval(10, 5, 1.0, q=(0.9, 0.1))


@pytest.fixture(scope="module")
def engine():
    e = Engine("tiny-target", config=SchedulerConfig(max_model_len=512, max_num_seqs=2), kv_cache="paged",
               prefix_caching=True)  # fmt: skip
    e.tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    return e


def test_pipeline_caches_on_and_off(engine):
    prices = {"chat": Prices(1.0, 2.0)}
    texts = ["what is x?", "what is y?", "what is x?", "what is x?"]
    kw = dict(router=lambda t: "chat", retriever=None, max_new_tokens=2)
    off = P.Pipeline({"chat": engine}, prices, response_cache=None, prefix_cache=False, **kw).run(texts)
    on = P.Pipeline({"chat": engine}, prices, response_cache=ExactCache(), prefix_cache=True, **kw).run(texts)
    s_off, s_on = P.summarize(off), P.summarize(on)
    assert s_off["hit_rate"] == 0 and s_off["cached_tokens"] == 0  # the unique tag defeats the prefix cache
    assert [x.hit for x in on] == [False, False, True, True] and s_on["hit_rate"] == 0.5
    assert all(x.usd == 0 and x.ttft_s > 0 for x in on[2:])
    assert on[1].cached_prompt_tokens >= 16  # the system prompt's full blocks, computed by the first request
    miss = on[1]
    assert miss.usd == pytest.approx(((miss.prompt_tokens - miss.cached_prompt_tokens) * 1.0 + 2 * 2.0) / 1e6)
    assert s_on["usd"] < s_off["usd"]
    assert not claim("caches cut the cost at least tenfold", s_on["usd"] / s_off["usd"], at_most=0.1)
    again = P.summarize(P.Pipeline({"chat": engine}, prices, response_cache=None, prefix_cache=False, **kw).run(texts))
    assert again["usd"] == pytest.approx(
        s_off["usd"], rel=0.05
    )  # off twice: the same bill (±a tag token), so the verdicts below fail
    assert not claim("the stream costs at most (1 - h) uncached", again["usd"] / s_off["usd"], at_most=1 - 0.5)
    with pytest.raises(ValueError, match="router returned"):
        P.Pipeline({"chat": engine}, prices, router=lambda t: "gpu", retriever=None).handle("x")
    with pytest.raises(ValueError, match="same routes"):
        P.Pipeline({"chat": engine}, {}, router=lambda t: "chat", retriever=None)
