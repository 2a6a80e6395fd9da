"""A γ sweep over several prompts: the speed-up at each γ with its spread *across prompts*.

One prompt makes "best γ" the largest of a few noisy numbers (the winner's curse), and a prompt whose
text loops inflates every speculative method. Here each prompt gets its own plain-greedy baseline and
its own γ sweep (``speedup.gamma_sweep``); ``summarize`` gives, per γ, the median speed-up over prompts
and its spread (half the range over the median), with the α and c pooled over every run. The measured
best γ is the one with the highest median; ``near_best_gammas`` are those whose median ± spread reaches
the best one's lower end; ``formula_best_gamma`` is the best of the swept γs for the pooled α and c, in
(1 − α^(γ+1)) / ((1 − α)(γc + 1)). Overhead-bound tiny models on a CPU. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from course_lib.decoding.speedup import SpecRow, baseline, gamma_sweep
from course_lib.engine.speculative.theory import expected_speedup


@dataclass(frozen=True)
class GammaAcrossPrompts:
    """One γ over the prompts: each prompt's speed-up, their median and spread, pooled α and c."""

    gamma: int
    speedups: tuple
    alpha: float
    c: float

    @property
    def median(self) -> float:
        return statistics.median(self.speedups)

    @property
    def spread(self) -> float:
        """Half the range over the median across prompts (0 with one prompt)."""
        return (max(self.speedups) - min(self.speedups)) / (2 * self.median) if len(self.speedups) > 1 else 0.0


def sweep_prompts(
    target,
    make_proposer: Callable[[], object],
    prompts,
    gammas: Sequence[int],
    new_tokens: int,
    repeats: int = 1,
    method: str = "",
) -> list[list[SpecRow]]:
    """For each prompt, its own baseline and ``gamma_sweep``: [[SpecRow per γ] per prompt]."""
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of prompts (strings or token ids)")
    if not gammas or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in gammas):
        raise ValueError(f"gammas must be a non-empty list of ints >= 1, got {gammas!r}")
    out = []
    for p in prompts:
        base = baseline(target, [p], new_tokens, repeats)
        out.append(gamma_sweep(target, make_proposer, base, gammas, method, repeats))
    return out


def summarize(per_prompt: Sequence[Sequence[SpecRow]]) -> list[GammaAcrossPrompts]:
    """Per γ: the prompts' speed-ups (0 where an output was not token-identical) and the α and c pooled
    (medians over every run of every γ, as the formula takes one α and one c)."""
    if not per_prompt or any(not rows for rows in per_prompt):
        raise ValueError("per_prompt must be a non-empty list of non-empty lists of SpecRow")
    gammas = [r.gamma for r in per_prompt[0]]
    if any([r.gamma for r in rows] != gammas for rows in per_prompt):
        raise ValueError("every prompt must be swept over the same γs")
    every = [r for rows in per_prompt for r in rows]
    alpha = statistics.median(r.alpha for r in every)
    c = statistics.median(r.c for r in every)
    return [
        GammaAcrossPrompts(g, tuple(rows[i].speedup * rows[i].identical for rows in per_prompt), alpha, c)
        for i, g in enumerate(gammas)
    ]


def measured_best(summary: Sequence[GammaAcrossPrompts]) -> GammaAcrossPrompts:
    if not summary:
        raise ValueError("summary is empty")
    return max(summary, key=lambda s: s.median)


def near_best_gammas(summary: Sequence[GammaAcrossPrompts]) -> list[int]:
    """The γs the prompts cannot tell from the best: median·(1 + spread) ≥ best median·(1 − its spread)."""
    b = measured_best(summary)
    lo = b.median * (1 - b.spread)
    return sorted(s.gamma for s in summary if s.median * (1 + s.spread) >= lo)


def formula_best_gamma(summary: Sequence[GammaAcrossPrompts]) -> int:
    """The best swept γ for the pooled α and c."""
    if not summary:
        raise ValueError("summary is empty")
    a, c = min(max(summary[0].alpha, 0.0), 1.0), max(summary[0].c, 0.0)
    return max((s.gamma for s in summary), key=lambda g: expected_speedup(a, g, c))


def plot(summary: Sequence[GammaAcrossPrompts], ax, labels: Sequence[str] = (), title: str = "") -> None:
    """Each prompt's speed-up vs γ (thin), the median with its spread, and the formula for the pooled α, c."""
    gammas = [s.gamma for s in summary]
    for j in range(len(summary[0].speedups)):
        lab = labels[j] if j < len(labels) else f"prompt {j}"
        ax.plot(gammas, [s.speedups[j] for s in summary], "-", lw=0.8, alpha=0.6, label=lab)
    med = [s.median for s in summary]
    ax.errorbar(
        gammas,
        med,
        yerr=[m * s.spread for m, s in zip(med, summary)],
        fmt="ko-",
        capsize=3,
        label="median over prompts ± spread",
    )
    a, c = summary[0].alpha, summary[0].c
    ax.plot(
        gammas,
        [expected_speedup(min(max(a, 0.0), 1.0), g, max(c, 0.0)) for g in gammas],
        "--",
        color="grey",
        label=f"theory: E/(γc+1), pooled α={a:.2f}, c={c:.2f}",
    )
    ax.axhline(1.0, color="grey", lw=0.6)
    ax.set(xlabel="γ (drafts per step)", ylabel="speed-up over plain greedy (×)", title=title)
    ax.title.set_fontsize(9)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=7)


__all__ = [
    "GammaAcrossPrompts",
    "formula_best_gamma",
    "measured_best",
    "near_best_gammas",
    "plot",
    "summarize",
    "sweep_prompts",
]
