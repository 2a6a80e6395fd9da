"""The whole request path with its caches on and off: router → response cache → retrieval → model, on a request
stream whose repeats follow a popularity distribution.

Two caches stand between a request and the model's work (chapter 06). A **response cache** (``ExactCache``
or ``SemanticCache`` of ``serving/response_cache.py``) answers a repeated request without running the model;
the **prefix cache** (paged KV with ``prefix_caching=True``) skips prefilling the full blocks of a prompt
prefix another request computed, here the fixed system prompt. ``Pipeline.handle`` routes a request (a
router from ``system/router.py``), looks it up in the response cache, and on a miss retrieves context for a
chat request (BM25, ``system/retrieval.py``) and generates; ``prefix_cache=False`` puts a unique tag before
the system prompt so that no block matches (the same engine, the cache defeated). Each request's time to
first token counts from entering the pipeline (a hit returns the whole answer at once), and its cost is the
prompt tokens actually prefilled plus the output tokens, at the route's ``Prices``. Real traffic repeats
some requests much more than others: ``draw_stream`` draws a stream from a Zipf popularity law, and
``expected_hit_rate`` predicts an unbounded exact cache's hit rate on it. Introduced in
08_system_1_context_guardrails_gateway.ipynb.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass

import numpy as np

from course_lib.engine import SamplingParams
from course_lib.system.gateway import Prices
from course_lib.system.rag import build_prompt


def zipf_probabilities(n_items: int, s: float) -> np.ndarray:
    """P(rank i) ∝ 1 / i^s, i = 1 … n_items: ``s = 0`` uniform, larger ``s`` a few items dominate."""
    if isinstance(n_items, bool) or not isinstance(n_items, int) or n_items < 1:
        raise ValueError(f"n_items must be an int >= 1, got {n_items!r}")
    if isinstance(s, bool) or not isinstance(s, (int, float)) or s < 0:
        raise ValueError(f"s must be a number >= 0, got {s!r}")
    w = 1.0 / np.arange(1, n_items + 1) ** s
    return w / w.sum()


def draw_stream(pool: list, n: int, s: float = 1.0, seed: int = 0) -> list:
    """``n`` requests drawn with replacement from ``pool``; popularity ranks are a random permutation of the
    pool, probabilities ``zipf_probabilities(len(pool), s)``."""
    if not pool:
        raise ValueError("pool must be a non-empty list of requests")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pool))
    idx = rng.choice(len(pool), size=n, p=zipf_probabilities(len(pool), s))
    return [pool[order[i]] for i in idx]


def expected_hit_rate(n_items: int, n: int, s: float) -> float:
    """An unbounded exact cache, cold at the start, on ``n`` draws: 1 − E[distinct requests] / n, with
    E[distinct] = Σ_i 1 − (1 − p_i)^n (each item missed once, on its first arrival)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    p = zipf_probabilities(n_items, s)
    return float(1 - np.sum(1 - (1 - p) ** n) / n)


