"""Chapter 04's decoding measurements: diversity, repetition, log-likelihood and cut-offs, on known inputs."""

import math

import pytest
import torch

from course_lib.decoding import strategies as d
from course_lib.engine import Engine
from course_lib.engine.sampling import SamplingParams


def test_distinct_and_repetition_on_known_sequences():
    assert d.distinct_n([[1, 2, 3, 4]], 2) == 1.0
    assert d.distinct_n([[1, 2, 1, 2, 1, 2]], 2) == pytest.approx(2 / 5)
    assert d.distinct_n([[5]], 2) == 0.0
    assert d.repetition_rate([1, 2, 3, 1, 2, 3, 1, 2, 3], n=3) == pytest.approx(4 / 7)
    assert d.repetition_rate([1, 2, 3, 4, 5], n=2) == 0.0
    with pytest.raises(ValueError, match="n must be"):
        d.distinct_n([[1, 2]], 0)
    with pytest.raises(ValueError, match="seqs must be"):
        d.distinct_n("abc", 2)


def test_cutoffs_and_temperature_on_a_known_distribution():
    probs = torch.tensor([0.5, 0.25, 0.125, 0.075, 0.05])
    rows = {c.name: c for c in d.cutoffs(probs, top_ks=(1, 3), top_ps=(0.7, 0.9))}
    assert rows["top-k 1"].kept == 1 and rows["top-k 1"].mass == pytest.approx(0.5)
    assert rows["top-k 3"].mass == pytest.approx(0.875)
    assert rows["top-p 0.7"].kept == 2 and rows["top-p 0.9"].kept == 4  # smallest set with mass >= p
    hot, cold = d.tempered(probs, 2.0), d.tempered(probs, 0.5)
    assert hot.max() < probs.max() < cold.max()  # T > 1 flattens, T < 1 sharpens
    assert math.isclose(float(hot.sum()), 1.0, rel_tol=1e-5)
    with pytest.raises(ValueError, match="probability vector"):
        d.cutoffs(torch.tensor([0.5, 0.6]))


def test_logprob_beam_vs_greedy_and_strategies():
    eng = Engine("tiny-target")
    prompt = eng.tokenizer("import os\n")["input_ids"]
    greedy = eng.generate([prompt], SamplingParams(max_new_tokens=16, ignore_eos=True))[0].output_ids
    beam = eng.beam_search(prompt, 4, 16, ignore_eos=True)
    assert d.sequence_logprob(eng, prompt, beam) >= d.sequence_logprob(eng, prompt, greedy) - 1e-4
    lp = d.sequence_logprob(eng, prompt, greedy)
    assert d.perplexity_of(eng, prompt, greedy) == pytest.approx(math.exp(-lp / len(greedy)), rel=1e-5)
    rows = d.run_strategies(
        eng,
        [prompt, eng.tokenizer("class Foo:")["input_ids"]],
        {
            "greedy": SamplingParams(max_new_tokens=24, ignore_eos=True),
            "T=1.5": SamplingParams(temperature=1.5, max_new_tokens=24, ignore_eos=True, seed=0),
        },
    )
    greedy_row, hot_row = rows
    assert hot_row.distinct2 > greedy_row.distinct2 and hot_row.perplexity > greedy_row.perplexity
    with pytest.raises(ValueError, match="at least one token"):
        d.sequence_logprob(eng, prompt, [])
