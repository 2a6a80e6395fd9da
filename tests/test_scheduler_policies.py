"""Chapter 06 scheduling: static / dynamic / continuous batching, preemption by recompute or by swapping,
KV capacity checks, and the scheduler's invariants under randomized traces: every request ends, no
budget is exceeded, and each request's greedy tokens equal that request run alone."""

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

from course_lib.engine import Engine, SamplingParams, SchedulerConfig, SequenceStatus
from course_lib.engine.attention import ContiguousBackend
from course_lib.engine.attention.paged import PagedBackend, SwappedKV
from course_lib.engine.scheduler import Scheduler
from course_lib.engine.sequence import Sequence
from tests.conftest import random_llama

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16  # random_llama's shapes


@pytest.fixture(scope="module")
def model(tokenizer):
    hf = random_llama(tokenizer, seed=3)
    hf.lm_head.weight.data.mul_(100)  # wide logit gaps: greedy never hinges on the last bits
    return hf, tokenizer


# ----------------------------------------------------------------------------- configuration
def test_bad_config_names_the_argument():
    with pytest.raises(ValueError, match="policy must be one of"):
        SchedulerConfig(policy="fifo")
    with pytest.raises(ValueError, match="preemption must be one of"):
        SchedulerConfig(preemption="drop")
    for bad in (-0.1, math.nan, "1", True):
        with pytest.raises(ValueError, match="max_wait_s"):
            SchedulerConfig(max_wait_s=bad)
    with pytest.raises(ValueError, match="swap_out/swap_in"):
        Scheduler(SchedulerConfig(preemption="swap"), ContiguousBackend(1, 1, 4, 8, 2))


# ----------------------------------------------------------------------------- dynamic batching on a fake clock
def _seq(i, n, arrival):
    return Sequence(i, list(range(1, n + 1)), SamplingParams(max_new_tokens=2), arrival)


def test_dynamic_waits_for_a_full_batch_or_the_oldest_deadline():
    """The simulator's way of driving the scheduler: ``schedule(now)`` on its own clock, no model."""
    cfg = SchedulerConfig(policy="dynamic", max_num_seqs=3, max_wait_s=0.5)
    sch = Scheduler(cfg, PagedBackend(LAYERS, KV_HEADS, HEAD_DIM, 16, 4))
    sch.add(_seq(0, 5, arrival=0.0))
    assert len(sch.schedule(now=0.1)) == 0 and sch.wait_time(0.1) == pytest.approx(0.4)
    sch.add(_seq(1, 5, arrival=0.2))
    assert len(sch.schedule(now=0.3)) == 0
    batch = sch.schedule(now=0.5)  # the oldest has waited max_wait_s: go with two
    assert [s.request_id for s in batch.seqs] == [0, 1] and batch.num_tokens == [5, 5]
    for i in range(2, 6):
        sch.add(_seq(i, 5, arrival=0.6))
    assert sch.wait_time(0.6) == math.inf  # a batch runs: nobody joins it
    for s, n in zip(batch.seqs, batch.num_tokens):
        s.num_cached_tokens += n
        s.token_ids.append(7)
    batch = sch.schedule(now=0.6)
    assert [s.request_id for s in batch.seqs] == [0, 1] and batch.num_tokens == [1, 1]
    for s in list(sch.running):
        sch.finish(s, "length", now=0.7)
    assert sch.wait_time(0.7) == 0.0  # three wait: a full batch starts at once
    assert [s.request_id for s in sch.schedule(now=0.7).seqs] == [2, 3, 4]


def test_static_and_continuous_do_not_wait():
    for policy in ("static", "continuous"):
        sch = Scheduler(SchedulerConfig(policy=policy, max_num_seqs=4), PagedBackend(1, 1, 4, 16, 4))
        sch.add(_seq(0, 3, arrival=0.0))
        assert sch.wait_time(0.0) == 0.0 and len(sch.schedule(now=0.0)) == 1
        sch.add(_seq(1, 3, arrival=0.0))
        assert len(sch.schedule(now=0.0)) == (2 if policy == "continuous" else 1)


