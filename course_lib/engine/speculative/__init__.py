"""Speculative decoding: a cheap proposer guesses γ tokens, the target checks them all in ONE forward.

Why it works. A decode step reads every weight of the target to produce one token per sequence: ~2
FLOPs per weight byte, far below the ridge point, so the arithmetic units sit idle. Verifying γ guessed
tokens is a forward over γ+1 positions, shaped like a short prefill: it reads the same weights once,
so on a bandwidth-bound machine it costs about as much as one decode step, and it yields between 1
and γ+1 tokens. The rejection rule (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding"; Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling") makes
the output distribution exactly the target's: accept draft x with probability min(1, p(x)/q(x)); at
the first rejection draw from norm(max(0, p − q)); after γ acceptances draw a bonus token from p.
Greedy decoding is the special case "accept while draft == argmax": token-identical to the target.

With acceptance rate α per draft token, γ drafts give E[tokens per target forward] = (1 − α^(γ+1)) /
(1 − α), and if one draft token costs c target forwards, the speedup is that over (γ·c + 1).

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
import math
import time
from dataclasses import dataclass, field

import torch

from course_lib.engine.engine import Engine
from course_lib.engine.sampler import filter_rows, is_penalised, token_counts
from course_lib.engine.sampling import SamplingParams, apply_penalties, make_generator

# ---------------------------------------------------------------------------------------------- theory


def _check_alpha(alpha) -> float:
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha (acceptance rate) must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def _check_gamma(gamma) -> int:
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per step) must be an int ≥ 1, got {gamma!r}")
    return gamma


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per target forward with γ drafts, each accepted with probability α (i.i.d.):
    1 + α + α² + … + α^γ = (1 − α^(γ+1)) / (1 − α); γ + 1 when α = 1."""
    alpha, gamma = _check_alpha(alpha), _check_gamma(gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, gamma: int, c: float) -> float:
    """Wall-clock speedup over plain decoding when one draft token costs ``c`` target forwards:
    expected_tokens / (γ·c + 1) (one step = γ draft forwards + one target forward)."""
    if not isinstance(c, (int, float)) or isinstance(c, bool) or not math.isfinite(c) or c < 0:
        raise ValueError(f"c (cost of a draft token / cost of a target forward) must be a finite number ≥ 0, got {c!r}")
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def best_gamma(alpha: float, c: float, max_gamma: int = 16) -> int:
    """The γ in 1..max_gamma with the highest expected speedup (the smallest on ties)."""
    max_gamma = _check_gamma(max_gamma)
    return max(range(1, max_gamma + 1), key=lambda g: (expected_speedup(alpha, g, c), -g))


# ---------------------------------------------------------------------------------------------- sampling helpers


class _RowView:
    """What the penalty code needs from a row at one position: params, prompt ids, output ids."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]) -> None:
        self.params, self.prompt_ids, self.output_ids = params, prompt_ids, output_ids


def _penalised(logits: torch.Tensor, rows: list[_RowView]) -> torch.Tensor:
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


def _probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """(M, V) penalised logits → the distribution each row samples from (temperature/top-k/top-p/min-p)."""
    return filter_rows(logits, params).softmax(dim=-1)


def _draw(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from the distribution p (V,)."""
    return int(torch.multinomial(p, 1, generator=generator))


