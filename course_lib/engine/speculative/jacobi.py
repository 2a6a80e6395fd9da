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
    trace = jacobi_trace(Engine("tiny-target"), prompt, 32, window=4); plot_jacobi_trace(trace)

Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from course_lib.engine.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative import Proposal, Proposer, SpeculativeDecoder, Verified

#: The code prompt of ``benchmarks/speculative.py``: the measurement helper's default.
CODE_PROMPT = (
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n"
)
INITS = ("repeat", "pad", "random")


def _check_int(name: str, value, what: str) -> int:
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
        self.window = _check_int("window", window, "guessed tokens per step")
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        if init == "random":
            _check_int("vocab_size", vocab_size, "the target's vocabulary size, needed by init='random'")
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
        self.pool_size = _check_int("pool_size", pool_size, "n-grams kept per first token")
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


# ---------------------------------------------------------------------------------------------- convergence trace


class _Recorder(JacobiProposer):
    """A Jacobi proposer that keeps every row's (pending token, Verified) in order."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[Verified] = []

    def observe(self, key, verified: Verified) -> None:
        self.log.append(verified)
        super().observe(key, verified)


@dataclass
class JacobiTrace:
    """One greedy Jacobi run at batch 1, iteration by iteration (iteration f = target forward f, from 1).

    ``start[f-1]``: output tokens fixed before forward f, so ``drafts[f-1][j]`` guessed output position
    ``start + j`` and ``guesses[f-1][j]`` is the target's answer there (j = 0 is the token after the pending
    one). ``emitted_at[i]``: the forward that emitted output token i; ``converged_at[i]``: the first forward
    from which the target's guess at position i was already the final token and stayed so until emitted
    (≤ ``emitted_at[i]``; smaller means Jacobi found it before the prefix was fixed)."""

    prompt_ids: list[int]
    output_ids: list[int]
    window: int
    start: list[int] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)
    guesses: list[list[int]] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    emitted_at: list[int] = field(default_factory=list)
    converged_at: list[int] = field(default_factory=list)

    @property
    def forwards(self) -> int:
        return len(self.start)

    @property
    def tokens_per_forward(self) -> float:
        return len(self.output_ids) / self.forwards if self.forwards else math.nan

    @property
    def early(self) -> int:
        """Output tokens the trajectory had right before the forward that emitted them."""
        return sum(c < e for c, e in zip(self.converged_at, self.emitted_at))

    def grid(self) -> np.ndarray:
        """(forwards, len(output)) codes for a heat map: 0 outside the window, 1 wrong guess, 2 guess
        already equal to the final token, 3 emitted by this forward, 4 emitted earlier."""
        n = len(self.output_ids)
        g = np.zeros((self.forwards, n), dtype=np.int8)
        for f, (s, guess) in enumerate(zip(self.start, self.guesses)):
            g[f, :s] = 4
            for j, t in enumerate(guess):
                i = s + j
                if i < n:
                    g[f, i] = 2 if t == self.output_ids[i] else 1
            for i in range(n):
                if self.emitted_at[i] == f + 1:
                    g[f, i] = 3
        return g


def jacobi_trace(
    engine: Engine, prompt, max_new_tokens: int, window: int, init: str = "repeat", **init_kwargs
) -> JacobiTrace:
    """Run greedy Jacobi decoding on one prompt (text or ids) and record which output positions converge
    at which iteration, for a heat map (``plot_jacobi_trace``). EOS is ignored so the length is fixed."""
    _check_int("window", window, "guessed tokens per step")
    rec = _Recorder(window, init, **init_kwargs)
    [ids] = engine.encode([prompt] if isinstance(prompt, str) else [list(prompt)])
    out = SpeculativeDecoder(engine, rec, gamma=window).generate(
        [ids], SamplingParams(ignore_eos=True), max_new_tokens=max_new_tokens
    )
    final = out[0].output_ids
    n = len(final)
    tr = JacobiTrace(list(ids), list(final), window)
    emitted = 0
    state: list[tuple[int, int] | None] = [None] * n  # per position: (value, first forward it held it)
    emitted_at, converged_at = [0] * n, [0] * n
    for f, v in enumerate(rec.log, start=1):
        tr.start.append(emitted)
        tr.drafts.append(list(v.drafts))
        tr.guesses.append(list(v.argmax))
        tr.accepted.append(v.accepted)
        covered = set()
        for j, t in enumerate(v.argmax):
            i = emitted + j
            if i >= n:
                break
            covered.add(i)
            if state[i] is None or state[i][0] != t:
                state[i] = (t, f)
        for i in range(emitted, n):  # a position the forward did not cover starts over
            if i not in covered:
                state[i] = None
        new = min(v.accepted + 1, n - emitted)
        for i in range(emitted, emitted + new):
            emitted_at[i] = f
            converged_at[i] = state[i][1]
        emitted += new
    tr.emitted_at, tr.converged_at = emitted_at, converged_at
    return tr


def plot_jacobi_trace(trace: JacobiTrace, *, ax=None, max_tokens: int | None = 64):
    """Heat map of a ``JacobiTrace``: iterations down, output positions across; grey = emitted earlier,
    red = wrong guess, yellow = guess already final, green = emitted by this forward. Returns the figure."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from course_lib.measure.plots import FIGSIZE, new_axes

    g = trace.grid()
    if max_tokens is not None:
        g = g[:, :max_tokens]
        rows = np.flatnonzero((g != 4).any(axis=1))
        g = g[: rows[-1] + 1] if len(rows) else g[:1]
    fig, ax = new_axes(ax, figsize=(FIGSIZE[0], min(6.0, 1.5 + 0.12 * g.shape[0])))
    cmap = ListedColormap(["white", "#d62728", "#ffbf00", "#2ca02c", "#c7c7c7"])
    ax.imshow(g, cmap=cmap, vmin=-0.5, vmax=4.5, aspect="auto", interpolation="nearest")
    ax.set_xlabel("output position")
    ax.set_ylabel("iteration (target forward)")
    ax.set_yticks(range(0, g.shape[0], max(1, g.shape[0] // 8)))
    ax.set_yticklabels([str(f + 1) for f in range(0, g.shape[0], max(1, g.shape[0] // 8))])
    ax.set_title(
        f"Jacobi decoding, window {trace.window}: {trace.tokens_per_forward:.2f} tokens/forward, "
        f"{trace.early} of {len(trace.output_ids)} tokens right before their turn",
        fontsize=9,
    )
    labels = ["wrong guess", "guess already final", "emitted now", "emitted earlier"]
    handles = [Patch(color=cmap(c), label=lab) for c, lab in zip(range(1, 5), labels)]
    ax.legend(handles=handles, fontsize=7, loc="upper right", framealpha=0.9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------- measurement


def measure_jacobi(
    engine: Engine | None = None,
    prompts=(CODE_PROMPT,),
    *,
    max_new_tokens: int = 64,
    windows=(2, 4, 8),
    lookahead: dict | None = None,
    repeats: int = 3,
) -> list[dict]:
    """Batch 1, greedy, EOS ignored: per method, tokens per target forward, acceptance, forwards and the
    wall-clock speedup over plain ``engine.generate`` (all prompts one after the other; best of ``repeats``
    rounds, each timing every method once, after one warm-up), and whether every output is
    token-identical to plain.
    ``lookahead``: LookaheadProposer keyword arguments (default window 4, 4-grams, pool 8)."""
    from course_lib.measure.bench import benchmark

    engine = engine or Engine("tiny-target")
    repeats = _check_int("repeats", repeats, "timed runs per method")
    ids = engine.encode(list(prompts))
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    refs = [engine.generate([x], params)[0].output_ids for x in ids]

    la = {"window": 4, "ngram": 4, "pool_size": 8, **(lookahead or {})}
    methods = [(f"jacobi W={w}", lambda w=w: JacobiProposer(w), w) for w in windows]
    methods.append((f"lookahead W={la['window']} n={la['ngram']}", lambda: LookaheadProposer(**la), la["window"]))
    rows = [dict(method="plain", window=0, tokens_per_forward=1.0, acceptance=math.nan, forwards=sum(map(len, refs)))]
    rows[0]["identical"] = True
    fns = [lambda: [engine.generate([x], params) for x in ids]]
    for name, make, w in methods:
        gen, acc, prop, fwd, same = 0, 0, 0, 0, True
        for x, ref in zip(ids, refs):
            out = SpeculativeDecoder(engine, make(), gamma=w).generate([x], params)
            st = out.stats
            gen, acc, prop, fwd = gen + st.generated, acc + st.accepted, prop + st.proposed, fwd + st.target_forwards
            same &= out[0].output_ids == ref
        rows.append(
            dict(
                method=name,
                window=w,
                tokens_per_forward=gen / fwd,
                acceptance=acc / prop if prop else math.nan,
                forwards=fwd,
                identical=same,
            )
        )
        fns.append(
            lambda make=make, w=w: [SpeculativeDecoder(engine, make(), gamma=w).generate([x], params) for x in ids]
        )
    # round robin, best of ``repeats``: a load change on a shared machine hits every method alike
    best = [math.inf] * len(fns)
    for fn in fns:
        fn()  # warm-up
    for _ in range(repeats):
        for m, fn in enumerate(fns):
            best[m] = min(best[m], benchmark(fn, warmup=0, repeats=1, device="cpu").best_s)
    for row, t in zip(rows, best):
        row["time_s"], row["speedup"] = t, best[0] / t
    return rows


def format_table(rows: list[dict]) -> str:
    """``measure_jacobi``'s rows as a fixed-width text table."""
    head = f"{'method':<22}{'tok/fwd':>9}{'α':>7}{'forwards':>10}{'ms':>9}{'speedup':>9}{'identical':>10}"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['method']:<22}{r['tokens_per_forward']:>9.2f}{r['acceptance']:>7.2f}{r['forwards']:>10}"
            f"{r['time_s'] * 1e3:>9.1f}{r['speedup']:>8.2f}x{str(r['identical']):>10}"
        )
    return "\n".join(lines)
