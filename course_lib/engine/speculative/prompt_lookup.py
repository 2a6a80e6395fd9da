"""Prompt lookup decoding (Saxena 2023): drafts copied from the context itself, no model at all.

Find the latest earlier occurrence of the context's last n tokens and propose the k tokens that
followed it. The proposer costs a scan of the context in Python (c ≈ 0 next to a target forward), so
the best γ grows; it pays whenever the output copies its input: code edits, extraction, summaries
quoting the source. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from course_lib.engine.speculative.proposer import Proposer


class PromptLookupProposer(Proposer):
    """Prompt lookup decoding (Saxena 2023): no model at all. Find the latest earlier occurrence of the
    last n tokens of the context and propose the k tokens that followed it, n from ``max_ngram`` down to
    ``ngram``. Nothing found → nothing proposed (that row decodes one token). Free, and strong whenever
    the output copies its input: code edits, extraction, summaries quoting the source."""

    def __init__(self, ngram: int = 3, max_ngram: int | None = None) -> None:
        if not isinstance(ngram, int) or isinstance(ngram, bool) or ngram < 1:
            raise ValueError(f"ngram must be an int ≥ 1, got {ngram!r}")
        max_ngram = ngram if max_ngram is None else max_ngram
        if not isinstance(max_ngram, int) or isinstance(max_ngram, bool) or max_ngram < ngram:
            raise ValueError(f"max_ngram must be an int ≥ ngram={ngram}, got {max_ngram!r}")
        self.ngram, self.max_ngram = ngram, max_ngram

    def propose(self, context_ids: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        ctx = list(context_ids)
        L = len(ctx)
        for n in range(min(self.max_ngram, L - 1), self.ngram - 1, -1):
            tail = ctx[L - n :]
            for s in range(L - n - 1, -1, -1):  # latest first; s + n < L so at least one token follows
                if ctx[s : s + n] == tail:
                    return ctx[s + n : s + n + k]
        return []