# ---------------------------------------------------------------------------------------------- proposers


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
    ``wants_hidden = True`` and ``observe(key, Verified)`` to learn from each verify forward."""

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
            keep = 0  # longest common prefix of what is cached and the context, at most len(ctx) - 1
            for a, b in zip(row.cached, ctx[:-1]):
                if a != b:
                    break
                keep += 1
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
            views = [_RowView(params[i], contexts[i], tokens[i]) for i in active]
            logits = _penalised(logits, views)
            greedy_ids = logits.argmax(dim=-1).tolist()
            sampled = [r for r, i in enumerate(active) if not params[i].greedy]
            if sampled:
                q = _probs(logits[sampled], [params[active[r]] for r in sampled])  # (S, V)
                for s, r in enumerate(sampled):
                    i = active[r]
                    greedy_ids[r] = _draw(q[s], generators[i])
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


# ---------------------------------------------------------------------------------------------- the decoder


@dataclass
class SpecStats:
    """Counters of one ``generate`` call (all rows together)."""

    gamma: int
    target_forwards: int = 0
    row_steps: int = 0  # Σ over target forwards of the rows in it
    generated: int = 0  # tokens emitted (all rows)
    proposed: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted
    examined: int = 0  # draft tokens the target actually judged: up to and including the first rejection
    proposed_at: list[int] = field(default_factory=list)  # [j-1]: drafts proposed at position j (1..γ)
    examined_at: list[int] = field(default_factory=list)  # [j-1]: drafts judged at position j (all before accepted)
    accepted_at: list[int] = field(default_factory=list)  # [j-1]: drafts accepted at position j
    proposer_time: float = 0.0  # seconds in the proposer
    target_time: float = 0.0  # seconds in target forwards (+ acceptance), the first (prefill) one included
    first_forward_time: float = 0.0  # the first target forward, which also prefills the prompts
    history: list[list[int | None]] = field(default_factory=list)  # per step, per row: drafts accepted (None: done)
    drafts_per_row_step: list[int] = field(default_factory=list)  # k of every row at every step (≤ γ; 0: none)

    def __post_init__(self) -> None:
        self.proposed_at = self.proposed_at or [0] * self.gamma
        self.examined_at = self.examined_at or [0] * self.gamma
        self.accepted_at = self.accepted_at or [0] * self.gamma

    @property
    def acceptance_rate(self) -> float:
        """α, the chance that the target accepts a draft token it looks at: accepted / examined. Drafts
        after the first rejection are never judged, so they do not count (dividing by *proposed* would
        give (α + α² + … + α^γ)/γ, not α, and make the formula under-predict). This is the maximum-
        likelihood α of the i.i.d. model behind E = (1 − α^(γ+1))/(1 − α). nan when nothing was judged."""
        return self.accepted / self.examined if self.examined else math.nan

    @property
    def accepted_fraction(self) -> float:
        """accepted / proposed: the share of the draft's work that was kept (its cost, not its α)."""
        return self.accepted / self.proposed if self.proposed else math.nan

    @property
    def acceptance_at(self) -> list[float]:
        """Per draft position j = 1..γ: the chance draft j is accepted given drafts 1..j−1 were (the
        i.i.d. model says α at every j; a rising curve means acceptances come in runs)."""
        return [a / e if e else math.nan for a, e in zip(self.accepted_at, self.examined_at)]

    def expected_tokens_as_proposed(self, alpha: float | None = None) -> float:
        """E(α, k) averaged over the drafts actually proposed at every row-step (k = 0 gives 1 token):
        the formula's tokens per forward when a proposer does not always offer γ drafts."""
        a = self.acceptance_rate if alpha is None else alpha
        ks = self.drafts_per_row_step
        if not ks or not a == a:
            return math.nan
        a = min(max(a, 0.0), 1.0)
        return sum(expected_tokens(a, k) if k > 0 else 1.0 for k in ks) / len(ks)

    @property
    def effective_alpha(self) -> float:
        """The α for which the formula's E(α, γ) equals the measured tokens per forward (bisection)."""
        e = self.tokens_per_forward
        if not e == e or not self.row_steps:
            return math.nan
        g = self.gamma
        if e <= 1.0:
            return 0.0
        if e >= g + 1:
            return 1.0
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if expected_tokens(mid, g) < e:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    @property
    def tokens_per_forward(self) -> float:
        """Tokens a row gains per target forward (1 for plain decoding; γ + 1 at most)."""
        return self.generated / self.row_steps if self.row_steps else math.nan

    @property
    def verify_time(self) -> float:
        """Mean seconds of one target forward after the first (the decode-time verify step)."""
        n = self.target_forwards - 1
        return (self.target_time - self.first_forward_time) / n if n > 0 else math.nan

    @property
    def cost_ratio(self) -> float:
        """c: proposer seconds per draft token / seconds per target verify forward."""
        if not self.proposed or not self.verify_time > 0:
            return math.nan
        return (self.proposer_time / self.proposed) / self.verify_time


@dataclass
class SpeculativeResult:
    prompt_ids: list[int]
    output_ids: list[int]  # generated ids; ends with EOS when finish_reason == "eos"
    finish_reason: str  # "eos" or "length"
    proposed: int = 0
    accepted: int = 0
    accepted_per_step: list[int] = field(default_factory=list)  # drafts accepted at each of this row's steps
    kv_length: int | None = None  # the target KV handle's length just before it was freed
    draft_kv_length: int | None = None  # the draft's (DraftProposer only), after its final rollback