def test_engine_with_dynamic_batching_waits_on_the_real_clock_and_finishes(model):
    hf, tok = model
    prompts = [[5, 6, 7], [8, 9]]
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    dynamic = Engine(hf, tok, config=SchedulerConfig(policy="dynamic", max_num_seqs=8, max_wait_s=0.02))
    results = dynamic.generate(prompts, params)  # 2 < 8 waiting: the first batch starts after 20 ms
    assert results[0].trace.token_times[0] - results[0].trace.arrival >= 0.02
    reference = Engine(hf, tok).generate(prompts, params)
    assert [r.output_ids for r in results] == [r.output_ids for r in reference]


# ----------------------------------------------------------------------------- swapping
def test_swap_out_and_in_restores_the_kv_and_counts_the_bytes():
    kv = PagedBackend(LAYERS, KV_HEADS, HEAD_DIM, 8, 4)
    a, b = kv.allocate(), kv.allocate()
    kv.append(a, 6)
    kv.append(b, 3)
    for t in kv.k + kv.v:
        t.copy_(torch.randn_like(t))
    before = [kv.gather(t, kv._tables([a], 2), 6).clone() for t in kv.k + kv.v]
    host = kv.swap_out(a)
    assert isinstance(host, SwappedKV) and host.length == 6 and kv.blocks.num_free == 7
    assert host.num_bytes == 2 * kv.bytes_per_block == kv.swapped_out_bytes
    kv.append(b, 8)  # b grows into a's old blocks and overwrites them
    for t in kv.k + kv.v:
        t[kv.blocks.tables[b]] = 0.0
    a2 = kv.swap_in(host)
    after = [kv.gather(t, kv._tables([a2], 2), 6) for t in kv.k + kv.v]
    assert all(torch.equal(x, y) for x, y in zip(before, after)) and kv.swapped_in_bytes == host.num_bytes
    with pytest.raises(ValueError, match="SwappedKV"):
        kv.swap_in(a2)


# ----------------------------------------------------------------------------- capacity
def test_requests_that_can_never_fit_are_rejected_and_the_others_run(model):
    hf, tok = model
    config = SchedulerConfig(max_num_seqs=4, max_model_len=64, max_kv_tokens=42)
    engine = Engine(hf, tok, config=config, kv_cache="paged", block_size=4)  # a pool of 11 blocks: 44 slots
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    lens = [10, 35, 20, 37, 5]  # 35 + 8 exceeds the 42-token KV budget, 37 + 8 the 44-slot pool
    accepted, errors = [], {}
    for i, n in enumerate(lens):
        try:
            accepted.append(engine.add_request(list(range(3, 3 + n)), params, request_id=i))
        except ValueError as e:
            errors[i] = str(e)
    assert sorted(errors) == [1, 3] and len(accepted) == 3
    assert "max_kv_tokens=42" in errors[1] and "whole cache holds for one sequence (44 tokens)" in errors[3]
    while engine.has_unfinished():
        engine.step()
    assert all(s.num_output_tokens == 8 for s in accepted)
    pool = Engine(hf, tok, config=SchedulerConfig(max_model_len=64), backend=PagedBackend(2, 2, 16, 5, 4, 64))
    with pytest.raises(ValueError, match="whole cache holds"):  # 20 slots in the pool
        pool.add_request(list(range(3, 18)), params)


# ----------------------------------------------------------------------------- randomized traces
NUM_REQUESTS = 7


@pytest.fixture(scope="module")
def requests_and_alone(model):
    """A pool of requests (some sharing a prefix) and each one's greedy tokens when run alone."""
    hf, tok = model
    rng = np.random.default_rng(0)
    shared = rng.integers(3, 4000, 12).tolist()
    reqs = []
    for i in range(NUM_REQUESTS):
        own = rng.integers(3, 4000, int(rng.integers(1, 12))).tolist()
        prompt = (shared + own) if i % 2 else own
        reqs.append((prompt, int(rng.integers(3, 13))))
    alone_engine = Engine(hf, tok, config=SchedulerConfig(max_num_seqs=1, max_model_len=64))
    alone = [
        alone_engine.generate([p], SamplingParams(max_new_tokens=m, ignore_eos=True))[0].output_ids for p, m in reqs
    ]
    return reqs, alone


