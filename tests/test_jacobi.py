"""Jacobi and lookahead decoding (course_lib.engine.speculative.jacobi; course_lib.decoding.convergence, .jacobi_speed):
greedy identity, window shifts, n-gram pool, trace, measurement."""

import math

import pytest
from matplotlib.figure import Figure

from course_lib.decoding.convergence import jacobi_trace, plot_jacobi_trace
from course_lib.decoding.jacobi_speed import CODE_PROMPT, format_table, measure_jacobi
from course_lib.engine import SamplingParams
from course_lib.engine.speculative import SpeculativeDecoder, Verified
from course_lib.engine.speculative.jacobi import JacobiProposer, LookaheadProposer

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n", CODE_PROMPT]


pytestmark = pytest.mark.usefixtures("one_thread")  # target: the conftest fixture


@pytest.fixture(scope="module")
def reference(target):
    ids = target.encode(PROMPTS)
    return ids, [r.output_ids for r in target.generate(ids, SamplingParams(max_new_tokens=24, ignore_eos=True))]


def _run(target, proposer, ids, gamma, n=24):
    return SpeculativeDecoder(target, proposer, gamma).generate(ids, SamplingParams(ignore_eos=True), max_new_tokens=n)


# ---------------------------------------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("window,init", [(1, "repeat"), (4, "pad"), (3, "random")])
def test_jacobi_greedy_identity_single_row(target, reference, window, init):
    ids, ref = reference
    kw = {"vocab_size": target.model.vocab_size} if init == "random" else {}
    out = _run(target, JacobiProposer(window, init, **kw), ids[-1:], window)
    assert out[0].output_ids == ref[-1]
    assert out.stats.target_forwards <= 24 and out.stats.tokens_per_forward >= 1.0
    assert out[0].kv_length == len(out[0].prompt_ids) + len(out[0].output_ids) - 1


def test_jacobi_greedy_identity_batched(target, reference):
    ids, ref = reference
    out = _run(target, JacobiProposer(4), ids, 4)
    assert [r.output_ids for r in out] == ref
    assert all(r.kv_length == len(r.prompt_ids) + len(r.output_ids) - 1 for r in out)


def test_lookahead_greedy_identity_batched(target, reference):
    ids, ref = reference
    prop = LookaheadProposer(window=4, ngram=3, pool_size=4)
    out = _run(target, prop, ids, 4)
    assert [r.output_ids for r in out] == ref
    assert prop.pool_proposals > 0  # the pool was used, and the output did not change
    assert not prop._rows and not prop._pools  # every row released


def test_eos_and_short_rows_keep_identity(target):
    """EOS honoured and rows of different lengths: the window is cut to what a row may still emit."""
    ids = target.encode(PROMPTS[:2])
    params = [SamplingParams(max_new_tokens=5), SamplingParams(max_new_tokens=17)]
    ref = [r.output_ids for r in target.generate(ids, params)]
    out = SpeculativeDecoder(target, JacobiProposer(8), 8).generate(ids, params)
    assert [r.output_ids for r in out] == ref


# ---------------------------------------------------------------------------------------------- window logic


def test_window_shift_on_synthetic_verified():
    prop = JacobiProposer(4)
    [p] = prop.propose_batch(["r"], [[10, 11, 12]], [4], [SamplingParams()], [None])
    assert p.tokens == [12, 12, 12, 12]  # "repeat": the context's last token
    # all 4 verified, 1 accepted: drop it and the correction (21); keep the new guesses, pad by repeating
    prop.observe("r", Verified(drafts=[12, 12, 12, 12], accepted=1, argmax=[12, 21, 22, 23, 24]))
    assert prop.window_of("r") == [22, 23, 24, 24]
    # only 2 of the 4 verified (the row was near its end): the unverified old guess at slot 3 stays
    prop.observe("r", Verified(drafts=[22, 23], accepted=0, argmax=[30, 31, 32]))
    assert prop.window_of("r") == [31, 32, 24, 24]
    # everything accepted: the bonus is emitted, the guess after it opens the next window
    prop.observe("r", Verified(drafts=[31, 32, 24, 24], accepted=4, argmax=[31, 32, 24, 24, 40]))
    assert prop.window_of("r") == [40, 40, 40, 40]
    [p] = prop.propose_batch(["r"], [[1, 2]], [3], [SamplingParams()], [None])
    assert p.tokens == [40, 40, 40]  # at most k
    prop.release("r")
    assert "r" not in prop._rows


def test_init_rules():
    pad = JacobiProposer(3, "pad", pad_id=7)
    assert pad.initial_window([1, 2]) == [7, 7, 7]
    pad.propose_batch(["r"], [[1, 2]], [3], [SamplingParams()], [None])
    pad.observe("r", Verified(drafts=[7, 7, 7], accepted=0, argmax=[5, 6, 7, 8]))
    assert pad.window_of("r") == [6, 7, 8]
    pad.observe("r", Verified(drafts=[6, 7, 8], accepted=2, argmax=[6, 7, 9, 10]))
    assert pad.window_of("r") == [10, 7, 7]
    a, b = JacobiProposer(5, "random", vocab_size=50, seed=3), JacobiProposer(5, "random", vocab_size=50, seed=3)
    wa = a.initial_window([1])
    assert wa == b.initial_window([1]) and all(0 <= t < 50 for t in wa)
    a.reset()
    assert a.initial_window([1]) == wa  # reset reseeds
    assert JacobiProposer(2).propose([4, 9], 5) == [9, 9]


