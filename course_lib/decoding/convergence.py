"""Jacobi decoding's convergence, iteration by iteration: which output positions were right when.

``jacobi_trace`` runs greedy Jacobi decoding at batch 1 with a recording proposer and notes, for every
output position, the forward that emitted it and the first forward from which the target's guess there
was already final; ``plot_jacobi_trace`` draws it as a heat map (iterations down, positions across).
It shows why plain Jacobi gives about one token per forward on a small model: a guess only becomes
final once everything before it is. Each forward is one bandwidth-bound verify step of W + 1 tokens.
Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from course_lib.engine.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative.jacobi import JacobiProposer
from course_lib.engine.speculative.proposer import Verified
from course_lib.engine.speculative.verifier import SpeculativeDecoder


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