def hit_rate_interval(n_items: int, n: int, s: float, q=(0.1, 0.9), draws: int = 2000, seed: int = 0):
    """The ``q`` quantiles of an unbounded exact cache's hit rate over ``draws`` simulated streams: how far one
    stream of ``n`` requests may fall from ``expected_hit_rate``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if not (len(q) == 2 and 0 <= q[0] <= q[1] <= 1):
        raise ValueError(f"q must be two quantiles 0 <= lo <= hi <= 1, got {q!r}")
    p = zipf_probabilities(n_items, s)
    idx = np.random.default_rng(seed).choice(n_items, size=(draws, n), p=p)
    distinct = np.array([len(np.unique(row)) for row in idx])
    lo, hi = np.quantile(1 - distinct / n, q)
    return float(lo), float(hi)


@dataclass(frozen=True)
class Served:
    text: str
    route: str
    hit: bool  # answered by the response cache
    ttft_s: float  # from entering the pipeline to the first token (a hit: to the whole answer)
    prompt_tokens: int
    cached_prompt_tokens: int  # found in the prefix cache: not prefilled
    completion_tokens: int
    usd: float  # prefilled prompt tokens and output tokens at the route's prices (0 for a hit)


class Pipeline:
    """router → response cache → (chat: retrieval) → model. ``engines`` and ``prices``: route → engine /
    ``Prices``; the chat route's engine must have a chat template. Call ``reset()`` between runs."""

    def __init__(self, engines: dict, prices: dict, router, retriever, *, k: int = 1, response_cache=None,
                 prefix_cache: bool = True, max_new_tokens: int = 8) -> None:  # fmt: skip
        if set(engines) != set(prices) or not engines:
            raise ValueError(
                f"engines and prices must name the same routes, got {sorted(engines)} and {sorted(prices)}"
            )
        if not all(isinstance(p, Prices) for p in prices.values()):
            raise ValueError("prices must map each route to a Prices")
        if not callable(router):
            raise ValueError(f"router must be a callable text -> route, got {type(router).__name__}")
        if response_cache is not None and not (hasattr(response_cache, "get") and hasattr(response_cache, "put")):
            raise ValueError("response_cache must be None or a cache with get/put (ExactCache, SemanticCache)")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        self.engines, self.prices, self.router, self.retriever = engines, prices, router, retriever
        self.k, self.cache, self.prefix_cache, self.max_new_tokens = (
            k,
            response_cache,
            bool(prefix_cache),
            max_new_tokens,
        )

    def reset(self) -> None:
        if self.cache is not None:
            self.cache.reset()

    def _prompt(self, route: str, text: str) -> str:
        engine = self.engines[route]
        if not getattr(engine.tokenizer, "chat_template", None):
            return text  # a code model continues the text itself
        docs = [h.doc for h in self.retriever.retrieve(text, self.k)] if self.retriever is not None else []
        # a tag unique to this request, in this run and any other: no prefix block matches
        nonce = "" if self.prefix_cache else f"[request {uuid.uuid4().hex[:12]}] "
        return build_prompt(engine.tokenizer, text, docs, nonce=nonce)

    def handle(self, text: str) -> Served:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"text must be a non-empty str, got {text!r}")
        t0 = time.perf_counter()
        route = self.router(text)
        if route not in self.engines:
            raise ValueError(f"router returned {route!r}, not one of {sorted(self.engines)}")
        key = f"{route}\x00{text}"
        params = SamplingParams(max_new_tokens=self.max_new_tokens)
        if self.cache is not None:
            got = self.cache.get(key, params)
            if got is not None:
                return Served(got, route, True, time.perf_counter() - t0, 0, 0, 0, 0.0)
        engine = self.engines[route]
        backend = engine.backend
        hits0 = getattr(backend, "prefix_hits", 0)
        [r] = engine.generate([self._prompt(route, text)], params)
        cached = getattr(backend, "prefix_hits", 0) - hits0
        if self.cache is not None:
            self.cache.put(key, params, r.text)
        n_prompt, n_out = len(r.prompt_ids), len(r.output_ids)
        usd = self.prices[route].usd(n_prompt - cached, n_out)
        return Served(r.text, route, False, r.trace.token_times[0] - t0, n_prompt, cached, n_out, usd)

    def run(self, texts) -> list[Served]:
        """Serve ``texts`` one after another, from a cold pipeline (``reset`` first)."""
        if isinstance(texts, str) or not texts:
            raise ValueError("texts must be a non-empty list of strings")
        self.reset()
        return [self.handle(t) for t in texts]


def summarize(served: list[Served]) -> dict:
    """Hit rate, TTFT (mean, p50, p99, s), total and per-request dollars, prefilled and cached prompt tokens."""
    if not served:
        raise ValueError("served must be a non-empty list of Served")
    t = sorted(s.ttft_s for s in served)
    return {
        "requests": len(served),
        "hit_rate": sum(s.hit for s in served) / len(served),
        "ttft_mean_s": statistics.fmean(t),
        "ttft_p50_s": float(np.percentile(t, 50)),
        "ttft_p99_s": float(np.percentile(t, 99)),
        "usd": sum(s.usd for s in served),
        "prefilled_tokens": sum(s.prompt_tokens - s.cached_prompt_tokens for s in served),
        "cached_tokens": sum(s.cached_prompt_tokens for s in served),
        "output_tokens": sum(s.completion_tokens for s in served),
    }


__all__ = [
    "Pipeline",
    "Served",
    "draw_stream",
    "expected_hit_rate",
    "hit_rate_interval",
    "summarize",
    "zipf_probabilities",
]