def test_lookahead_pool_chains_along_the_trajectory():
    """Every token of a harvested n-gram is the target's answer right after the token before it."""
    prop = LookaheadProposer(window=2, ngram=3, pool_size=2)
    ctx = [1, 2, 5]  # pending 5 at position 2
    [p] = prop.propose_batch(["r"], [ctx], [2], [SamplingParams()], [None])
    assert p.tokens == [5, 5]  # empty pool: the Jacobi window
    # fed 5, 5, 5 at positions 2, 3, 4; answers 6, 5, 9. Position 3 was fed 5 and position 2 answered 5?
    # No (it answered 6), so no 3-gram ends at 3; position 4 fed 5, position 3 answered 5: (5, 5, 9).
    prop.observe("r", Verified(drafts=[5, 5], accepted=0, argmax=[6, 5, 9]))
    assert prop.pool_of("r") == {5: [(5, 9)]}
    assert prop.window_of("r") == [5, 9]
    # pending 6 at position 3: no 6 in the pool → the Jacobi guesses. Harvest, reaching back one forward:
    # (5, 6, 5) [position 2 answered 6 last forward], (6, 5, 9), (5, 9, 3); key 5 holds 2: (5, 9) goes
    [p] = prop.propose_batch(["r"], [ctx + [6]], [2], [SamplingParams()], [None])
    assert p.tokens == [5, 9] and prop.pool_proposals == 0
    prop.observe("r", Verified(drafts=[5, 9], accepted=2, argmax=[5, 9, 3]))
    assert prop.pool_of("r") == {5: [(6, 5), (9, 3)], 6: [(5, 9)]}
    assert prop.window_of("r") == [3, 3]
    # pending 6 again: the pool's continuation replaces the Jacobi guesses
    [p] = prop.propose_batch(["r"], [ctx + [6, 5, 9, 3, 6]], [2], [SamplingParams()], [None])
    assert p.tokens == [5, 9] and prop.pool_proposals == 1
    assert prop.best("r", 6) == (5, 9) and prop.best("r", 42) is None
    assert prop.best("r", 5) == (9, 3)  # both seen once: the most recent
    prop._add("r", (5, 6, 5))
    assert prop.best("r", 5) == (6, 5)  # seen twice: the most frequent
    prop._add("r", (5, 9, 3))
    assert prop.best("r", 5) == (9, 3)  # twice each: the most recent again
    prop._add("r", (5, 6, 6))  # a third continuation of 5: the least recently seen one goes
    assert prop.pool_of("r")[5] == [(9, 3), (6, 6)]


# ---------------------------------------------------------------------------------------------- trace


def test_trace_bookkeeping(target, reference):
    ids, ref = reference
    tr = jacobi_trace(target, ids[-1], 24, window=4)
    assert tr.output_ids == ref[-1]
    n = len(tr.output_ids)
    assert len(tr.converged_at) == len(tr.emitted_at) == n
    assert all(1 <= c <= e <= tr.forwards for c, e in zip(tr.converged_at, tr.emitted_at))
    assert tr.emitted_at == sorted(tr.emitted_at) and tr.emitted_at[-1] == tr.forwards
    assert sum(a + 1 for a in tr.accepted) == n  # every forward emits its accepted drafts + one
    assert tr.start[0] == 0 and all(len(d) <= 4 for d in tr.drafts)
    assert tr.tokens_per_forward >= 1.0
    g = tr.grid()
    assert g.shape == (tr.forwards, n) and (g == 3).sum() == n
    fig = plot_jacobi_trace(tr)
    assert isinstance(fig, Figure)


# ---------------------------------------------------------------------------------------------- measurement


def test_measure_jacobi_small(target):
    rows = measure_jacobi(target, ["def f(x):"], max_new_tokens=8, windows=(2,), repeats=1)
    assert [r["method"] for r in rows] == ["plain", "jacobi W=2", "lookahead W=4 n=4"]
    assert all(r["identical"] and r["tokens_per_forward"] >= 1.0 and r["time_s"] > 0 for r in rows)
    assert rows[0]["forwards"] == 8 and math.isnan(rows[0]["acceptance"])
    assert "tok/fwd" in format_table(rows)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_bad_window(bad):
    with pytest.raises(ValueError, match=r"window .*int ≥ 1"):
        JacobiProposer(bad)
    with pytest.raises(ValueError, match=r"window .*int ≥ 1"):
        LookaheadProposer(bad)


def test_bad_lookahead_arguments(target):
    for bad in (0, 1, -2, 2.0):
        with pytest.raises(ValueError, match=r"ngram .*int ≥ 2"):
            LookaheadProposer(4, ngram=bad)
    for bad in (0, -1, "8"):
        with pytest.raises(ValueError, match=r"pool_size .*int ≥ 1"):
            LookaheadProposer(4, pool_size=bad)
    with pytest.raises(ValueError, match=r"init must be one of"):
        JacobiProposer(2, init="zeros")
    with pytest.raises(ValueError, match=r"vocab_size"):
        JacobiProposer(2, init="random")
    with pytest.raises(ValueError, match=r"pad_id"):
        JacobiProposer(2, init="pad", pad_id=-1)
    with pytest.raises(ValueError, match=r"window .*int ≥ 1"):
        jacobi_trace(target, "def f():", 4, window=0)
    with pytest.raises(ValueError, match=r"vocabularies"):
        SpeculativeDecoder(target, JacobiProposer(2, "random", vocab_size=17), 2)
