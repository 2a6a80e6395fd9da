"""The seam between the speculative decoder and whatever guesses: ``Proposer``, ``Proposal``, ``Verified``.

A proposer guesses up to k next tokens of each row's context (``propose_batch``) and may learn from
what the target's verify forward saw (``observe``). The draft model, prompt lookup, Medusa heads and
Jacobi / lookahead decoding are all proposers behind this one interface, so ``SpeculativeDecoder``
never changes when a chapter adds a new way of guessing. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.engine.sampling import SamplingParams


@dataclass
class Proposal:
    tokens: list[int]  # up to k proposed tokens
    q: torch.Tensor | None = None  # (len(tokens), V) the distribution each was drawn from; None = deterministic


@dataclass
class Verified:
    """What one row's verify forward saw, handed to ``proposer.observe(key, verified)`` after acceptance.

    Row positions j = 0..k: j = 0 is the row's pending token, j ≥ 1 its j-th draft. ``argmax[j]`` is the
    target's top-1 next token after position j (so ``argmax[accepted]`` is the correction or bonus in
    greedy mode, and the later entries are guesses conditioned on rejected drafts: Jacobi iterates on
    them). ``hidden[j]`` (D,) is the last layer's hidden state there, before the final norm, when the
    proposer sets ``wants_hidden = True`` (Medusa heads read ``hidden[accepted]``)."""

    drafts: list[int]
    accepted: int
    argmax: list[int]
    hidden: torch.Tensor | None = None


class Proposer:
    """Guesses the next tokens of a context. ``propose(context_ids, k)`` is the whole contract; the decoder
    calls ``propose_batch`` (one call for every row of a step), whose default loops over ``propose`` and
    treats the guesses as deterministic (q one-hot). ``release(key)`` drops any per-row state. Optional:
    ``wants_hidden = True`` and ``observe(key, Verified)`` to learn from each verify forward, and
    ``rollback(key, ids)`` for a proposer with its own KV cache (``DraftProposer``) to drop what the target
    rejected when a row finishes."""

    wants_hidden = False

    def propose(self, context_ids: list[int], k: int) -> list[int]:
        raise NotImplementedError

    def propose_batch(
        self,
        keys: list,
        contexts: list[list[int]],
        ks: list[int],
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> list[Proposal]:
        return [Proposal(list(self.propose(c, k))[:k] if k > 0 else []) for c, k in zip(contexts, ks)]

    def release(self, key) -> None:
        pass