@dataclass
class SpeculativeOutput:
    results: list[SpeculativeResult]
    stats: SpecStats

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> SpeculativeResult:
        return self.results[i]

    def __iter__(self):
        return iter(self.results)


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

    def _step(self, active: list[_Row], stats: SpecStats, first: bool) -> None:
        tgt, kv, gamma = self.target, self.target.backend, self.gamma
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
        # 2. one target forward: row i feeds its pending tokens + its drafts; logits at the last 1 + k_i
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
        hidden = None
        if getattr(self.proposer, "wants_hidden", False):  # Medusa: heads read the target's last hidden state
            hidden = model.run_layers(model.embed(torch.tensor(flat, device=dev)), pos, meta, kv)[idx]  # (Σ(1+k_i), D)
            logits = model.head(hidden)
        else:
            logits = model(torch.tensor(flat, device=dev), pos, meta, kv, logits_indices=idx)  # (Σ(1 + k_i), V)
        # 3. accept / reject, row by row
        views, plist = [], []
        for r, d in zip(active, drafts):
            out = r.ids[len(r.prompt) :]
            for j in range(len(d) + 1):
                views.append(_RowView(r.params, r.prompt, out + d[:j]))
                plist.append(r.params)
        logits = _penalised(logits, views)
        argmax = logits.argmax(dim=-1).tolist()
        sampled = [m for m, p in enumerate(plist) if not p.greedy]
        probs = None
        if sampled:
            probs = logits.new_zeros(logits.shape)
            probs[sampled] = _probs(logits[sampled], [plist[m] for m in sampled])
        offset = 0
        observe = getattr(self.proposer, "observe", None)
        for r, d, prop in zip(active, drafts, props):
            k = len(d)
            rows_here = range(offset, offset + k + 1)
            if r.params.greedy:
                n = 0
                while n < k and d[n] == argmax[offset + n]:
                    n += 1
                new = d[:n] + [argmax[offset + n]]  # the correction, or the bonus after all k
            else:
                new = self._rejection(d, prop.q, probs[offset : offset + k + 1], r.generator)
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
            offset = rows_here.stop
            # stats
            stats.proposed += k
            stats.accepted += n
            stats.drafts_per_row_step.append(k)
            stats.examined += min(n + 1, k)
            for j in range(k):
                stats.proposed_at[j] += 1
            for j in range(min(n + 1, k)):
                stats.examined_at[j] += 1
            for j in range(n):
                stats.accepted_at[j] += 1
            r.result.proposed += k
            r.result.accepted += n
            r.result.accepted_per_step.append(n)
            # 4. stop on EOS / length, then roll the target KV back to exactly the kept tokens
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
                sync = getattr(self.proposer, "cached_length", None)
                if sync is not None and r.key in getattr(self.proposer, "_rows", {}):
                    # the final rollback: drop drafts the target rejected on this last step
                    prow = self.proposer._rows[r.key]
                    keep = 0
                    for a, b in zip(prow.cached, r.ids[:-1]):
                        if a != b:
                            break
                        keep += 1
                    self.proposer.backend.truncate(prow.handle, keep)
                    prow.cached = prow.cached[:keep]
                    r.result.draft_kv_length = sync(r.key)
                kv.free(r.handle)
                r.handle = None
        t2 = time.perf_counter()
        stats.target_forwards += 1
        stats.row_steps += len(active)
        stats.target_time += t2 - t1
        if first:
            stats.first_forward_time = t2 - t1

    @staticmethod
    def _rejection(
        drafts: list[int], q: torch.Tensor | None, p: torch.Tensor, generator: torch.Generator | None
    ) -> list[int]:
        """The speculative sampling rule on one row. ``p`` (k+1, V): the target's distributions at each
        draft position and after the last; ``q`` (k, V) the draft's (None: deterministic drafts, q one-hot).
        Returns the accepted drafts followed by one token from the residual (or the bonus from p)."""
        out: list[int] = []
        for j, x in enumerate(drafts):
            px = float(p[j, x])
            qx = 1.0 if q is None else float(q[j, x])
            u = float(torch.rand((), generator=generator, device=p.device))
            if u * qx < px:  # accept with probability min(1, p(x)/q(x))
                out.append(x)
                continue
            # rejected: draw from norm(max(0, p − q)); with a one-hot q that is p with x zeroed
            if q is None:
                residual = p[j].clone()
                residual[x] = 0.0
            else:
                residual = (p[j] - q[j]).clamp_(min=0.0)
            if float(residual.sum()) <= 0.0:  # only by rounding (p ≈ q): fall back to p
                residual = p[j]
            out.append(_draw(residual / residual.sum(), generator))
            return out
        out.append(_draw(p[len(drafts)], generator))  # all accepted: the bonus token from p
        return out
