"""What a verify forward costs: one target forward over k new tokens after a cached context, for each k.

The price of verifying k − 1 drafts. At batch 1 a forward reads every weight once whatever k is, so on
a bandwidth- or overhead-bound machine it hardly grows with k until k tokens' FLOPs reach the ridge
point: the spare arithmetic that speculative decoding spends. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course_lib.decoding.speedup import best_of


@dataclass(frozen=True)
class VerifyCost:
    tokens: int  # new tokens in the forward (1 = a plain decode step; γ + 1 = a verify step)
    seconds: float  # one target forward, batch 1, after ``context`` cached tokens


@torch.inference_mode()
def verify_cost(target, context: int = 64, tokens: Sequence[int] = (1, 2, 3, 5, 9, 17), repeats: int = 5):
    """Time one forward of the target over k new tokens after ``context`` cached ones, for each k: the
    price of verifying k − 1 drafts. On a bandwidth- or overhead-bound machine it hardly grows with k."""
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        raise ValueError(f"context must be an int ≥ 1, got {context!r}")
    ks = list(tokens)
    if not ks or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in ks):
        raise ValueError(f"tokens must be a non-empty list of ints ≥ 1, got {tokens!r}")
    if context + max(ks) > target.backend.max_tokens_per_seq():
        raise ValueError(f"context + max(tokens) = {context + max(ks)} does not fit the target's KV")
    kv, model, dev = target.backend, target.model, target.device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (context + max(ks),), generator=gen).to(dev)
    h = kv.allocate()
    try:
        kv.append(h, context)
        pos = torch.arange(context, device=dev)
        model(ids[:context], pos, kv.prepare([h], [context], pos), kv, logits_indices=torch.tensor([context - 1]))
        out = []
        for k in ks:

            def step(k=k):
                kv.append(h, k)
                p = torch.arange(context, context + k, device=dev)
                model(ids[context : context + k], p, kv.prepare([h], [k], p), kv)  # logits at all k positions
                kv.truncate(h, context)

            step()  # warm-up
            out.append(VerifyCost(k, best_of(step, repeats)))
        return out
    finally:
        kv.free(h)
