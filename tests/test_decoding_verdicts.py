"""Chapter 04's verdicts fed counter-examples (each must fail when its claim is false), and the modules
behind the new sections: Medusa/EAGLE accounting, transformers' assistant defaults, the sampled run and
α = 1 − TV(p, q), the recorded SmolLM2 prompt set, near-best γ, the batch formula, plot labels."""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.decoding import batch_size, head_cost, sampled, smol_record, speedup, strategies, verdicts
from course_lib.decoding.speedup import SpecRow
from course_lib.models.accounting import ModelShape

pytestmark = pytest.mark.usefixtures("one_thread")


def row(gamma=3, speedup_=1.3, alpha=0.6, c=0.2, rounds=(1.3, 1.3), identical=True, verify=1.0, **kw) -> SpecRow:
    plain = 1.0
    return SpecRow(
        method=kw.get("method", "m"),
        gamma=gamma,
        batch=1,
        new_tokens=48,
        alpha=alpha,
        effective_alpha=alpha,
        acceptance_at=[alpha] * gamma,
        tokens_per_forward=1.5,
        c=c,
        verify_over_plain=verify,
        seconds=plain / speedup_,
        plain_seconds=plain,
        identical=identical,
        mean_drafts=float(gamma),
        expected_as_proposed=1.5,
        round_speedups=tuple(rounds),
    )


def test_formula_within_fails_far_from_the_formula_and_is_noise_inside_the_spread(capsys):
    r = row()
    assert verdicts.formula_within(row(speedup_=r.predicted, rounds=(r.predicted,) * 2))
    far = row(speedup_=2 * r.predicted, rounds=(2 * r.predicted,) * 2)
    v = verdicts.formula_within(far)
    assert not v and not v.inside_noise
    assert "does not hold" in capsys.readouterr().out
    # 1.2× the formula with a ±30% spread: the ±15% threshold is inside the noise
    noisy = row(speedup_=1.2 * r.predicted, rounds=(0.9 * r.predicted, 1.5 * r.predicted))
    assert verdicts.formula_within(noisy).inside_noise
    assert not verdicts.formula_within(row(speedup_=3.0, verify=1.0, rounds=(3.0, 3.0)), refined=True)


def test_formula_gamma_near_best_fails_when_the_formula_gamma_is_clearly_slower():
    # α 0.9, c 0: the formula wants the largest γ; measured, γ=6 is clearly slowest (no spread overlap)
    rows = [row(g, s, alpha=0.9, c=0.0, rounds=(s, s)) for g, s in [(1, 1.5), (3, 1.6), (6, 1.0)]]
    assert verdicts.formula_gamma(rows) == 6
    assert speedup.near_best(rows) == [3]
    assert not verdicts.formula_gamma_near_best(rows)
    rows[-1] = row(6, 1.58, alpha=0.9, c=0.0, rounds=(1.5, 1.7))
    assert verdicts.formula_gamma_near_best(rows)


def test_speedup_at_least_needs_identical_output_and_the_goal():
    assert verdicts.speedup_at_least(row(speedup_=2.0, rounds=(2.0, 2.0)), 1.5, "s")
    assert not verdicts.speedup_at_least(row(speedup_=2.0, rounds=(2.0, 2.0), identical=False), 1.5, "s")
    assert not verdicts.speedup_at_least(row(speedup_=1.1, rounds=(1.1, 1.1)), 1.5, "s")


def test_identity_verdict_fails_on_a_count_far_from_the_overlap():
    assert verdicts.identity_holds(sampled.Identity(200, 101, 100.0, 50.0))
    assert not verdicts.identity_holds(sampled.Identity(200, 150, 100.0, 50.0))


def test_alpha_equals_one_minus_tv_on_the_engine(target):
    from course_lib.engine import Engine

    draft = Engine("tiny-draft")
    ident = sampled.alpha_tv_identity(target, draft, "def fibonacci(n):", gamma=3, rows=8, new_tokens=24)
    assert ident.judged > 20 and 0 < ident.predicted_alpha < 1
    assert abs(ident.z) < 4, ident
    # the same count against the overlap of a *different* pair must not match: the target with itself (α = 1)
    o = sampled.overlap(target, target, target.encode(["def f(x):\n    return x"])[0], [3, 4, 5], 1.0)
    assert torch.allclose(o, torch.ones(3), atol=1e-5)
    with pytest.raises(ValueError, match="rows"):
        sampled.alpha_tv_identity(target, draft, "x", rows=0)


