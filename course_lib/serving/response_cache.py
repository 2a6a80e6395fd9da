"""A response cache in front of the model: the cheapest token is the one never generated.

Huyen (*AI Engineering*, ch. 10) puts two caches before the model. An **exact cache** returns a stored
response when the same (normalised) prompt arrives again with the same sampling parameters: a dict
lookup, no false hits. A **semantic cache** embeds the prompt and returns the response of the most
similar stored prompt if their cosine similarity reaches a threshold: it also catches paraphrases, but
a prompt that *looks* like a stored one and means something else ("sort ascending" vs "sort
descending") gets the wrong answer — a false hit, and the threshold trades hit rate against it
(``threshold_curve``). A hit costs a hash lookup (exact) or one embedding forward plus a similarity
search (semantic); a miss costs that plus the whole generation.

Embeddings: the hub is out of reach here, so ``HiddenStateEmbedder`` mean-pools the last hidden state of
the embedded ``tiny-target`` (a 6-layer code model, never trained to embed sentences). A real system uses
a sentence-embedding model trained so that paraphrases land close and different meanings far apart;
expect this one to separate poorly, which is exactly what the false-hit curve shows.
Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass

import torch

from course_lib.engine.sampling import SamplingParams


# ----------------------------------------------------------------------------- keys
def normalize_prompt(prompt: str, lowercase: bool = False, collapse_whitespace: bool = False) -> str:
    """Unicode NFC only, by default: an exact cache means exact, and in front of a code model whitespace is
    meaning (Python that differs only in indentation is another program). ``collapse_whitespace`` (strip
    and make runs of whitespace one space) and ``lowercase`` are opt-in, for prose prompts; case is kept by
    default: in code, ``List`` and ``list`` differ."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
    text = unicodedata.normalize("NFC", prompt)
    if collapse_whitespace:
        text = re.sub(r"\s+", " ", text).strip()
    return text.lower() if lowercase else text


def params_key(params: SamplingParams | None) -> tuple:
    """Every sampling field, hashable: the same prompt at another temperature is another entry."""
    if params is None:
        params = SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams or None, got {type(params).__name__}")
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(dataclasses.asdict(params).items()))


def _check_capacity(capacity) -> int:
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
        raise ValueError(f"capacity must be a positive int (entries kept before LRU eviction), got {capacity!r}")
    return capacity


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        """Hits / lookups (NaN before the first lookup)."""
        return self.hits / self.lookups if self.lookups else math.nan


# ----------------------------------------------------------------------------- exact
class ExactCache:
    """(prompt in NFC, byte for byte otherwise; sampling params) → response, least recently used evicted beyond ``capacity``.

    A sampled response (temperature > 0, no seed) is cached like any other: every repeat then gets the
    same text, which is the point of a cache and a change of behaviour worth knowing about."""

    def __init__(self, capacity: int = 1024, lowercase: bool = False, collapse_whitespace: bool = False) -> None:
        self.capacity = _check_capacity(capacity)
        self.lowercase = bool(lowercase)
        self.collapse_whitespace = bool(collapse_whitespace)
        self._store: OrderedDict[tuple, object] = OrderedDict()
        self.stats = CacheStats()

    def key(self, prompt: str, params: SamplingParams | None = None) -> tuple:
        return (normalize_prompt(prompt, self.lowercase, self.collapse_whitespace), params_key(params))

    def get(self, prompt: str, params: SamplingParams | None = None):
        """The stored response, or None (counted as a miss)."""
        k = self.key(prompt, params)
        if k in self._store:
            self._store.move_to_end(k)  # most recently used
            self.stats.hits += 1
            return self._store[k]
        self.stats.misses += 1
        return None

    def put(self, prompt: str, params: SamplingParams | None, response) -> None:
        k = self.key(prompt, params)
        self._store[k] = response
        self._store.move_to_end(k)
        while len(self._store) > self.capacity:
            self._store.popitem(last=False)
            self.stats.evictions += 1

    def __contains__(self, prompt: str) -> bool:  # with default params; does not count as a lookup
        return self.key(prompt) in self._store

    def __len__(self) -> int:
        return len(self._store)

    def reset(self) -> None:
        """Empty the cache and zero the counters."""
        self._store.clear()
        self.stats = CacheStats()


