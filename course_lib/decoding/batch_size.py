"""Where speculative decoding stops paying: speculative vs plain greedy at growing batch sizes.

At batch 1 a verify forward over γ + 1 tokens costs about one decode step (bandwidth-bound: the weights
are read once). At batch B it covers B·(γ + 1) tokens; once that passes the ridge point (or, on a tiny
model, the size where fixed overhead stops dominating) the forward becomes compute-bound, the spare
FLOPs that paid for the drafts are gone and rejected drafts are pure waste. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from course_lib.decoding.speedup import baseline, encode_prompts, run_method


@dataclass(frozen=True)
class BatchRow:
    batch: int
    plain_seconds: float
    spec_seconds: float
    tokens_per_forward: float
    verify_over_plain: float
    gamma: int = 1
    c: float = float("nan")  # draft seconds per token ÷ one verify forward, at this batch

    @property
    def speedup(self) -> float:
        return self.plain_seconds / self.spec_seconds

    @property
    def predicted(self) -> float:
        """The refined formula at this batch: tokens per row per forward ÷ ((B·γ·c + 1) × verify/plain), with the
        counts and the verify cost of this batch. c is the proposer's time per draft *token* over one verify
        forward, and a step drafts B·γ tokens (the draft runs batched too), so one step costs B·γ·c + 1
        verify forwards; the verify forward covers B·(γ + 1) tokens."""
        return self.tokens_per_forward / ((self.batch * self.gamma * self.c + 1.0) * self.verify_over_plain)


def breakeven(rows) -> int | None:
    """The smallest batch at which speculation no longer beats plain decoding; None if it wins at every batch."""
    return next((r.batch for r in sorted(rows, key=lambda r: r.batch) if r.speedup < 1.0), None)


def batch_sweep(
    target, make_proposer: Callable[[], object], gamma: int, prompts, batches: Sequence[int], new_tokens=32, repeats=2
) -> list[BatchRow]:
    """Speculative vs plain greedy at each batch size (prompts cycled to fill the batch). As the batch
    grows, a verify forward over B·(γ+1) tokens stops costing the same as one over B tokens: the spare
    FLOPs that paid for the drafts are gone."""
    if not batches or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in batches):
        raise ValueError(f"batches must be a non-empty list of ints ≥ 1, got {batches!r}")
    pool = encode_prompts(target, prompts)
    out = []
    for b in batches:
        base = baseline(target, [pool[i % len(pool)] for i in range(b)], new_tokens, repeats)
        row = run_method(target, make_proposer(), gamma, base, repeats=repeats)
        out.append(
            BatchRow(b, row.plain_seconds, row.seconds, row.tokens_per_forward, row.verify_over_plain, gamma, row.c)
        )
    return out
