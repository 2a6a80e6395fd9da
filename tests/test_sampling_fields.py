"""The engine's request fields behind the server's OpenAI ones: n samples forked from one prefill (shared,
copy-on-write KV on the paged backend), raw log-probs, logit bias, min_tokens, max_new_tokens=None."""

import math

import pytest
import torch

from course_lib.engine import Engine, SamplingParams, SchedulerConfig
from course_lib.engine.parallel_sampling import sample_ids

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def target():
    return Engine("tiny-target")


@pytest.fixture(scope="module")
def paged(target):
    return Engine(target.hf_model, target.tokenizer, kv_cache="paged", block_size=4)


def run(engine, prompt, params, request_id="r"):
    """Drive add_request/step; the token ids of every sample, by sequence id, and the events."""
    engine.add_request(prompt, params, request_id=request_id)
    out, events = {}, []
    while engine.has_unfinished():
        for ev in engine.step():
            out.setdefault(ev.request, []).append(ev.token_id)
            events.append(ev)
    return out, events


@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_n_samples_fork_and_equal_their_seeded_runs(target, paged, kv):
    engine = target if kv == "contiguous" else paged
    params = SamplingParams(temperature=1.0, seed=7, max_new_tokens=12, ignore_eos=True, n=3)
    out, _ = run(engine, PROMPT, params)
    ids = sample_ids("r", 3)
    assert sorted(out) == sorted(ids) and all(len(out[i]) == 12 for i in ids)
    alone = [run(engine, PROMPT, SamplingParams(temperature=1.0, seed=7 + j, max_new_tokens=12, ignore_eos=True))[0]["r"]
             for j in range(3)]  # fmt: skip
    assert [out[i] for i in ids] == alone  # sample j draws with seed + j, from the shared prefill
    assert len({tuple(a) for a in alone}) == 3
    assert engine.backend.bytes_used() == 0 and not engine.has_unfinished()


def test_paged_fork_shares_the_prompt_blocks_copy_on_write(paged):
    prompt = list(range(10, 50))  # 40 tokens = 10 blocks of 4
    blocks = paged.backend.blocks
    paged.add_request(prompt, SamplingParams(temperature=1.0, seed=1, max_new_tokens=6, ignore_eos=True, n=4), "c")
    paged.step()  # the prefill, then the fork: 4 sequences on one copy of the prompt
    assert len(paged.scheduler.running) == 4
    assert blocks.num_used == 10  # not 40
    paged.step()  # each sample writes its own token: the last shared block is full, so only new blocks
    assert blocks.num_used == 10 + 4
    paged.abort("c")  # aborts every sample
    assert not paged.has_unfinished() and paged.backend.bytes_used() == 0
    blocks.check_no_leaks()


def test_fork_falls_back_to_independent_requests_without_room(target):
    small = Engine(target.hf_model, target.tokenizer, config=SchedulerConfig(max_num_seqs=2))
    params = SamplingParams(temperature=1.0, seed=3, max_new_tokens=5, ignore_eos=True, n=3)
    out, _ = run(small, PROMPT, params)
    alone = [run(target, PROMPT, SamplingParams(temperature=1.0, seed=3 + j, max_new_tokens=5, ignore_eos=True))[0]["r"]
             for j in range(3)]  # fmt: skip
    assert [out[i] for i in sample_ids("r", 3)] == alone  # the third waited for a row and did its own prefill
    with pytest.raises(ValueError, match="n > 1"):
        target.generate([PROMPT], params)


def test_logprobs_are_the_raw_model_log_probs(target):
    params = SamplingParams(max_new_tokens=5, ignore_eos=True, logprobs=3, temperature=0.0)
    _, events = run(target, PROMPT, params)
    ids = target.encode([PROMPT])[0]
    for ev in events:
        with torch.no_grad():
            logits = target.model.dense_logits(torch.tensor([ids]))[0, -1]
        ref = torch.log_softmax(logits.float(), -1)
        assert math.isclose(ev.logprob, ref[ev.token_id].item(), abs_tol=1e-4)
        assert [t for t, _ in ev.top_logprobs] == ref.topk(3).indices.tolist()
        assert ev.top_logprobs[0][0] == ev.token_id  # greedy: the top one
        ids.append(ev.token_id)
    # raw: a temperature does not change them
    _, hot = run(target, PROMPT, SamplingParams(max_new_tokens=1, logprobs=0, temperature=5.0, seed=0))
    first = events[0]
    if hot[0].token_id == first.token_id:
        assert math.isclose(hot[0].logprob, first.logprob, abs_tol=1e-5)
    assert hot[0].top_logprobs == ()
    _, plain = run(target, PROMPT, SamplingParams(max_new_tokens=2))
    assert plain[0].logprob is None and plain[0].top_logprobs is None