# ----------------------------------------------------------------------------- embeddings
class HiddenStateEmbedder:
    """``embed(texts) → (n, D)`` unit vectors: the mean over tokens of ``engine.model``'s last hidden state
    (after the final norm, as HF's ``output_hidden_states[-1]``), one ragged forward with no KV cache.
    A stand-in for a sentence-embedding model, which a real semantic cache would use."""

    def __init__(self, engine) -> None:
        self.engine = engine

    @torch.inference_mode()
    def __call__(self, texts: SequenceABC[str]) -> torch.Tensor:
        from course_lib.engine.attention import NoCacheBackend
        from course_lib.engine.model import rms_norm

        if isinstance(texts, str) or not texts:
            raise ValueError("texts must be a non-empty list of strings")
        ids = self.engine.encode(list(texts))
        m, dev = self.engine.model, self.engine.device
        lens = [len(x) for x in ids]
        backend = NoCacheBackend(max(lens))
        positions = torch.cat([torch.arange(n, device=dev) for n in lens])  # (N,)
        meta = backend.prepare([backend.allocate() for _ in ids], lens, positions)
        flat = torch.tensor([t for x in ids for t in x], device=dev)  # (N,)
        h = rms_norm(m.run_layers(m.embed(flat), positions, meta, backend), m.final_norm, m.eps)  # (N, D)
        pooled = torch.stack([chunk.float().mean(0) for chunk in h.split(lens)])  # (n, D)
        return torch.nn.functional.normalize(pooled, dim=-1)


# ----------------------------------------------------------------------------- semantic
class SemanticCache:
    """Returns the response of the most similar stored prompt (same sampling params) when the cosine
    similarity of their embeddings is ≥ ``threshold``; LRU beyond ``capacity``.

    ``embed`` maps a list of strings to (n, D) vectors (normalised here). ``lookup`` also returns the
    similarity, so a caller can log near misses."""

    def __init__(
        self, embed: Callable[[list[str]], torch.Tensor], threshold: float = 0.95, capacity: int = 1024
    ) -> None:
        if not callable(embed):
            raise ValueError(f"embed must be a callable list[str] -> (n, D) tensor, got {type(embed).__name__}")
        ok = isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and -1 <= threshold <= 1
        if not ok:
            raise ValueError(f"threshold must be a cosine similarity in [-1, 1], got {threshold!r}")
        self.embed, self.threshold = embed, float(threshold)
        self.capacity = _check_capacity(capacity)
        self._store: OrderedDict[int, tuple[str, tuple, torch.Tensor, object]] = OrderedDict()
        self._ids = 0
        self.stats = CacheStats()

    def _vector(self, prompt: str) -> torch.Tensor:
        v = torch.as_tensor(self.embed([normalize_prompt(prompt)]))
        if v.dim() != 2 or v.shape[0] != 1:
            raise ValueError(f"embed must return an (n, D) tensor for n texts, got shape {tuple(v.shape)}")
        return torch.nn.functional.normalize(v[0].float(), dim=-1)  # (D,)

    def lookup(self, prompt: str, params: SamplingParams | None = None) -> tuple[object | None, float]:
        """(response or None, best similarity among entries with these params; -inf when there are none)."""
        pk = params_key(params)
        q = self._vector(prompt)
        keys = [k for k, e in self._store.items() if e[1] == pk]
        best, sim = None, -math.inf
        if keys:
            sims = torch.stack([self._store[k][2] for k in keys]) @ q  # (entries,)
            i = int(sims.argmax())
            best, sim = keys[i], float(sims[i])
        if best is not None and sim >= self.threshold:
            self._store.move_to_end(best)
            self.stats.hits += 1
            return self._store[best][3], sim
        self.stats.misses += 1
        return None, sim

    def get(self, prompt: str, params: SamplingParams | None = None):
        return self.lookup(prompt, params)[0]

    def put(self, prompt: str, params: SamplingParams | None, response) -> None:
        self._store[self._ids] = (normalize_prompt(prompt), params_key(params), self._vector(prompt), response)
        self._ids += 1
        while len(self._store) > self.capacity:
            self._store.popitem(last=False)
            self.stats.evictions += 1

    def __len__(self) -> int:
        return len(self._store)

    def reset(self) -> None:
        self._store.clear()
        self.stats = CacheStats()


