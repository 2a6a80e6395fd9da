"""Jacobi decoding and lookahead decoding: speculative decoding with no draft model at all.

Jacobi decoding (Santilli et al. 2023, "Accelerating Transformer Inference for Translation via Parallel
Decoding") treats the next W tokens as the unknowns of a fixed-point system y_i = argmax p(· | prefix,
y_<i). Start from a guessed window, run ONE target forward over [pending token + window] and replace
every window position by the target's argmax given the guesses before it; the longest prefix that is
already fixed is kept (exactly greedy verification), the rest is the next guess. Each forward costs
about one decode step (bandwidth-bound: the weights are read once for all W + 1 positions) and yields
at least one token, so greedy output is token-identical to plain decoding whatever the guesses.

Why it gives little on its own: guess i is conditioned on guesses 0..i-1, so one wrong token early in
the window poisons every later guess, and a position only becomes right once everything before it is.
A small model's next-token distribution is also flat, so a guess made from a wrong prefix is rarely
the token the right prefix would give. Expect ≈ 1.0-1.1 tokens per forward.

Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding") keeps the Jacobi trajectory running but also harvests n-grams from it into a pool keyed by
their first token, and verifies pool n-grams that start with the pending token: an n-gram seen earlier
in the trajectory is often the right continuation when the text repeats itself.

Both plug into ``SpeculativeDecoder`` through its ``observe(key, Verified)`` hook:
``Verified.argmax[accepted]`` is the correction (or bonus) and ``argmax[accepted + 1:]`` the target's new
guesses for the positions after it, conditioned on the rejected drafts: exactly the Jacobi update.

    dec = SpeculativeDecoder(Engine("tiny-target"), JacobiProposer(window=4), gamma=4)
    out = dec.generate([ids], SamplingParams(ignore_eos=True), max_new_tokens=64)

Its convergence trace and speed measurements are ``course_lib.decoding.convergence`` and
``course_lib.decoding.jacobi_speed``.

Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from course_lib.engine.speculative.proposer import Proposal, Proposer, Verified

INITS = ("repeat", "pad", "random")


def check_int(name: str, value, what: str) -> int:
    """``value`` if it is an int ≥ 1, else a ValueError naming ``name`` and saying ``what`` it counts."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} ({what}) must be an int ≥ 1, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------- Jacobi


@dataclass
class _JacobiRow:
    window: list[int]  # guesses for the positions after the pending token, oldest first
    pending: int  # the context's last token when the window was proposed
    position: int = 0  # its position in the sequence (len(context) - 1)


class JacobiProposer(Proposer):
    """Proposes each row's current Jacobi window and updates it from the verify forward.

    Init rule (the first window, and the padding that refills the window's end after each shift):
    ``"repeat"`` repeats the last known token (the context's last token at first, then the last guess);
    ``"pad"`` uses ``pad_id``; ``"random"`` draws uniform vocabulary ids from a generator seeded with
    ``seed`` (needs ``vocab_size``). Guesses never change the output, only how many forwards it takes."""

    def __init__(
        self,
        window: int,
        init: str = "repeat",
        *,
        pad_id: int = 0,
        vocab_size: int | None = None,
        seed: int = 0,
    ) -> None:
        self.window = check_int("window", window, "guessed tokens per step")
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        if init == "random":
            check_int("vocab_size", vocab_size, "the target's vocabulary size, needed by init='random'")
        if not isinstance(pad_id, int) or isinstance(pad_id, bool) or pad_id < 0:
            raise ValueError(f"pad_id must be an int ≥ 0 (a token id), got {pad_id!r}")
        self.init, self.pad_id, self.seed = init, pad_id, seed
        self.vocab_size = vocab_size  # the decoder checks it against the target's when given
        self._gen = torch.Generator().manual_seed(seed)
        self._rows: dict = {}

    def reset(self) -> None:
        """Forget every row and reseed the generator (notebook cells get re-run)."""
        self._rows.clear()
        self._gen.manual_seed(self.seed)

    # ------------------------------------------------------------ the window
    def _pad(self, window: list[int], last: int, n: int) -> list[int]:
        """``window`` extended to ``n`` tokens by the init rule; ``last`` is the token before it."""
        out = list(window[:n])
        while len(out) < n:
            if self.init == "repeat":
                out.append(out[-1] if out else last)
            elif self.init == "pad":
                out.append(self.pad_id)
            else:
                out.append(int(torch.randint(self.vocab_size, (), generator=self._gen)))
        return out

    def initial_window(self, context_ids: list[int]) -> list[int]:
        """The first guess for a context, by the init rule."""
        return self._pad([], context_ids[-1], self.window)

    @staticmethod
    def shift(window: list[int], verified: Verified) -> list[int]:
        """The next window before padding. ``window[j]`` guessed the token after row position j; the
        forward verified ``k = len(drafts)`` of them and ``argmax[j]`` (j = 0..k) re-guesses each. Drop the
        ``accepted`` prefix and the correction ``argmax[accepted]``; keep the target's new guesses
        ``argmax[accepted + 1:]`` and, when fewer than the whole window was verified, the old unverified
        guesses ``window[k + 1:]`` behind them (they still guess the same positions)."""
        k, n = len(verified.drafts), verified.accepted
        return list(verified.argmax[n + 1 : k + 1]) + list(window[k + 1 :])

    def window_of(self, key) -> list[int]:
        """A row's current window (a copy)."""
        return list(self._rows[key].window)

    # ------------------------------------------------------------ the proposer contract
    def propose(self, context_ids: list[int], k: int) -> list[int]:
        """Stateless: the first window for this context (a decoder calls ``propose_batch`` with row keys)."""
        return self.initial_window(list(context_ids))[: max(k, 0)] if context_ids else []

    def _draft(self, key, context: list[int], k: int) -> list[int]:
        return self._rows[key].window[:k]

    def propose_batch(self, keys, contexts, ks, params, generators) -> list[Proposal]:
        out = []
        for key, ctx, k in zip(keys, contexts, ks):
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = _JacobiRow(self.initial_window(ctx), ctx[-1])
            row.pending, row.position = ctx[-1], len(ctx) - 1
            out.append(Proposal(self._draft(key, ctx, k) if k > 0 else []))
        return out

    def observe(self, key, verified: Verified) -> None:
        """The Jacobi update: shift the window past the emitted tokens and refill its end."""
        row = self._rows[key]
        nxt = self.shift(row.window, verified)
        row.window = self._pad(nxt, verified.argmax[verified.accepted], self.window)

    def release(self, key) -> None:
        self._rows.pop(key, None)


