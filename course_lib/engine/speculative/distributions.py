"""The distributions speculative decoding compares: each row's p (target) and q (draft), as sampling sees them.

Both sides apply the row's own sampling params exactly as ``engine.sampler`` does (penalties on the raw
logits, then temperature / top-k / top-p / min-p), so the rejection rule compares the distribution the
target would really sample from with the one the draft really drew from. A row's penalties depend on
its position: at draft position j the output so far includes drafts 1..j−1, hence one ``RowView`` per
position. Small per-row work next to a forward. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.engine.sampler import filter_rows, is_penalised, token_counts
from course_lib.engine.sampling import SamplingParams, apply_penalties


class RowView:
    """What the penalty code needs from a row at one position: params, prompt ids, output ids."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]) -> None:
        self.params, self.prompt_ids, self.output_ids = params, prompt_ids, output_ids


def penalised(logits: torch.Tensor, rows: list[RowView]) -> torch.Tensor:
    """(M, V) fp32 logits with each row's repetition/presence/frequency penalties applied."""
    logits = logits.float()
    bad = [i for i, r in enumerate(rows) if is_penalised(r.params)]
    if not bad:
        return logits
    logits = logits.clone()
    V, dev = logits.shape[-1], logits.device
    for i in bad:
        r = rows[i]
        logits[i] = apply_penalties(
            logits[i : i + 1], r.params, token_counts(r.prompt_ids, V, dev), token_counts(r.output_ids, V, dev)
        )[0]
    return logits


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """(M, V) penalised logits → the distribution each row samples from (temperature/top-k/top-p/min-p)."""
    return filter_rows(logits, params).softmax(dim=-1)


def draw(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from the distribution p (V,)."""
    return int(torch.multinomial(p, 1, generator=generator))