COMBOS = list(itertools.product(["static", "dynamic", "continuous"], ["recompute", "swap"], [True, False]))
TRACE_STATS: dict[tuple, dict] = {}  # combo → what the trace exercised (checked by the last test)


@pytest.mark.parametrize("policy,preemption,chunked", COMBOS)
def test_invariants_under_random_traces(model, requests_and_alone, policy, preemption, chunked):
    hf, tok = model
    reqs, alone = requests_and_alone
    seed = COMBOS.index((policy, preemption, chunked))
    rng = np.random.default_rng(100 + seed)
    max_seqs, max_tokens = int(rng.integers(2, 5)), int(rng.integers(8, 40))
    num_blocks, prefix = int(rng.integers(9, 13)), bool(rng.integers(0, 2))
    config = SchedulerConfig(
        policy=policy,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=max_tokens,
        max_model_len=64,
        chunked_prefill=chunked,
        max_wait_s=0.03,
        preemption=preemption,
    )
    backend = PagedBackend(LAYERS, KV_HEADS, HEAD_DIM, num_blocks, 4, 64, prefix_caching=prefix)
    capacity = num_blocks * backend.bytes_per_block
    engine = Engine(hf, tok, config=config, backend=backend)
    sch = engine.scheduler
    order = rng.permutation(NUM_REQUESTS).tolist()
    arrive_at = sorted(rng.integers(0, 12, NUM_REQUESTS).tolist())
    clock = {"now": 0.0}  # a virtual clock for dynamic batching: 10 ms per step
    schedule = sch.schedule

    def spy(now=None):
        running_before, open_before = list(sch.running), sch.batch_open
        batch = schedule(now=clock["now"])
        admitted = [s for s in batch.seqs if not any(s is r for r in running_before)]
        if policy != "continuous" and running_before and not open_before:
            assert not admitted, "static/dynamic admitted a request into a closed batch"
        assert batch.total_tokens <= max_tokens and len(batch) <= max_seqs and len(sch.running) <= max_seqs
        assert all(n > 0 for n in batch.num_tokens) and len({id(s) for s in batch.seqs}) == len(batch)
        return batch

    sch.schedule = spy
    seqs, rejected, outputs = {}, [], {}
    step = 0
    while order and arrive_at or engine.has_unfinished():
        while order and arrive_at and arrive_at[0] <= step:
            arrive_at.pop(0)
            i = order.pop(0)
            prompt, m = reqs[i]
            try:
                seqs[i] = engine.add_request(
                    prompt, SamplingParams(max_new_tokens=m, ignore_eos=True), request_id=i, arrival=clock["now"]
                )
            except ValueError:  # rejected up front, for a documented reason only
                fits_pool = len(prompt) + m <= min(64, num_blocks * 4)
                assert not fits_pool or (not chunked and len(prompt) + m > max_tokens)
                rejected.append(i)
        for ev in engine.step():
            outputs.setdefault(ev.request, []).append(ev.token_id)
        waiting, running = list(sch.waiting), sch.running
        assert not {id(s) for s in waiting} & {id(s) for s in running}, "a sequence both waiting and running"
        assert all(s.status is SequenceStatus.RUNNING for s in running)
        assert all(s.status is not SequenceStatus.RUNNING for s in waiting)
        for s in seqs.values():  # every admitted request is in exactly one place
            assert (any(s is w for w in waiting) or any(s is r for r in running)) != s.is_finished
        assert backend.bytes_used() <= backend.bytes_reserved() <= capacity
        clock["now"] += 0.01
        step += 1
        assert step < 1000, "no progress"
    assert len(seqs) + len(rejected) == NUM_REQUESTS  # nobody dropped silently
    for i, s in seqs.items():
        assert s.status is SequenceStatus.FINISHED and s.finish_reason == "length"
        assert outputs[i] == s.output_ids == alone[i], f"request {i} differs from running alone"
    backend.blocks.check_no_leaks()
    assert backend.bytes_used() == 0 and backend.bytes_reserved() == 0
    if preemption == "swap":
        assert all(s.swapped_bytes > 0 for s in seqs.values() if s.num_preemptions)
    else:
        assert all(s.swapped_bytes == 0 for s in seqs.values())
    TRACE_STATS[policy, preemption, chunked] = {
        "preemptions": sum(s.num_preemptions for s in seqs.values()),
        "prefix_hits": backend.prefix_hits,
        "chunks": sum(1 for s in seqs.values() if len(s.prompt_ids) > max_tokens),
    }


