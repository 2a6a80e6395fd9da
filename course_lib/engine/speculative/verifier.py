"""Speculative decoding: a cheap proposer guesses γ tokens, the target checks them all in ONE forward.

Why it works. A decode step reads every weight of the target to produce one token per sequence: ~2
FLOPs per weight byte, far below the ridge point, so the arithmetic units sit idle. Verifying γ guessed
tokens is a forward over γ+1 positions, shaped like a short prefill: it reads the same weights once,
so on a bandwidth-bound machine it costs about as much as one decode step, and it yields between 1
and γ+1 tokens. The rejection rule (``acceptance``) makes the output distribution exactly the target's;
greedy rows are token-identical to the target alone. The formulas are in ``theory``.

    decoder = SpeculativeDecoder(Engine("tiny-target"), DraftProposer(Engine("tiny-draft")), gamma=4)
    out = decoder.generate([ids], SamplingParams(), max_new_tokens=64)
    out[0].output_ids, out.stats.acceptance_rate, out.stats.tokens_per_forward, out.stats.cost_ratio

The decoder drives the target's model and attention backend directly (not the scheduler): one KV
handle per row, a flat ragged batch where row i contributes [pending tokens + its k_i drafts] (the
whole prompt on the first forward, so the first token is verified too; afterwards the one sampled
token whose K/V is not stored yet), logits at each of the last k_i + 1 positions, then
``backend.truncate`` rolls back rejected drafts. Invariant after every step: the target's KV holds
exactly prompt + generated − 1 tokens (the newest token is pending). Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass

import torch

from course_lib.engine.engine import Engine
from course_lib.engine.sampling import SamplingParams, make_generator
from course_lib.engine.speculative.acceptance import accept_greedy, accept_sampled
from course_lib.engine.speculative.distributions import RowView, penalised, sampling_probs
from course_lib.engine.speculative.proposer import Proposal, Verified
from course_lib.engine.speculative.stats import SpecStats, SpeculativeOutput, SpeculativeResult


@dataclass(eq=False)
class _Row:
    index: int
    key: int
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    handle: object
    ids: list[int]  # prompt + generated
    cached: int = 0  # ids[:cached] have K/V in the target's cache
    finish: str | None = None
    result: SpeculativeResult | None = None


class SpeculativeDecoder:
    """Speculative decoding over a target ``Engine`` with a proposer (``DraftProposer``, ``PromptLookupProposer``
    or anything with ``propose(context_ids, k)``), γ draft tokens per step."""

    _keys = itertools.count()

    def __init__(self, target: Engine, proposer, gamma: int) -> None:
        if not isinstance(target, Engine):
            raise ValueError(f"target must be an Engine, got {type(target).__name__}")
        if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
            raise ValueError(f"gamma must be an int ≥ 1 (draft tokens per step), got {gamma!r}")
        if not callable(getattr(proposer, "propose", None)):
            raise ValueError(f"proposer must have a propose(context_ids, k) method, got {type(proposer).__name__}")
        dv = getattr(proposer, "vocab_size", None)
        if dv is not None and dv != target.model.vocab_size:
            raise ValueError(
                f"draft and target have different vocabularies ({dv} vs {target.model.vocab_size} tokens): "
                "the target cannot score the draft's token ids"
            )
        if not target.backend.stores_kv:
            raise ValueError("the target engine's backend must store KV (truncate rolls back rejected drafts)")
        self.target, self.proposer, self.gamma = target, proposer, gamma

    # ------------------------------------------------------------ helpers
    def _propose(self, rows: list[_Row], ks: list[int]) -> list[Proposal]:
        batch = getattr(self.proposer, "propose_batch", None)
        if batch is not None:
            return batch(
                [r.key for r in rows], [r.ids for r in rows], ks, [r.params for r in rows], [r.generator for r in rows]
            )
        return [Proposal(list(self.proposer.propose(list(r.ids), k))[:k] if k else []) for r, k in zip(rows, ks)]

    def _params(self, params, n: int) -> list[SamplingParams]:
        plist = self.target._params_list(params, n)
        for i, p in enumerate(plist):
            if p.stop:
                raise ValueError(f"params[{i}].stop: stop strings are not supported by SpeculativeDecoder")
            unsupported = [name for name in ("logit_bias", "min_tokens", "structured") if getattr(p, name)]
            unsupported += ["logprobs"] * (p.logprobs is not None) + ["max_new_tokens=None"] * (
                p.max_new_tokens is None
            )
            if unsupported:
                raise ValueError(
                    f"params[{i}]: {', '.join(unsupported)} not supported by SpeculativeDecoder (use Engine)"
                )
        return plist

    # ------------------------------------------------------------ generate
    @torch.inference_mode()
    def generate(
        self,
        prompts,
        params: SamplingParams | list[SamplingParams] | None = None,
        max_new_tokens: int | None = None,
    ) -> SpeculativeOutput:
        """Generate for every prompt (strings or token ids). ``max_new_tokens`` overrides the params'.
        Greedy rows are token-identical to ``target.generate``; sampled rows follow the target's distribution."""
        tgt = self.target
        ids = tgt.encode(prompts)
        plist = self._params(params, len(ids))
        if max_new_tokens is not None:
            if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
                raise ValueError(f"max_new_tokens must be an int ≥ 1, got {max_new_tokens!r}")
            plist = [dataclasses.replace(p, max_new_tokens=max_new_tokens) for p in plist]
        for p in plist:
            tgt.check_fits(ids, p.max_new_tokens)
        draft_backend = getattr(self.proposer, "backend", None)
        if draft_backend is not None:
            limit = draft_backend.max_tokens_per_seq()
            for i, (p_ids, p) in enumerate(zip(ids, plist)):
                if len(p_ids) + p.max_new_tokens > limit:
                    raise ValueError(f"prompts[{i}] + max_new_tokens does not fit the draft's KV ({limit} tokens)")
        stats = SpecStats(self.gamma)
        rows: list[_Row] = []
        try:
            for i, (p_ids, p) in enumerate(zip(ids, plist)):
                gen = make_generator(p.seed, tgt.device) if p.seed is not None and not p.greedy else None
                rows.append(_Row(i, next(self._keys), p_ids, p, gen, None, list(p_ids)))
                rows[-1].handle = tgt.backend.allocate()
            while True:
                active = [r for r in rows if r.finish is None]
                if not active:
                    break
                self._step(active, stats, first=stats.target_forwards == 0)
                stats.history.append([r.result.accepted_per_step[-1] if r in active else None for r in rows])
        finally:
            for r in rows:
                if r.handle is not None:
                    tgt.backend.free(r.handle)
                    r.handle = None
                release = getattr(self.proposer, "release", None)
                if release is not None:
                    release(r.key)
        return SpeculativeOutput([r.result for r in rows], stats)

    def _forward(self, active: list[_Row], drafts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ONE target forward: row i feeds its pending tokens + its drafts. Returns the logits (Σ(1 + k_i), V)
        at each row's last 1 + k_i positions, and the hidden states there (Σ(1 + k_i), D) when the proposer
        wants them (Medusa heads read the target's last hidden state), else None."""
        tgt, kv = self.target, self.target.backend
        flat: list[int] = []
        positions: list[int] = []
        lens: list[int] = []
        index: list[int] = []
        for r, d in zip(active, drafts):
            chunk = r.ids[r.cached :] + d
            kv.append(r.handle, len(chunk))
            index += range(len(flat) + len(chunk) - len(d) - 1, len(flat) + len(chunk))
            positions += range(r.cached, r.cached + len(chunk))
            flat += chunk
            lens.append(len(chunk))
        dev = tgt.device
        pos = torch.tensor(positions, device=dev)
        meta = kv.prepare([r.handle for r in active], lens, pos)
        model, idx = tgt.model, torch.tensor(index, device=dev)
        if getattr(self.proposer, "wants_hidden", False):
            hidden = model.run_layers(model.embed(torch.tensor(flat, device=dev)), pos, meta, kv)[idx]  # (Σ(1+k_i), D)
            return model.head(hidden), hidden
        return model(torch.tensor(flat, device=dev), pos, meta, kv, logits_indices=idx), None  # (Σ(1 + k_i), V)

    def _step(self, active: list[_Row], stats: SpecStats, first: bool) -> None:
        gamma = self.gamma
        for r in active:
            if r.result is None:
                r.result = SpeculativeResult(r.prompt, [], "length")
        # 1. propose: at most γ, and never more than the row may still emit minus the correction/bonus
        ks = [min(gamma, r.params.max_new_tokens - (len(r.ids) - len(r.prompt)) - 1) for r in active]
        t0 = time.perf_counter()
        props = self._propose(active, ks)
        t1 = time.perf_counter()
        stats.proposer_time += t1 - t0
        drafts = [p.tokens[:k] for p, k in zip(props, ks)]
        # 2. one target forward over every row's pending tokens + drafts
        logits, hidden = self._forward(active, drafts)
        # 3. accept / reject, row by row
        views, plist = [], []
        for r, d in zip(active, drafts):
            out = r.ids[len(r.prompt) :]
            for j in range(len(d) + 1):
                views.append(RowView(r.params, r.prompt, out + d[:j]))
                plist.append(r.params)
        logits = penalised(logits, views)
        argmax = logits.argmax(dim=-1).tolist()
        sampled = [m for m, p in enumerate(plist) if not p.greedy]
        probs = None
        if sampled:
            probs = logits.new_zeros(logits.shape)
            probs[sampled] = sampling_probs(logits[sampled], [plist[m] for m in sampled])
        offset = 0
        observe = getattr(self.proposer, "observe", None)
        for r, d, prop in zip(active, drafts, props):
            k = len(d)  # this row's positions: offset .. offset + k
            if r.params.greedy:
                new = accept_greedy(d, argmax[offset : offset + k + 1])
            else:
                new = accept_sampled(d, prop.q, probs[offset : offset + k + 1], r.generator)
            n = len(new) - 1
            if observe is not None:  # what the verify forward saw, for proposers that learn from it
                observe(
                    r.key,
                    Verified(
                        drafts=d,
                        accepted=n,
                        argmax=argmax[offset : offset + k + 1],
                        hidden=None if hidden is None else hidden[offset : offset + k + 1],
                    ),
                )
            offset += k + 1
            stats.record_step(r.result, k, n)
            self._emit(r, new, stats)
        t2 = time.perf_counter()
        stats.target_forwards += 1
        stats.row_steps += len(active)
        stats.target_time += t2 - t1
        if first:
            stats.first_forward_time = t2 - t1

    def _emit(self, r: _Row, new: list[int], stats: SpecStats) -> None:
        """4. Stop on EOS / length, then roll the target KV back to exactly the kept tokens; a finished row
        frees its handle (and the proposer drops the drafts it rejected last)."""
        tgt, kv = self.target, self.target.backend
        if not r.params.ignore_eos:
            for j, t in enumerate(new):
                if t in tgt.eos_ids:
                    new = new[: j + 1]
                    r.finish = "eos"
                    break
        room = r.params.max_new_tokens - (len(r.ids) - len(r.prompt))
        new = new[:room]
        r.ids += new
        r.cached = len(r.ids) - 1  # everything but the newest token has valid K/V
        kv.truncate(r.handle, r.cached)
        stats.generated += len(new)
        if r.finish is None and len(r.ids) - len(r.prompt) >= r.params.max_new_tokens:
            r.finish = "length"
        if r.finish is not None:
            r.result.output_ids = r.ids[len(r.prompt) :]
            r.result.finish_reason = r.finish
            r.result.kv_length = kv.length(r.handle)
            rollback = getattr(self.proposer, "rollback", None)  # a proposer with its own KV (DraftProposer)
            if rollback is not None:
                r.result.draft_kv_length = rollback(r.key, r.ids)
            kv.free(r.handle)
            r.handle = None
