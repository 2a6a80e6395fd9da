"""Chapter 04's speculative-decoding measurements (course_lib.decoding: verify, speedup, batch_size, domains,
explorer): bookkeeping, labels, the calculator; no timing asserts."""

import math

import matplotlib.pyplot as plt
import pytest

from course_lib.decoding import batch_size, domains, explorer, speedup, verify
from course_lib.decoding.prompts import GROUNDED_PROMPTS
from course_lib.engine.speculative import PromptLookupProposer, best_gamma, expected_speedup

pytestmark = pytest.mark.usefixtures("one_thread")  # target: the conftest fixture


def test_char_domains_labels_each_kind():
    src = 'def f(x):\n    """Doc."""\n    y = "s"  # note\n    return y\n'
    lab = domains.char_domains(src)
    assert len(lab) == len(src)
    assert {lab[src.index(ch)] for ch in "Doc"} == {"docstring"}
    assert lab[src.index('"s"')] == "string"
    assert lab[src.index("# note")] == "comment" and lab[src.index("note")] == "comment"
    assert lab[src.index("return")] == "code" and lab[0] == "code"
    assert domains.char_domains("x = (1,\n") == ["code"] * 8  # unfinished source: no crash
    with pytest.raises(ValueError, match="source"):
        domains.char_domains(b"x")


def test_verify_cost_and_bad_input(target):
    rows = verify.verify_cost(target, context=8, tokens=[1, 3], repeats=1)
    assert [r.tokens for r in rows] == [1, 3] and all(r.seconds > 0 for r in rows)
    assert target.backend.bytes_used() == 0  # its handle was freed
    with pytest.raises(ValueError, match="context"):
        verify.verify_cost(target, context=0)
    with pytest.raises(ValueError, match="tokens"):
        verify.verify_cost(target, tokens=[0])
    with pytest.raises(ValueError, match="fit"):
        verify.verify_cost(target, context=10**6)
    with pytest.raises(ValueError, match="repeats"):
        speedup.best_of(lambda: None, 0)


def test_run_method_counts_and_formula(target):
    base = speedup.baseline(target, GROUNDED_PROMPTS[:2], new_tokens=12, repeats=1)
    assert len(base.outputs) == 2 and all(len(o) == 12 for o in base.outputs)
    rows = speedup.gamma_sweep(target, lambda: PromptLookupProposer(2, 3), base, [2, 3], "lookup", repeats=1)
    for r in rows:
        assert r.identical and r.batch == 2 and r.new_tokens == 12
        assert 0 <= r.alpha <= 1 and 1 <= r.tokens_per_forward <= r.gamma + 1
        assert 0 <= r.mean_drafts <= r.gamma
        assert math.isclose(r.predicted, expected_speedup(r.alpha, r.gamma, max(r.c, 0.0)))
        assert set(r.as_dict()) >= {"speedup", "predicted", "predicted_refined", "alpha", "c"}
    assert speedup.best_row(rows).speedup == max(r.speedup for r in rows)
    text = speedup.table(rows)
    assert text.count("\n") == 2 and "lookup" in text
    fig, _ = speedup.plot_gamma_sweep(rows)
    plt.close(fig)
    with pytest.raises(ValueError, match="prompts"):
        speedup.baseline(target, "a string", 8)
    with pytest.raises(ValueError, match="new_tokens"):
        speedup.baseline(target, ["x"], 1)
    with pytest.raises(ValueError, match="gammas"):
        speedup.gamma_sweep(target, lambda: PromptLookupProposer(), base, [])


def test_acceptance_by_domain_of_a_model_with_itself_is_one(target):
    src = 'def f(x):\n    """Return x twice."""\n    # double it\n    return x * 2  # done\n' * 3
    agree = domains.acceptance_by_domain(target, target, [src], window=32)
    assert agree.total["code"] > 0 and agree.total["comment"] > 0 and agree.total["docstring"] > 0
    for d in domains.DOMAINS:
        assert agree.total[d] == 0 or agree.rate(d) == 1.0
    assert "docstring" in str(agree)
    with pytest.raises(ValueError, match="sources"):
        domains.acceptance_by_domain(target, target, "text")


def test_validation_sources_are_held_out():
    srcs = domains.validation_sources(2, 500)
    assert len(srcs) == 2 and all(len(s) <= 500 for s in srcs)


def test_batch_sweep_rows_and_bad_input(target):
    rows = batch_size.batch_sweep(target, lambda: PromptLookupProposer(2, 3), 2, GROUNDED_PROMPTS, [1, 3], 8, 1)
    assert [r.batch for r in rows] == [1, 3] and all(r.speedup > 0 for r in rows)
    with pytest.raises(ValueError, match="batches"):
        batch_size.batch_sweep(target, lambda: PromptLookupProposer(), 2, GROUNDED_PROMPTS, [0])


@pytest.mark.parametrize("alpha,c", [(0.0, 0.0), (0.5, 1.0), (0.99, 0.0), (0.8, 0.05)])
def test_draw_speedup_marks_the_best_gamma(alpha, c):
    fig, text = explorer.draw_speedup(alpha, c, 12)
    assert f"best γ = {best_gamma(alpha, c, 12)}" in text
    assert ("slowdown" in text) == (expected_speedup(alpha, best_gamma(alpha, c, 12), c) < 1)


def test_speedup_explorer_every_slider_end(target):
    base = speedup.baseline(target, GROUNDED_PROMPTS[:1], new_tokens=8, repeats=1)
    rows = [speedup.run_method(target, PromptLookupProposer(2, 3), 2, base, "lookup", 1)]
    widget = explorer.speedup_explorer(rows)
    sliders, out = widget.children[:-1], widget.children[-1]
    for s in sliders:
        for v in (s.min, s.max):
            s.value = v
            outs = out.outputs
            assert outs[0]["text"].startswith("α =") and "image/png" in outs[1]["data"]
