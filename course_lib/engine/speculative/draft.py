"""The draft-model proposer: a small model run autoregressively, with its own KV cache, guesses γ tokens.

Each draft token is one decode step of the small model: bandwidth-bound like the target's, but over
far fewer weight bytes, so c (a draft token's cost in target forwards) is about the size ratio on a
large model and much more on a tiny one, where per-layer overhead dominates. The draft's cache is
rolled back to the longest prefix it shares with the context the target accepted, so rejected
drafts disappear and accepted ones are never recomputed. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.engine.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative.distributions import RowView, draw, penalised, sampling_probs
from course_lib.engine.speculative.proposer import Proposal, Proposer


def _common_prefix(cached: list[int], ids: list[int]) -> int:
    """How many leading tokens ``cached`` and ``ids`` share."""
    keep = 0
    for a, b in zip(cached, ids):
        if a != b:
            break
        keep += 1
    return keep


@dataclass
class _DraftRow:
    handle: object
    cached: list[int]  # the ids whose K/V the draft's cache holds, in order


class DraftProposer(Proposer):
    """A small model run autoregressively, with its own KV cache: one handle per row in the draft engine's
    backend. Each call reuses the cache as far as it agrees with the new context (the longest common
    prefix) and truncates the rest: rejected drafts roll back, accepted ones are not recomputed. Rows
    sample with their own params (greedy rows take the argmax; others draw from q and report it)."""

    def __init__(self, draft: Engine) -> None:
        if not isinstance(draft, Engine):
            raise ValueError(f"draft must be an Engine, got {type(draft).__name__}")
        self.engine = draft
        self.model, self.backend = draft.model, draft.backend
        if not self.backend.stores_kv:
            raise ValueError("the draft engine's backend must store KV (e.g. the contiguous one)")
        self.vocab_size = draft.model.vocab_size
        self._rows: dict = {}

    def propose(self, context_ids: list[int], k: int) -> list[int]:
        """Greedy guesses for one context, using a temporary KV handle."""
        key = object()
        try:
            return self.propose_batch([key], [list(context_ids)], [k], [SamplingParams()], [None])[0].tokens
        finally:
            self.release(key)

    def release(self, key) -> None:
        row = self._rows.pop(key, None)
        if row is not None:
            self.backend.free(row.handle)

    def cached_length(self, key) -> int:
        """Tokens the draft's cache holds for this row (its KV handle's length)."""
        return self.backend.length(self._rows[key].handle)

    def rollback(self, key, ids: list[int]) -> int | None:
        """The final rollback of a finished row whose tokens are ``ids`` (the newest one pending): drop the
        drafts the target rejected on its last step. Returns the cache's length, None for an unknown row."""
        row = self._rows.get(key)
        if row is None:
            return None
        keep = _common_prefix(row.cached, ids[:-1])
        self.backend.truncate(row.handle, keep)
        row.cached = row.cached[:keep]
        return self.cached_length(key)

    @torch.inference_mode()
    def propose_batch(self, keys, contexts, ks, params, generators) -> list[Proposal]:
        out = [Proposal([]) for _ in keys]
        live = [i for i, k in enumerate(ks) if k > 0]
        if not live:
            return out
        handles, chunks, starts = [], [], []
        for i in live:
            ctx = contexts[i]
            row = self._rows.get(keys[i])
            if row is None:
                row = self._rows[keys[i]] = _DraftRow(self.backend.allocate(), [])
            keep = _common_prefix(row.cached, ctx[:-1])  # at most len(ctx) - 1: the last token is fed again
            self.backend.truncate(row.handle, keep)  # rollback: drafts the target rejected
            new = ctx[keep:]
            self.backend.append(row.handle, len(new))
            row.cached = ctx[:keep] + new
            handles.append(row.handle)
            chunks.append(new)
            starts.append(keep)
        tokens: dict[int, list[int]] = {i: [] for i in live}
        qs: dict[int, list[torch.Tensor]] = {i: [] for i in live}
        active = live
        for j in range(max(ks[i] for i in live)):
            logits = self.engine.forward(handles, chunks, starts)  # (len(active), V) at each row's last token
            # penalties: the context counts as prompt, the drafts so far as output (an approximation is
            # harmless: any q is correct as long as the drafts are really drawn from it)
            views = [RowView(params[i], contexts[i], tokens[i]) for i in active]
            logits = penalised(logits, views)
            greedy_ids = logits.argmax(dim=-1).tolist()
            sampled = [r for r, i in enumerate(active) if not params[i].greedy]
            if sampled:
                q = sampling_probs(logits[sampled], [params[active[r]] for r in sampled])  # (S, V)
                for s, r in enumerate(sampled):
                    i = active[r]
                    greedy_ids[r] = draw(q[s], generators[i])
                    qs[i].append(q[s])
            for r, i in enumerate(active):
                tokens[i].append(greedy_ids[r])
            # rows that want more drafts feed the one they just drew
            nxt = [r for r, i in enumerate(active) if ks[i] > j + 1]
            if not nxt:
                break
            active = [active[r] for r in nxt]
            handles = [handles[r] for r in nxt]
            chunks, starts = [], []
            for i, h in zip(active, handles):
                t = tokens[i][-1]
                starts.append(self.backend.length(h))
                self.backend.append(h, 1)
                self._rows[keys[i]].cached.append(t)
                chunks.append([t])
        for i in live:
            q = torch.stack(qs[i]) if qs[i] else None
            out[i] = Proposal(tokens[i], q)
        return out
