"""Exercises of 08_system_1_context_guardrails_gateway.ipynb: the tokens a prefix cache can reuse, a guardrail's error
rates from its confusion counts, a re-measured TTFT cost of retrieved context on the learner's machine, and the
API vs self-host break-even (Huyen, ch. 9: T ≤ p × N); and of 08_system_2_agents_observability_feedback.ipynb:
the prompt tokens an agent's steps send."""

from __future__ import annotations

from course_lib.exercises import check, check_measurement
from course_lib.measure.claims import Verdict


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def reusable_tokens(prefix_tokens: int, block_size: int) -> int:
    """Prompt tokens a block-level prefix cache can skip: only full blocks are named and shared."""
    _count("prefix_tokens", prefix_tokens)
    if _count("block_size", block_size) < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    return prefix_tokens // block_size * block_size


def check_reusable_tokens(answer, prefix_tokens: int, block_size: int = 16) -> Verdict:
    """Exercise 1: how many tokens of a shared prefix of ``prefix_tokens`` a cache of ``block_size`` blocks reuses."""
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, int)):
        raise ValueError(f"answer must be an int (a number of tokens), got {answer!r}")
    return check(
        f"tokens reused of a {prefix_tokens}-token shared prefix, blocks of {block_size}",
        answer,
        reusable_tokens(prefix_tokens, block_size),
        rtol=0.0,
        hint="only FULL blocks are cached and matched: round the prefix down to a multiple of the block size.",
    )


def check_rates(answer, tp: int, fp: int, fn: int, tn: int) -> Verdict:
    """Exercise 2: (false-positive rate, false-negative rate) of a check from its confusion counts."""
    for name, v in (("tp", tp), ("fp", fp), ("fn", fn), ("tn", tn)):
        _count(name, v)
    if fp + tn == 0 or fn + tp == 0:
        raise ValueError("need at least one clean (fp + tn > 0) and one bad (tp + fn > 0) prompt")
    if answer is not None and (not isinstance(answer, (tuple, list)) or len(answer) != 2):
        raise ValueError(f"answer must be a pair (fp_rate, fn_rate), got {answer!r}")
    fpr, fnr = fp / (fp + tn), fn / (fn + tp)
    if answer is None:
        return check("(false-positive rate, false-negative rate)", None, 0.0)
    ok = check("false-positive rate", answer[0], fpr, atol=0.005, hint="false alarms ÷ all CLEAN prompts")
    return check("false-negative rate", answer[1], fnr, atol=0.005, hint="misses ÷ all BAD prompts") and ok


def check_context_ttft_ratio(answer, engine, questions, retriever, k: int = 4) -> Verdict:
    """Exercise 3 (re-measure): TTFT with ``k`` retrieved documents ÷ TTFT bare, medians over ``questions``."""
    from course_lib.system.rag import context_ttft

    def measure() -> float:
        r = context_ttft(engine, questions, retriever, k=k)
        return r["context"]["ttft_s"] / r["bare"]["ttft_s"]

    return check_measurement(
        f"TTFT with {k} documents ÷ TTFT bare",
        answer,
        measure,
        unit="x",
        hint="rag.context_ttft(engine, questions, retriever, k=4): ratio of the two 'ttft_s' medians",
    )


def check_break_even(answer, usd_per_hour: float, api_usd_per_request: float, hours_per_month: float = 730) -> Verdict:
    """Exercise 4: requests a month from which one instance rented at ``usd_per_hour`` all month (T) costs no
    more than an API charging ``api_usd_per_request`` (p): the N of T = p × N."""
    for name, v in (("usd_per_hour", usd_per_hour), ("api_usd_per_request", api_usd_per_request),
                    ("hours_per_month", hours_per_month)):  # fmt: skip
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name} must be a number > 0, got {v!r}")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (int, float))):
        raise ValueError(f"answer must be a number of requests a month, got {answer!r}")
    return check(
        "break-even requests a month (T = p × N)",
        answer,
        usd_per_hour * hours_per_month / api_usd_per_request,
        rtol=0.01,
        hint="T is the instance's MONTHLY bill (dollars per hour × hours in a month); N = T / p.",
    )


def agent_prompt_tokens(first_prompt: int, per_step: int, calls: int) -> int:
    """Tokens an agent sends over ``calls`` model calls: the first prompt, then each call adds ``per_step``
    (its own call and the tool's result) to the history that the next call sends again."""
    _count("first_prompt", first_prompt)
    _count("per_step", per_step)
    if _count("calls", calls) < 1:
        raise ValueError(f"calls must be an int >= 1, got {calls!r}")
    return calls * first_prompt + per_step * calls * (calls - 1) // 2


def check_agent_tokens(answer, first_prompt: int, per_step: int, calls: int) -> Verdict:
    """Part 2, exercise 1: the prompt tokens ``calls`` agent steps send in all, no prefix cache (section 6)."""
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, int)):
        raise ValueError(f"answer must be an int (a number of tokens), got {answer!r}")
    return check(
        f"prompt tokens sent over {calls} calls (first prompt {first_prompt}, +{per_step} per step)",
        answer,
        agent_prompt_tokens(first_prompt, per_step, calls),
        rtol=0.0,
        hint="call i (from 0) sends first_prompt + i × per_step tokens: sum them (an arithmetic series).",
    )


__all__ = [
    "agent_prompt_tokens", "check_agent_tokens", "check_break_even", "check_context_ttft_ratio", "check_rates",
    "check_reusable_tokens", "reusable_tokens",
]  # fmt: skip