def test_sampled_run_times_both_sides(target):
    from course_lib.engine import Engine
    from course_lib.engine.speculative import DraftProposer

    r = sampled.sampled_run(target, DraftProposer(Engine("tiny-draft")), 2, "def f(x):", 1.0, 8, 2)
    assert r.speedup > 0 and len(r.round_speedups) == 2 and 0 <= r.alpha <= 1 and r.spread >= 0
    with pytest.raises(ValueError, match="temperature"):
        sampled.sampled_run(target, None, 2, "x", 0.0)


def test_grounded_over_free_fails_when_lookup_gains_as_much_on_free_tasks():
    def r(task, kind, s):
        return {"task": task, "kind": kind, "method": "prompt lookup", "speedup": s, "alpha": 0.5}

    good = [r("g0", "grounded", 2.0), r("g1", "grounded", 1.8), r("f0", "free", 1.0)]
    assert verdicts.grounded_over_free(good)
    assert not verdicts.grounded_over_free([r("g0", "grounded", 1.1), r("f0", "free", 1.1)])
    with pytest.raises(ValueError, match="no rows"):
        smol_record.summary(good, "layer draft", "free")


def test_medusa_head_size_from_configs_matches_the_module(target):
    w = head_cost.proposer_weights(ModelShape.from_name("llama-2-7b"))
    assert 0.021 < w.medusa_share(1) < 0.023  # one D×V projection per head: ~2.2%, not "well under 1%"
    assert 0.10 < w.medusa_share(5) < 0.12
    assert 0.02 < w.eagle_share < 0.05
    from course_lib.engine.speculative.medusa import MedusaHeads

    shape = ModelShape.from_embedded("tiny-target")
    heads = MedusaHeads(target, 2)  # the course's own heads: parameters, not buffers (the frozen norm)
    assert sum(p.numel() for p in heads.parameters()) == 2 * head_cost.medusa_head_params(shape)
    assert "llama-2-7b" in head_cost.table([ModelShape.from_name("llama-2-7b")])
    with pytest.raises(ValueError, match="heads"):
        w.medusa_share(0)
    with pytest.raises(ValueError, match="ModelShape"):
        head_cost.proposer_weights("llama-2-7b")


def test_assistant_defaults_are_the_installed_versions():
    from transformers import GenerationConfig

    from course_lib.decoding import assisted

    class Fake:
        generation_config = GenerationConfig()

    d = assisted.assistant_defaults(Fake())
    g = GenerationConfig._get_default_generation_params()
    assert d == {k: g[k] for k in assisted.ASSISTANT_KEYS}
    import transformers

    if transformers.__version__.startswith("5.24"):  # the values the chapter's prose was checked against
        assert d == {
            "num_assistant_tokens": 20,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.4,
        }


def test_batch_formula_and_breakeven():
    rows = [batch_size.BatchRow(1, 1.0, 0.7, 2.0, 1.1, 3, 0.2), batch_size.BatchRow(8, 1.0, 1.2, 2.0, 2.0, 3, 0.2)]
    assert math.isclose(rows[0].predicted, 2.0 / (1.6 * 1.1))
    assert math.isclose(rows[1].predicted, 2.0 / ((8 * 3 * 0.2 + 1) * 2.0))  # a step drafts B·γ tokens
    assert batch_size.breakeven(rows) == 8
    assert batch_size.breakeven(rows[:1]) is None


def test_near_best_and_spread():
    rows = [row(1, 1.2, rounds=(1.1, 1.3)), row(2, 1.25, rounds=(1.2, 1.3)), row(3, 0.9, rounds=(0.9, 0.9))]
    assert speedup.near_best(rows) == [1, 2]
    assert math.isnan(row(rounds=(1.0,)).spread)
    assert "±" in speedup.table(rows)
    with pytest.raises(ValueError, match="rows"):
        speedup.near_best([])


def test_visible_token_labels():
    assert strategies.visible("\n") == "↵" and strategies.visible(" ") == "␣" and strategies.visible("") == "∅"
    assert strategies.visible("def f(n):\n    if") == "def f(n):↵    if"
    with pytest.raises(ValueError, match="str"):
        strategies.visible(3)


def test_recorded_prompt_set_loads_and_separates_kinds(tmp_path):
    rec = smol_record.load_record()
    assert {r["kind"] for r in rec["rows"]} == {"grounded", "free"}
    assert rec["command"].startswith(smol_record.COMMAND) and "recorded" in smol_record.label(rec)
    assert "prompt lookup" in smol_record.table(rec["rows"])
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    with pytest.raises(ValueError, match="not a recorded"):
        smol_record.load_record(bad)
    with pytest.raises(FileNotFoundError, match=smol_record.COMMAND):
        smol_record.load_record(tmp_path / "missing.json")
