"""Chapter 04's verdicts on speculative decoding, as functions, so that each one can be fed a counter-example.

Each takes the measured rows (``speedup.SpecRow``, ``sampled.Identity``, a recorded prompt set) and calls
``measure.claims.claim`` with the claim's own threshold; where the measurement has a run-to-run spread
(timing rounds), it is passed on, so a threshold inside the noise prints "inside the noise on this
machine" instead of a verdict that flips between runs. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence

from course_lib.decoding import smol_record
from course_lib.decoding.speedup import SpecRow, best_row, near_best
from course_lib.engine.speculative.theory import expected_speedup
from course_lib.measure.claims import Verdict, claim


def _spread(row: SpecRow):
    return row.spread if row.spread == row.spread else None


def formula_within(row: SpecRow, tolerance: float = 0.15, refined: bool = False) -> Verdict:
    """Measured ÷ formula (or the refined formula) inside 1 ± ``tolerance``, with the row's spread."""
    predicted = row.predicted_refined if refined else row.predicted
    ratio = row.speedup / predicted
    if refined:
        statement = (
            f"the refined formula (verify cost and drafts per step measured too) predicts it within ±{tolerance:.0%}"
        )
        why = "time spent outside the draft and verify forwards"
    else:
        statement = (
            f"at the best γ the textbook formula (α, c measured in the same run) predicts the speed-up within "
            f"±{tolerance:.0%}"
        )
        why = (
            f"one verify forward cost {row.verify_over_plain:.2f} plain steps here where the formula assumes 1: "
            "see the list below"
        )
    return claim(statement, ratio, at_least=1 - tolerance, at_most=1 + tolerance, spread=_spread(row), why_not=why)


def formula_gamma(rows: Sequence[SpecRow]) -> int:
    """The formula's best γ among the swept ones, with the best row's α and c."""
    b = best_row(rows)
    return max((r.gamma for r in rows), key=lambda g: expected_speedup(min(max(b.alpha, 0.0), 1.0), g, max(b.c, 0.0)))


def formula_gamma_near_best(rows: Sequence[SpecRow]) -> Verdict:
    """The formula's best γ (of those swept) is one of the γs the run cannot tell from the measured best."""
    g, b = formula_gamma(rows), best_row(rows)
    return claim(
        "the formula's best γ is among the γs this run cannot tell from the measured best",
        float(g in near_best(rows)),
        at_least=1.0,
        why_not=f"the formula's γ={g} measured clearly slower than γ={b.gamma}: acceptance is not i.i.d. (the "
        "conditional acceptance plot) and a verify forward is not one plain step",
    )


def formula_gamma_near_best_across_prompts(summary) -> Verdict:
    """The formula's best γ (pooled α and c, of those swept) is one of the γs the prompts cannot tell from
    the measured best (``prompt_sweep.near_best_gammas``: median ± spread across prompts)."""
    from course_lib.decoding.prompt_sweep import formula_best_gamma, measured_best, near_best_gammas

    g, b, near = formula_best_gamma(summary), measured_best(summary), near_best_gammas(summary)
    return claim(
        f"over {len(b.speedups)} prompts, the formula's best γ ({g}) is among the γs they cannot tell from the "
        f"measured best ({near})",
        float(g in near),
        at_least=1.0,
        why_not=f"γ={g} measured clearly slower than γ={b.gamma} on these prompts: acceptance is not i.i.d. "
        "and a verify forward costs more than a plain step",
    )


def speedup_at_least(row: SpecRow, goal: float, statement: str, why_not: str = "") -> Verdict:
    """The row's speed-up (0 unless its output was token-identical) ≥ ``goal``, with its spread."""
    return claim(statement, row.speedup * row.identical, at_least=goal, spread=_spread(row), why_not=why_not)


def identity_holds(ident, sigmas: float = 3.0) -> Verdict:
    """α = 1 − TV(p, q): the accepted count within ``sigmas`` standard deviations of Σ(1 − TV)."""
    return claim(
        f"α = 1 − TV(p, q): the accepted count within {sigmas:g} standard deviations of Σ(1 − TV)",
        abs(ident.z),
        at_most=sigmas,
        why_not="the acceptance test does not accept with probability min(1, p/q), or p and q here are not the "
        "distributions the run sampled from",
    )


def grounded_over_free(rows: list, ratio: float = 1.3) -> Verdict:
    """Prompt lookup's median best-γ speed-up on grounded tasks ≥ ``ratio`` × that on free tasks."""
    g = smol_record.summary(rows, "prompt lookup", "grounded")["median"]
    f = smol_record.summary(rows, "prompt lookup", "free")["median"]
    return claim(
        f"on SmolLM2, prompt lookup's gain is a grounded-task gain: median speed-up on grounded tasks ≥ {ratio:g}× "
        "that on free ones",
        g / f,
        at_least=ratio,
        why_not="the model's free answers repeated themselves, or its grounded answers did not copy the input",
    )