def test_logit_bias_and_min_tokens(target):
    greedy, _ = run(target, PROMPT, SamplingParams(max_new_tokens=4, ignore_eos=True))
    forced, _ = run(target, PROMPT, SamplingParams(max_new_tokens=4, ignore_eos=True, logit_bias={42: 100}))
    assert forced["r"] == [42] * 4
    banned, _ = run(
        target, PROMPT, SamplingParams(max_new_tokens=4, ignore_eos=True, logit_bias={greedy["r"][0]: -100})
    )
    assert banned["r"][0] != greedy["r"][0]
    eos = next(iter(target.eos_ids))
    eager = SamplingParams(max_new_tokens=20, logit_bias={eos: 100})
    assert run(target, PROMPT, eager)[0]["r"] == [eos]  # EOS at once
    out, events = run(target, PROMPT, SamplingParams(max_new_tokens=20, logit_bias={eos: 100}, min_tokens=5))
    assert len(out["r"]) == 6 and eos not in out["r"][:5] and events[-1].finish_reason == "eos"


def test_max_new_tokens_none_runs_to_the_end_of_the_context(target):
    short = Engine(target.hf_model, target.tokenizer, config=SchedulerConfig(max_model_len=24))
    ids = target.encode([PROMPT])[0]
    out, events = run(short, ids, SamplingParams(max_new_tokens=None, ignore_eos=True))
    assert len(out["r"]) == 24 - len(ids) and events[-1].finish_reason == "length"
    with pytest.raises(ValueError, match="context window"):
        short.add_request([5] * 24, SamplingParams(max_new_tokens=None))
    with pytest.raises(ValueError, match="min_tokens=30 exceeds"):
        short.add_request(ids, SamplingParams(max_new_tokens=None, min_tokens=30))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {5: 101.0}}, "logit_bias"),
        ({"logit_bias": {5: float("nan")}}, "logit_bias"),
        ({"logit_bias": "x"}, "logit_bias"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 9, "max_new_tokens": 8}, "min_tokens=9"),
        ({"logprobs": -1}, "logprobs"),
        ({"n": 0}, "SamplingParams.n"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_bad_field_values_are_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def test_bad_values_the_engine_checks(target):
    with pytest.raises(ValueError, match="logit_bias has token ids outside"):
        target.add_request(PROMPT, SamplingParams(logit_bias={10**6: 1.0}))
    with pytest.raises(ValueError, match="logprobs=5000 exceeds"):
        target.add_request(PROMPT, SamplingParams(logprobs=5000))
    target.add_request(PROMPT, SamplingParams(n=2, max_new_tokens=2), request_id="busy")
    with pytest.raises(ValueError, match="in use"):
        target.add_request(PROMPT, SamplingParams(max_new_tokens=2), request_id="busy")
    target.abort("busy")
    assert not target.has_unfinished()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prefix_caching": True},  # forked blocks are named and cached like any others
        {"config": SchedulerConfig(max_kv_tokens=64, preemption="swap")},  # forks swapped out and back in
        {"config": SchedulerConfig(max_kv_tokens=64, preemption="recompute")},  # forks recomputed from their tokens
    ],
)
def test_forks_under_prefix_caching_and_preemption(target, kwargs):
    params = SamplingParams(temperature=1.0, seed=21, max_new_tokens=14, ignore_eos=True, n=3)
    prompt = list(range(30, 50))  # 20 tokens: 3 samples × 34 tokens do not fit in 64 at once
    free, _ = run(Engine(target.hf_model, target.tokenizer, kv_cache="paged", block_size=4), prompt, params)
    engine = Engine(target.hf_model, target.tokenizer, kv_cache="paged", block_size=4, **kwargs)
    out, _ = run(engine, prompt, params)
    again, _ = run(engine, prompt, params, request_id="s")  # a second time: prefix hits, if cached
    assert [out[i] for i in sample_ids("r", 3)] == [free[i] for i in sample_ids("r", 3)]
    assert [again[i] for i in sample_ids("s", 3)] == [free[i] for i in sample_ids("r", 3)]
    if "config" in kwargs:
        assert engine.scheduler.num_preemptions > 0
    else:
        assert engine.backend.prefix_hits > 0
    assert engine.backend.bytes_used() == 0
    engine.backend.blocks.check_no_leaks()
