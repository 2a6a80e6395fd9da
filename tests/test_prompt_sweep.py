"""decoding.prompt_sweep: speed-up vs γ across prompts, and its verdict with a counter-example."""

import pytest

from course_lib.decoding import prompt_sweep as ps
from course_lib.decoding import verdicts


def _summary(medians, spread_frac=0.05, alpha=0.6, c=0.2):
    return [
        ps.GammaAcrossPrompts(g, (m * (1 - spread_frac), m, m * (1 + spread_frac)), alpha, c)
        for g, m in zip((1, 2, 4, 6), medians)
    ]


def test_summary_statistics():
    s = _summary([1.2, 1.4, 1.3, 1.1])
    assert [x.median for x in s] == pytest.approx([1.2, 1.4, 1.3, 1.1])
    assert s[0].spread == pytest.approx(0.05)
    assert ps.measured_best(s).gamma == 2
    assert ps.near_best_gammas(s) == [2, 4]  # 1.3·1.05 ≥ 1.4·0.95; 1.2·1.05 < 1.33
    # α 0.6, c 0.2: E/(γc+1) is 1.33, 1.40, 1.28, 1.10 at γ 1, 2, 4, 6
    assert ps.formula_best_gamma(s) == 2


def test_verdict_holds_and_fails():
    assert verdicts.formula_gamma_near_best_across_prompts(_summary([1.2, 1.4, 1.3, 1.1])).held
    # counter-example: γ=6 clearly best, tight across prompts, while the formula says 2
    assert not verdicts.formula_gamma_near_best_across_prompts(_summary([1.0, 1.1, 1.2, 1.8], 0.02)).held


def test_summarize_pools_and_refuses_mismatched_sweeps(target):
    from course_lib.engine import Engine
    from course_lib.engine.speculative import DraftProposer

    draft = Engine("tiny-draft")

    rows = ps.sweep_prompts(target, lambda: DraftProposer(draft), ["def f(x):", "class A:"], [1, 2], new_tokens=8)
    s = ps.summarize(rows)
    assert [x.gamma for x in s] == [1, 2] and all(len(x.speedups) == 2 for x in s)
    assert all(x.speedups[j] > 0 for x in s for j in range(2))  # token-identical outputs
    with pytest.raises(ValueError, match="same γs"):
        ps.summarize([rows[0], rows[1][:1]])
    with pytest.raises(ValueError, match="gammas"):
        ps.sweep_prompts(target, lambda: DraftProposer(draft), ["x"], [0], new_tokens=8)
