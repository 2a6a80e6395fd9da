"""Exercises of 04_decoding.ipynb: tokens per target forward, the best γ, a re-measured prompt-lookup
speed-up, and the batch at which verifying drafts stops being free on the learner's own ridge point."""

from __future__ import annotations

import math

from course_lib.engine.speculative.theory import best_gamma, expected_tokens
from course_lib.exercises import check, check_measurement
from course_lib.measure.claims import Verdict


def check_expected_tokens(answer, alpha: float = 0.8, gamma: int = 4) -> Verdict:
    """Exercise 1: E[tokens per target forward] with acceptance rate α and γ drafts."""
    return check(
        f"tokens per target forward at α={alpha}, γ={gamma}",
        answer,
        expected_tokens(alpha, gamma),
        rtol=0.01,
        hint="1 + α + α² + … + α^γ: draft j survives only if drafts 1..j all do; +1 for the correction/bonus token.",
    )


def check_best_gamma(answer, alpha: float = 0.7, c: float = 0.1, max_gamma: int = 16) -> Verdict:
    """Exercise 2: the γ with the highest expected speed-up for α and c."""
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, int)):
        raise ValueError(f"answer must be an int (a number of draft tokens), got {answer!r}")
    return check(
        f"best γ at α={alpha}, c={c}",
        answer,
        best_gamma(alpha, c, max_gamma),
        rtol=0.0,
        hint="evaluate (1 − α^(γ+1)) / ((1 − α)(γc + 1)) for γ = 1, 2, 3, … and take the largest.",
    )


def check_lookup_speedup(answer, target, prompt: str, gamma: int = 4, new_tokens: int = 48) -> Verdict:
    """Exercise 3 (re-measure): prompt lookup's speed-up over plain greedy on ``prompt``."""
    from course_lib.decoding import speedup
    from course_lib.engine.speculative.prompt_lookup import PromptLookupProposer

    def measure() -> float:
        base = speedup.baseline(target, [prompt], new_tokens, repeats=3)
        return speedup.run_method(target, PromptLookupProposer(2, 4), gamma, base, repeats=3).speedup

    return check_measurement(
        f"prompt lookup's speed-up at γ={gamma}",
        answer,
        measure,
        unit="x",
        hint="speedup.run_method(target, PromptLookupProposer(2, 4), 4, speedup.baseline(...)).speedup",
    )


def check_ridge_batch(answer, ridge: float, gamma: int = 4) -> Verdict:
    """Exercise 4 (your peaks): the largest batch whose verify forward (batch·(γ+1) tokens, fp32 weights:
    2 FLOPs per 4-byte weight per token) stays below the ridge point."""
    if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not math.isfinite(ridge) or ridge <= 0:
        raise ValueError(f"ridge must be a positive number of FLOP/byte, got {ridge!r}")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, int)):
        raise ValueError(f"answer must be an int (a batch size), got {answer!r}")
    expected = math.floor(2 * ridge / (gamma + 1))
    return check(
        f"largest batch below your ridge point at γ={gamma}",
        answer,
        expected,
        rtol=0.0,
        atol=1.0,
        hint="intensity of a forward over N tokens ≈ 2N FLOPs / 4 bytes per weight = N/2; solve B·(γ+1)/2 ≤ ridge.",
    )
