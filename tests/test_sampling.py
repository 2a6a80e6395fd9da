"""Sampling: agree with transformers' own logits processors, and draw from the right distribution."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from course_lib.engine.sampling import (
    PRESETS,
    SamplingParams,
    apply_penalties,
    apply_temperature,
    counts_from_ids,
    make_generator,
    min_p_filter,
    process_logits,
    sample_next,
    top_k_filter,
    top_p_filter,
)

SHAPES = [(1, 1), (1, 3), (2, 5), (3, 5003)]


def rand_logits(b: int, v: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * scale


def tied_logits() -> torch.Tensor:
    # Row 0: ties at the top; row 1: ties straddling rank 2/3; row 2: all equal.
    return torch.tensor(
        [[2.0, 2.0, 1.0, 0.5, 0.5, -1.0], [3.0, 1.0, 1.0, 1.0, 0.0, -2.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    )


def draw(logits_row: torch.Tensor, params: SamplingParams, n: int, seed: int = 0) -> torch.Tensor:
    """n independent draws from one row: the row repeated n times, one multinomial call."""
    return sample_next(logits_row.expand(n, -1), params, generator=make_generator(seed))  # (n,)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = logits.double().log_softmax(-1)
    return -(logp.exp() * logp).nan_to_num().sum(-1)


# --- agreement with transformers -------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("k", [1, 2, 4, 50, 10_000])
def test_top_k_matches_hf(shape, k):
    x = rand_logits(*shape, seed=k)
    torch.testing.assert_close(top_k_filter(x, k), TopKLogitsWarper(k)(None, x), rtol=0, atol=0)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_ties_match_hf_and_keep_every_tie(k):
    x = tied_logits()
    out = top_k_filter(x, k)
    torch.testing.assert_close(out, TopKLogitsWarper(k)(None, x), rtol=0, atol=0)
    kth = torch.topk(x, k, dim=-1).values[:, -1:]
    assert torch.equal(out.isfinite(), x >= kth)  # ties with the k-th value are all kept


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("p", [0.05, 0.3, 0.9, 0.99])
def test_top_p_matches_hf(shape, p):
    x = rand_logits(*shape, seed=int(p * 100))
    torch.testing.assert_close(top_p_filter(x, p), TopPLogitsWarper(p)(None, x), rtol=0, atol=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_tiny_top_p_keeps_only_the_argmax(shape):
    x = rand_logits(*shape, seed=1)
    out = top_p_filter(x, 1e-9)  # 1 - p rounds to 1 in float32: every token looks droppable
    assert torch.equal(out.isfinite(), torch.nn.functional.one_hot(x.argmax(-1), shape[1]).bool())


def test_top_p_ties_are_kept_together_and_order_free():
    x = tied_logits()
    # Row 2 is uniform over 6: p = 0.5 needs 3 tokens, but all 6 tie, so all are kept.
    assert top_p_filter(x, 0.5)[2].isfinite().all()
    # Row 1: the top token holds < 0.9 of the mass, the next three tie, so all three join it.
    out = top_p_filter(x, 0.9)
    assert out[1].isfinite().tolist() == [True, True, True, True, False, False]
    # Permuting the vocabulary permutes the result: no dependence on sort order among ties.
    perm = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(0))
    for p in (0.2, 0.5, 0.9):
        assert torch.equal(top_p_filter(x[:, perm], p), top_p_filter(x, p)[:, perm])


def test_exact_boundaries_keep_the_token_that_reaches_them():
    x = torch.tensor([[0.0, -math.log(2), -2 * math.log(2), -2 * math.log(2)]])  # probs exactly 1/2, 1/4, 1/8, 1/8
    expect = [True, True, False, False]
    assert top_p_filter(x, 0.75).isfinite()[0].tolist() == expect  # 1/2 + 1/4 reaches p = 0.75 exactly
    assert min_p_filter(x, 0.5).isfinite()[0].tolist() == expect  # 1/4 == 0.5 · 1/2 is not below the cut
    torch.testing.assert_close(top_p_filter(x, 0.75), TopPLogitsWarper(0.75)(None, x), rtol=0, atol=0)
    torch.testing.assert_close(min_p_filter(x, 0.5), MinPLogitsWarper(0.5)(None, x), rtol=0, atol=0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("t", [0.05, 0.7, 1.0, 3.0])
def test_temperature_matches_hf(shape, t):
    x = rand_logits(*shape)
    torch.testing.assert_close(apply_temperature(x, t), TemperatureLogitsWarper(t)(None, x))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.5, 0.99])
def test_min_p_matches_hf(shape, min_p):
    x = rand_logits(*shape, seed=3)
    torch.testing.assert_close(min_p_filter(x, min_p), MinPLogitsWarper(min_p)(None, x), rtol=0, atol=0)
    assert min_p_filter(tied_logits(), 0.99).isfinite().sum(-1).tolist() == [2, 1, 6]  # ties at the top kept


@pytest.mark.parametrize("shape", [(1, 1), (1, 3), (2, 5), (3, 5003)])
@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_matches_hf(shape, penalty):
    b, v = shape
    x = rand_logits(b, v, seed=7)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, v, (b, 6), generator=gen)  # repeats are likely for small V
    output = torch.randint(0, v, (b, 4), generator=gen)
    params = SamplingParams(repetition_penalty=penalty)
    ours = apply_penalties(x, params, counts_from_ids(prompt, v), counts_from_ids(output, v))
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(torch.cat([prompt, output], dim=1), x.clone())
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_logits_are_upcast(dtype):
    x = rand_logits(2, 37).to(dtype)
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, min_p=0.05)
    out = process_logits(x, params)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, process_logits(x.float(), params), rtol=0, atol=0)
    assert sample_next(x, params, generator=make_generator(0)).dtype == torch.int64


def test_filters_do_not_modify_input():
    x = rand_logits(2, 20)
    before = x.clone()
    params = SamplingParams(
        temperature=0.5,
        top_k=3,
        top_p=0.5,
        min_p=0.1,
        repetition_penalty=1.5,
        presence_penalty=1.0,
        frequency_penalty=0.5,
    )
    counts = torch.ones(2, 20, dtype=torch.int64)
    process_logits(x, params, counts, counts)
    assert torch.equal(x, before)


# --- statistics of the draws -----------------------------------------------------------------------


def test_top_k_never_emits_outside_the_k():
    x = rand_logits(1, 50, seed=11, scale=1.0)  # flat-ish, so the tail would be drawn often without top-k
    tokens = draw(x, SamplingParams(temperature=1.0, top_k=5), n=4000)
    top5 = set(torch.topk(x[0], 5).indices.tolist())
    assert set(tokens.tolist()) == top5  # all of the k appear, nothing else does


def test_top_p_keeps_the_smallest_prefix_and_emits_only_it():
    x = rand_logits(1, 200, seed=5, scale=1.5)
    p = 0.8
    kept = top_p_filter(x, p)[0].isfinite()
    probs = x[0].double().softmax(-1)
    order = probs.argsort(descending=True)
    n = int(kept.sum())
    assert kept[order[:n]].all() and not kept[order[n:]].any()  # a prefix of the ranking
    assert probs[order[:n]].sum() >= p - 1e-6  # reaches p ...
    assert probs[order[: n - 1]].sum() < p + 1e-6  # ... and one token fewer would not
    tokens = draw(x, SamplingParams(temperature=1.0, top_p=p), n=4000)
    assert kept[tokens].all()
    # Every emitted token is in the nucleus, so the probability mass of the emitted set is ≤ the kept mass.
    emitted = torch.zeros_like(kept)
    emitted[tokens] = True
    assert probs[emitted].sum() <= probs[kept].sum() + 1e-9


def test_empirical_frequencies_match_softmax_chi_square():
    x = torch.tensor([[1.0, 0.5, 0.0, -0.5, -1.0, 2.0]])
    n = 20_000
    tokens = draw(x, SamplingParams(temperature=1.0), n=n, seed=123)
    observed = torch.bincount(tokens, minlength=6).double()
    expected = x[0].double().softmax(-1) * n
    chi2 = ((observed - expected) ** 2 / expected).sum().item()
    assert chi2 < 20.52, f"chi-square {chi2:.2f} over the 0.1% critical value for 5 degrees of freedom"


def test_filtered_frequencies_match_renormalised_softmax():
    x = torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]])
    params = SamplingParams(temperature=0.7, top_k=4)
    n = 20_000
    tokens = draw(x, params, n=n, seed=7)
    observed = torch.bincount(tokens, minlength=6).double()
    probs = (x[0, :4].double() / 0.7).softmax(-1)
    assert observed[4:].sum() == 0
    chi2 = ((observed[:4] - probs * n) ** 2 / (probs * n)).sum().item()
    assert chi2 < 16.27, f"chi-square {chi2:.2f} over the 0.1% critical value for 3 degrees of freedom"


def test_low_temperature_approaches_argmax():
    x = rand_logits(4, 100, seed=2)
    top_prob = [apply_temperature(x, t).softmax(-1).amax(-1) for t in (1.0, 0.3, 0.1, 0.01)]
    for hotter, colder in zip(top_prob, top_prob[1:]):
        assert (colder >= hotter).all()
    assert (top_prob[-1] > 0.99).all()
    tokens = sample_next(x, SamplingParams(temperature=0.01), generator=make_generator(0))
    assert torch.equal(tokens, x.argmax(-1))


def test_high_temperature_flattens():
    x = rand_logits(3, 100, seed=4)
    ent = [entropy(apply_temperature(x, t)) for t in (0.5, 1.0, 2.0, 10.0, 1000.0)]
    for colder, hotter in zip(ent, ent[1:]):
        assert (hotter > colder).all()
    assert torch.allclose(ent[-1], torch.full((3,), math.log(100), dtype=torch.float64), atol=1e-3)


# --- penalties --------------------------------------------------------------------------------------


def test_presence_and_frequency_touch_only_output_tokens():
    x = torch.zeros(1, 5)
    out = torch.tensor([[0, 1, 3, 0, 0]])
    prompt = torch.tensor([[0, 0, 0, 4, 0]])  # prompt tokens are not penalised by presence/frequency
    pres = apply_penalties(x, SamplingParams(presence_penalty=0.5), prompt, out)
    freq = apply_penalties(x, SamplingParams(frequency_penalty=0.5), prompt, out)
    both = apply_penalties(x, SamplingParams(presence_penalty=0.5, frequency_penalty=0.5), prompt, out)
    assert pres.tolist() == [[0.0, -0.5, -0.5, 0.0, 0.0]]  # once per token, whatever the count
    assert freq.tolist() == [[0.0, -0.5, -1.5, 0.0, 0.0]]  # proportional to the count
    assert both.tolist() == [[0.0, -1.0, -2.0, 0.0, 0.0]]
    neg = apply_penalties(x, SamplingParams(presence_penalty=-1.0), prompt, out)
    assert neg.tolist() == [[0.0, 1.0, 1.0, 0.0, 0.0]]  # negative values encourage repeats


def test_repetition_penalty_sign_handling():
    x = torch.tensor([[2.0, -2.0, 0.0, 4.0, -4.0]])
    prompt = torch.tensor([[1, 1, 1, 0, 0]])
    out = torch.tensor([[0, 0, 0, 0, 2]])
    discourage = apply_penalties(x, SamplingParams(repetition_penalty=2.0), prompt, out)
    assert discourage.tolist() == [[1.0, -4.0, 0.0, 4.0, -8.0]]  # both signs move down; unseen token 3 kept
    encourage = apply_penalties(x, SamplingParams(repetition_penalty=0.5), prompt, out)
    assert encourage.tolist() == [[4.0, -1.0, 0.0, 4.0, -2.0]]
    # Prompt counts alone are enough on the first step.
    assert apply_penalties(x, SamplingParams(repetition_penalty=2.0), prompt).tolist() == [[1.0, -4.0, 0.0, 4.0, -4.0]]


def test_penalties_change_the_greedy_choice():
    x = torch.tensor([[3.0, 2.9, 1.0]])
    out = torch.tensor([[2, 0, 0]])
    assert sample_next(x, SamplingParams()).tolist() == [0]
    assert sample_next(x, SamplingParams(frequency_penalty=0.1), output_counts=out).tolist() == [1]
    assert sample_next(x, SamplingParams(repetition_penalty=1.1), output_counts=out).tolist() == [1]


def test_counts_from_ids():
    ids = torch.tensor([[1, 1, 2, 0, 0], [3, 3, 3, 0, 0]])
    assert counts_from_ids(ids, 4).tolist() == [[2, 2, 1, 0], [2, 0, 0, 3]]
    assert counts_from_ids(ids, 4, pad_id=0).tolist() == [[0, 2, 1, 0], [0, 0, 0, 3]]
    padded = torch.tensor([[2, -1, -1]])
    assert counts_from_ids(padded, 3, pad_id=-1).tolist() == [[0, 0, 1]]
    assert counts_from_ids(torch.zeros(2, 0, dtype=torch.long), 3).tolist() == [[0, 0, 0], [0, 0, 0]]


@torch.no_grad()
def test_greedy_decode_with_repetition_penalty_matches_hf_generate():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(cfg).eval()
    prompt = torch.tensor([[5, 9, 5, 17, 9], [3, 3, 3, 4, 60]])  # (B, T)

    def ours(params: SamplingParams) -> torch.Tensor:
        ids, prompt_counts = prompt, counts_from_ids(prompt, cfg.vocab_size)  # (B, V)
        output_counts = torch.zeros_like(prompt_counts)  # (B, V)
        for _ in range(params.max_new_tokens):
            logits = model(ids).logits[:, -1]  # (B, V)
            nxt = sample_next(logits, params, prompt_counts=prompt_counts, output_counts=output_counts)  # (B,)
            output_counts[torch.arange(len(nxt)), nxt] += 1
            ids = torch.cat([ids, nxt[:, None]], dim=1)
        return ids

    theirs = model.generate(
        prompt, max_new_tokens=8, do_sample=False, repetition_penalty=1.5, pad_token_id=0, eos_token_id=None
    )
    penalised = ours(SamplingParams(repetition_penalty=1.5, max_new_tokens=8))
    assert torch.equal(penalised, theirs)
    assert not torch.equal(penalised, ours(SamplingParams(max_new_tokens=8)))  # the penalty mattered


# --- greedy, seeds, presets -------------------------------------------------------------------------


def test_greedy_is_argmax_and_first_index_on_ties():
    x = tied_logits()
    assert sample_next(x, SamplingParams()).tolist() == [0, 0, 0]
    assert torch.equal(process_logits(x, SamplingParams(top_k=1)), x)  # greedy skips the filters


def test_seeded_reproducibility():
    x = rand_logits(8, 1000, seed=9, scale=0.5)
    params = SamplingParams.from_name("creative", seed=42)

    def run(seed: int) -> list[list[int]]:
        gen = make_generator(seed)
        return [sample_next(x, params, generator=gen).tolist() for _ in range(3)]

    first = run(42)
    assert first == run(42)
    assert first != run(43)
    assert first[0] != first[1]  # one generator per request: successive steps do not replay draws


def test_presets():
    assert SamplingParams.from_name("greedy").greedy
    assert not SamplingParams.from_name(" Creative ").greedy
    assert SamplingParams.from_name("precise", max_new_tokens=5).max_new_tokens == 5
    assert set(PRESETS) >= {"greedy", "precise", "creative"}
    with pytest.raises(ValueError, match="unknown sampling preset 'wild'.*valid"):
        SamplingParams.from_name("wild")
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().temperature = 1.0  # type: ignore[misc]


# --- bad inputs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature="hot"), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.0), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.01), "top_p"),
        (dict(min_p=1.0), "min_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(repetition_penalty=float("inf")), "repetition_penalty"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3.0), "frequency_penalty"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=1.5), "max_new_tokens"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.0), "seed"),
        (dict(ignore_eos=1), "ignore_eos"),
        (dict(num_beams=0), "num_beams"),
        (dict(num_beams=4, temperature=0.7), "num_beams"),
        (dict(length_penalty=float("nan")), "length_penalty"),
    ],
)
def test_params_reject_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}( must|=)"):
        SamplingParams(**kwargs)


def test_params_accept_edges():
    SamplingParams(temperature=2, top_k=1, top_p=1, min_p=0.0, presence_penalty=-2, frequency_penalty=2, seed=0)
    assert SamplingParams(num_beams=4, length_penalty=-1.0).greedy


def test_tensor_functions_reject_bad_inputs():
    x = rand_logits(2, 5)
    with pytest.raises(ValueError, match=r"logits must have shape \(B, V\)"):
        top_k_filter(x[0], 2)
    with pytest.raises(ValueError, match=r"logits must have shape \(B, V\)"):
        top_p_filter(torch.zeros(2, 0), 0.5)
    with pytest.raises(ValueError, match="logits must be a floating tensor"):
        min_p_filter(torch.ones(2, 5, dtype=torch.long), 0.1)
    with pytest.raises(ValueError, match="logits must be a torch.Tensor"):
        apply_temperature([[1.0, 2.0]], 1.0)
    with pytest.raises(ValueError, match="temperature must be a finite float > 0"):
        apply_temperature(x, 0.0)
    with pytest.raises(ValueError, match="top_k must be an int"):
        top_k_filter(x, -2)
    with pytest.raises(ValueError, match=r"top_p must be a float in \(0, 1\]"):
        top_p_filter(x, 0.0)
    with pytest.raises(ValueError, match=r"min_p must be a float in \[0, 1\)"):
        min_p_filter(x, 1.0)
    with pytest.raises(ValueError, match="params must be a SamplingParams"):
        process_logits(x, {"temperature": 1.0})


def test_penalty_inputs_are_checked():
    x = rand_logits(2, 5)
    good = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="repetition_penalty=1.2 needs prompt_counts"):
        apply_penalties(x, SamplingParams(repetition_penalty=1.2))
    with pytest.raises(ValueError, match="need output_counts"):
        apply_penalties(x, SamplingParams(presence_penalty=0.5), prompt_counts=good)
    with pytest.raises(ValueError, match=r"output_counts must have the logits' shape \(2, 5\)"):
        apply_penalties(x, SamplingParams(frequency_penalty=0.5), output_counts=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="prompt_counts must hold integer occurrence counts"):
        apply_penalties(x, SamplingParams(repetition_penalty=1.2), prompt_counts=good.float())
    with pytest.raises(ValueError, match=r"ids must lie in \[0, vocab_size=4\)"):
        counts_from_ids(torch.tensor([[0, 4]]), 4)
    with pytest.raises(ValueError, match=r"ids must be a \(B, T\) integer"):
        counts_from_ids(torch.tensor([0, 1]), 4)
    with pytest.raises(ValueError, match="vocab_size must be an int"):
        counts_from_ids(torch.tensor([[0, 1]]), 0)


def test_seed_without_generator_and_bad_seed():
    x = rand_logits(1, 5)
    with pytest.raises(ValueError, match=r"params.seed=3 is set but no generator was passed.*make_generator"):
        sample_next(x, SamplingParams(temperature=1.0, seed=3))
    with pytest.raises(ValueError, match="seed must be an int"):
        make_generator(-5)
    assert sample_next(x, SamplingParams(seed=3)).shape == (1,)  # greedy needs no generator