def test_the_traces_exercised_preemption_swapping_and_prefix_hits():
    if len(TRACE_STATS) < len(COMBOS):
        pytest.skip("needs every randomized trace to have run")
    for mode in ("recompute", "swap"):
        assert sum(v["preemptions"] for k, v in TRACE_STATS.items() if k[1] == mode) > 0, mode
    assert sum(v["prefix_hits"] for v in TRACE_STATS.values()) > 0
    assert sum(v["chunks"] for k, v in TRACE_STATS.items() if k[2]) > 0  # some prompts were cut into chunks


def _static_batch_sizes(config: SchedulerConfig, prompt_lens, output_lens) -> list[int]:
    """Drive the scheduler alone (the simulator's bookkeeping backend, no model) with every request waiting
    at t = 0, and return how many requests each static batch took."""
    from course_lib.serving.simulator.backends import sim_backend

    cfg = dataclasses.replace(config, max_model_len=max(p + m for p, m in zip(prompt_lens, output_lens)) + 1)
    sch = Scheduler(cfg, sim_backend(cfg))
    for i, (p, m) in enumerate(zip(prompt_lens, output_lens)):
        sch.add(Sequence(i, list(range(p)), SamplingParams(max_new_tokens=m, ignore_eos=True), arrival=0.0))
    sizes, members = [], set()
    for _ in range(10_000):
        if not sch.has_unfinished():
            break
        if not sch.running and members:
            sizes.append(len(members))
            members = set()
        batch = sch.schedule(now=0.0)
        for seq, n in zip(batch.seqs, batch.num_tokens):
            members.add(seq.request_id)
            seq.num_cached_tokens += n
            if seq.num_cached_tokens == seq.num_tokens:  # prompt done (or a decode token): one new token
                seq.token_ids.append(0)
                if seq.num_output_tokens >= seq.params.max_new_tokens:
                    sch.finish(seq, "length", 0.0)
    sizes.append(len(members))
    return sizes


def test_static_batch_fills_max_num_seqs_past_the_token_budget():
    """A counter-example for the old static admission (which stopped once the step's 2,048 tokens were spent):
    32 waiting prompts of 121 tokens need 3,872 prefill tokens, and the batch must still hold all 32."""
    cfg = SchedulerConfig(policy="static", max_num_seqs=32, max_num_batched_tokens=2048)
    assert _static_batch_sizes(cfg, [121] * 64, [5] * 64) == [32, 32]
    for chunked in (True, False):  # without chunking, the later members prefill in the next steps
        cfg = SchedulerConfig(policy="static", max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=chunked)
        assert _static_batch_sizes(cfg, [60] * 16, [3] * 16) == [8, 8]
    cfg = SchedulerConfig(policy="dynamic", max_num_seqs=8, max_num_batched_tokens=100)
    assert _static_batch_sizes(cfg, [60] * 16, [3] * 16) == [8, 8]


def test_static_batch_closes_when_the_queue_empties():
    cfg = SchedulerConfig(policy="static", max_num_seqs=8)
    assert _static_batch_sizes(cfg, [10] * 3, [4] * 3) == [3]
