"""Chapter 02's workloads: prompts sliced from held-out text, and a seeded, long-tailed mix of requests.

What to send the engine — prompts of exact lengths (``prompt_pool``, ``prompt_of_length``) and a
workload whose output lengths have a long right tail, as in real chat traffic (``make_workload``).
``course_lib.serving.client`` sends them and times every token. Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from course_lib.measure.costs import check_positive_int


# ----------------------------------------------------------------------------- prompts and requests
def prompt_pool(tokenizer, n_tokens: int = 2048, text: str | None = None, chunk_chars: int = 2000) -> list[int]:
    """``n_tokens`` token ids of held-out Python source (the corpus' validation split, which the
    embedded models never trained on), or of ``text``. Tokenized in chunks to stay under the
    tokenizer's length warning; prompts are then slices of this pool, so every length is exact."""
    check_positive_int("n_tokens", n_tokens)
    if text is None:
        from course_lib.models.corpus import corpus_text

        text = corpus_text("val")
    ids: list[int] = []
    for start in range(0, len(text), chunk_chars):
        ids += tokenizer(text[start : start + chunk_chars])["input_ids"]
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
    raise ValueError(f"the text yields only {len(ids)} tokens, fewer than n_tokens={n_tokens}")


@dataclass(frozen=True)
class Request:
    """One user request: a prompt (token ids) and how many tokens to generate (EOS is ignored)."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise ValueError("Request.prompt_ids must hold at least one token id")
        check_positive_int("Request.max_new_tokens", self.max_new_tokens)


def prompt_of_length(pool: Sequence[int], n: int, offset: int = 0) -> list[int]:
    """``n`` consecutive ids of ``pool`` starting at ``offset`` (wrapping around)."""
    check_positive_int("n", n)
    if n > len(pool):
        raise ValueError(f"a {n}-token prompt needs a pool of at least {n} tokens, got {len(pool)}")
    start = offset % len(pool)
    return [int(t) for t in (list(pool[start : start + n]) + list(pool[: max(0, start + n - len(pool))]))]


def make_workload(
    pool: Sequence[int],
    n_requests: int,
    *,
    prompt_lens: tuple[int, int] = (16, 256),
    output_median: int = 24,
    output_sigma: float = 0.8,
    output_max: int = 256,
    seed: int = 0,
) -> list[Request]:
    """A seeded mix of requests: prompt lengths uniform in ``prompt_lens``, output lengths log-normal
    around ``output_median`` (clipped to [2, ``output_max``]) — most answers short, a few very long,
    as in real chat traffic. The long tail is what makes the mean latency misleading."""
    check_positive_int("n_requests", n_requests)
    lo, hi = prompt_lens
    check_positive_int("prompt_lens[0]", lo)
    if not isinstance(hi, int) or hi < lo:
        raise ValueError(f"prompt_lens must be (low, high) ints with 1 <= low <= high, got {prompt_lens!r}")
    check_positive_int("output_median", output_median)
    if not (isinstance(output_sigma, (int, float)) and output_sigma >= 0):
        raise ValueError(f"output_sigma must be a number >= 0, got {output_sigma!r}")
    rng = np.random.default_rng(seed)
    lens = rng.integers(lo, hi + 1, size=n_requests)
    outs = np.clip(np.rint(output_median * rng.lognormal(0.0, output_sigma, size=n_requests)), 2, output_max)
    offsets = rng.integers(0, len(pool), size=n_requests)
    return [Request(tuple(prompt_of_length(pool, int(n), int(o))), int(m)) for n, m, o in zip(lens, outs, offsets)]


__all__ = ["Request", "make_workload", "prompt_of_length", "prompt_pool"]