# ---------------------------------------------------------------------------------------------- lookahead


class LookaheadProposer(JacobiProposer):
    """Jacobi window + an n-gram pool harvested from its trajectory (a one-branch lookahead decoding).

    Harvest: each verify forward fed token x at sequence position q (the pending token, then the drafts)
    and the target answered y = ``argmax`` there, its guess for q + 1: (x, y) is a 2-gram the target
    really predicted. Longer n-grams are chained backwards along the trajectory, as the paper's
    diagonals: x is prepended with the token fed at q − 1 in this or one of the last n − 2 forwards whose
    answer there was x, and so on, so every token of an n-gram is the target's prediction right after
    the one before it. Pool: per row, keyed by the n-gram's first token, at most ``pool_size``
    continuations (n − 1 tokens) per key, least recently seen dropped first, each with a count. Propose: the most often seen continuation of the pending
    token (ties: the most recent), followed by the Jacobi guesses for the positions after it; no
    continuation → the Jacobi window alone. The Jacobi update runs every step either way.

    What the paper does that this does not: each step verifies up to G pool candidates in parallel
    branches AND runs the lookahead branch (a 2-D window of W columns × (N − 1) past iterations, n-grams
    read along its diagonals) in the same forward, with a special attention mask so that no branch sees
    another. ``SpeculativeDecoder`` verifies one chain per row, so here the pool and the Jacobi guesses
    share that chain, and a wrong pool guess also spoils the Jacobi guesses behind it."""

    def __init__(
        self,
        window: int,
        ngram: int = 4,
        pool_size: int = 8,
        init: str = "repeat",
        *,
        pad_id: int = 0,
        vocab_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(window, init, pad_id=pad_id, vocab_size=vocab_size, seed=seed)
        if not isinstance(ngram, int) or isinstance(ngram, bool) or ngram < 2:
            raise ValueError(f"ngram (tokens per pool n-gram, the key included) must be an int ≥ 2, got {ngram!r}")
        self.ngram = ngram
        self.pool_size = check_int("pool_size", pool_size, "n-grams kept per first token")
        self._pools: dict = {}  # key → {first token → OrderedDict(continuation tuple → count)}
        self._history: dict = {}  # key → the last n − 1 forwards, newest first: {position q: (fed, answer)}
        self.pool_proposals = 0  # steps whose draft started with a pool n-gram

    def reset(self) -> None:
        super().reset()
        self._pools.clear()
        self._history.clear()
        self.pool_proposals = 0

    def pool_of(self, key) -> dict[int, list[tuple[int, ...]]]:
        """A row's pool: first token → continuations, least recently seen first."""
        return {t: list(c) for t, c in self._pools.get(key, {}).items()}

    def best(self, key, token: int) -> tuple[int, ...] | None:
        """The pool's continuation of ``token``: most often seen, the most recent on ties."""
        cands = self._pools.get(key, {}).get(token)
        if not cands:
            return None
        order = list(cands.items())
        i = max(range(len(order)), key=lambda m: (order[m][1], m))
        return order[i][0]

    def _add(self, key, gram: tuple[int, ...]) -> None:
        pool = self._pools.setdefault(key, {}).setdefault(gram[0], OrderedDict())
        cont = gram[1:]
        pool[cont] = pool.pop(cont, 0) + 1  # re-inserting marks it most recent
        while len(pool) > self.pool_size:
            pool.popitem(last=False)

    def _draft(self, key, context: list[int], k: int) -> list[int]:
        jacobi = self._rows[key].window[:k]
        cont = self.best(key, context[-1])
        if cont is None or k <= 0:
            return jacobi
        self.pool_proposals += 1
        cont = list(cont[:k])
        return cont + jacobi[len(cont) :]  # the Jacobi guesses for the positions after the n-gram

    def observe(self, key, verified: Verified) -> None:
        row = self._rows[key]
        fed = [row.pending] + list(verified.drafts)  # the token at each row position j
        step = {row.position + j: (x, y) for j, (x, y) in enumerate(zip(fed, verified.argmax))}  # q → (fed, answer)
        hist = self._history.setdefault(key, [])
        hist.insert(0, step)  # newest first
        del hist[max(1, self.ngram - 1) :]
        for q, (x, y) in step.items():
            gram = [y, x]  # backwards
            while len(gram) < self.ngram:
                q -= 1
                prev = next((h[q][0] for h in hist if q in h and h[q][1] == gram[-1]), None)
                if prev is None:
                    break
                gram.append(prev)
            if len(gram) == self.ngram:
                self._add(key, tuple(reversed(gram)))
        super().observe(key, verified)

    def release(self, key) -> None:
        super().release(key)
        self._pools.pop(key, None)
        self._history.pop(key, None)