# ----------------------------------------------------------------------------- in front of the engine
@dataclass(frozen=True)
class CachedResult:
    prompt: str
    text: str
    hit: bool
    latency_s: float  # lookup (+ generation and insert on a miss)


def cached_generate(
    engine, cache: ExactCache | SemanticCache | None, prompts: SequenceABC[str], params: SamplingParams | None = None
) -> list[CachedResult]:
    """Answer ``prompts`` one by one (as separate users would send them), each from ``cache`` if it hits,
    else from ``engine.generate`` and then stored. ``cache=None``: always generate (the baseline)."""
    if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty strings")
    if cache is not None and not isinstance(cache, (ExactCache, SemanticCache)):
        raise ValueError(f"cache must be an ExactCache, a SemanticCache or None, got {type(cache).__name__}")
    params = params or SamplingParams()
    out = []
    for p in prompts:
        t0 = time.perf_counter()
        text = cache.get(p, params) if cache is not None else None
        hit = text is not None
        if not hit:
            text = engine.generate([p], params)[0].text
            if cache is not None:
                cache.put(p, params, text)
        out.append(CachedResult(p, text, hit, time.perf_counter() - t0))
    return out


class CachedEngine:
    """An engine behind a cache: ``generate(prompts, params)`` → ``CachedResult``s, ``stats`` of the cache."""

    def __init__(self, engine, cache: ExactCache | SemanticCache) -> None:
        if not isinstance(cache, (ExactCache, SemanticCache)):
            raise ValueError(f"cache must be an ExactCache or a SemanticCache, got {type(cache).__name__}")
        self.engine, self.cache = engine, cache

    def generate(self, prompts: SequenceABC[str], params: SamplingParams | None = None) -> list[CachedResult]:
        return cached_generate(self.engine, self.cache, prompts, params)

    @property
    def stats(self) -> CacheStats:
        return self.cache.stats


@dataclass(frozen=True)
class LatencyComparison:
    uncached_s: list[float]
    cached_s: list[float]
    hits: list[bool]

    @property
    def hit_rate(self) -> float:
        return sum(self.hits) / len(self.hits)

    @property
    def speedup(self) -> float:
        """Total time without the cache / with it."""
        return sum(self.uncached_s) / max(sum(self.cached_s), 1e-12)


def compare_latency(
    engine, cache: ExactCache | SemanticCache, prompts: SequenceABC[str], params: SamplingParams | None = None
) -> LatencyComparison:
    """The same prompt stream served without and then with ``cache`` (reset first): per-prompt latency."""
    cache.reset()
    base = cached_generate(engine, None, prompts, params)
    cached = cached_generate(engine, cache, prompts, params)
    return LatencyComparison([r.latency_s for r in base], [r.latency_s for r in cached], [r.hit for r in cached])


# ----------------------------------------------------------------------------- false hits
@dataclass(frozen=True)
class PromptPair:
    """A stored prompt and a later query; ``same`` = the stored answer is right for the query."""

    stored: str
    query: str
    same: bool


#: Paraphrases that should hit, and look-alikes with another meaning that must not (code prompts).
LABELLED_PAIRS: tuple[PromptPair, ...] = (
    PromptPair("Write a Python function that sorts a list in ascending order.", "Write a Python function to sort a list from smallest to largest.", True),
    PromptPair("Write a Python function that reverses a string.", "Write a Python function that returns a string reversed.", True),
    PromptPair("def is_prime(n): check whether n is a prime number", "def is_prime(n): return True if n is prime", True),
    PromptPair("How do I read a text file line by line in Python?", "How can I read a file one line at a time in Python?", True),
    PromptPair("Write a function that returns the maximum of a list.", "Write a function that finds the largest element of a list.", True),
    PromptPair("Count the words in a string in Python.", "Python: count how many words a string has.", True),
    PromptPair("Write a Python function that sorts a list in ascending order.", "Write a Python function that sorts a list in descending order.", False),
    PromptPair("Write a function that returns the maximum of a list.", "Write a function that returns the minimum of a list.", False),
    PromptPair("How do I read a text file line by line in Python?", "How do I write a text file line by line in Python?", False),
    PromptPair("Remove duplicates from a list in Python, keeping order.", "Find the duplicates in a list in Python.", False),
    PromptPair("Convert a string to uppercase in Python.", "Convert a string to lowercase in Python.", False),
    PromptPair("def add(a, b): return the sum of a and b", "def sub(a, b): return the difference of a and b", False),
)  # fmt: skip


@dataclass(frozen=True)
class ThresholdPoint:
    threshold: float
    hit_rate: float  # of pairs that should hit, the fraction that does
    false_hit_rate: float  # of pairs that must not hit, the fraction that does (a wrong answer served)


def pair_similarities(embed: Callable[[list[str]], torch.Tensor], pairs: SequenceABC[PromptPair]) -> list[float]:
    """Cosine similarity of each pair's two prompts under ``embed``."""
    if not pairs or not all(isinstance(p, PromptPair) for p in pairs):
        raise ValueError("pairs must be a non-empty sequence of PromptPair")
    a = torch.nn.functional.normalize(
        torch.as_tensor(embed([normalize_prompt(p.stored) for p in pairs])).float(), dim=-1
    )
    b = torch.nn.functional.normalize(
        torch.as_tensor(embed([normalize_prompt(p.query) for p in pairs])).float(), dim=-1
    )
    return (a * b).sum(-1).tolist()


def threshold_curve(
    embed: Callable[[list[str]], torch.Tensor],
    pairs: SequenceABC[PromptPair] = LABELLED_PAIRS,
    thresholds: SequenceABC[float] | None = None,
) -> list[ThresholdPoint]:
    """Hit rate and false-hit rate of a semantic cache at each threshold (a query hits when its similarity
    to the stored prompt is ≥ the threshold). Needs pairs of both kinds; default thresholds 0.5 … 1.0."""
    pairs = list(pairs)
    if not any(p.same for p in pairs) or all(p.same for p in pairs):
        raise ValueError("pairs must include both pairs that should hit (same=True) and ones that must not")
    thresholds = [0.5 + 0.025 * i for i in range(21)] if thresholds is None else list(thresholds)
    if not thresholds or any(not isinstance(t, (int, float)) or not -1 <= t <= 1 for t in thresholds):
        raise ValueError("thresholds must be a non-empty list of cosine similarities in [-1, 1]")
    sims = pair_similarities(embed, pairs)
    pos = [s for s, p in zip(sims, pairs) if p.same]
    neg = [s for s, p in zip(sims, pairs) if not p.same]
    return [
        ThresholdPoint(float(t), sum(s >= t for s in pos) / len(pos), sum(s >= t for s in neg) / len(neg))
        for t in thresholds
    ]


__all__ = [
    "LABELLED_PAIRS",
    "CacheStats",
    "CachedEngine",
    "CachedResult",
    "ExactCache",
    "HiddenStateEmbedder",
    "LatencyComparison",
    "PromptPair",
    "SemanticCache",
    "ThresholdPoint",
    "cached_generate",
    "compare_latency",
    "normalize_prompt",
    "pair_similarities",
    "params_key",
    "threshold_curve",
]


# ----------------------------------------------------------------------------- a request mix with repeats
def zipf_mix(prompts: SequenceABC[str], n: int, exponent: float = 1.1, seed: int = 0) -> list[str]:
    """``n`` requests drawn with replacement from ``prompts``, the k-th most popular with probability ∝
    1 / k^exponent (Zipf's law, the shape of real query logs): how many repeat is the draw's, not the input's."""
    import numpy as np

    if not prompts or any(not isinstance(p, str) or not p.strip() for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty strings")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int ≥ 1, got {n!r}")
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)) or not exponent >= 0:
        raise ValueError(f"exponent must be a number ≥ 0 (0: uniform), got {exponent!r}")
    weights = 1.0 / np.arange(1, len(prompts) + 1) ** float(exponent)
    idx = np.random.default_rng(seed).choice(len(prompts), size=n, p=weights / weights.sum())
    return [prompts[i] for i in idx]


def expected_hit_rate(num_prompts: int, n: int, exponent: float = 1.1) -> float:
    """The hit rate an unbounded exact cache expects on ``zipf_mix``: 1 − E[distinct prompts] / n, with
    E[distinct] = Σ_k 1 − (1 − p_k)^n."""
    import numpy as np

    weights = 1.0 / np.arange(1, num_prompts + 1) ** float(exponent)
    p = weights / weights.sum()
    return float(1 - np.sum(1 - (1 - p) ** n) / n)
