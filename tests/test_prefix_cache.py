"""Prefix caching (chapter 06): hashed full blocks, reuse by reference count, an LRU of evictable cached
blocks, and greedy outputs identical with and without it."""

import pytest

from course_lib.engine import Engine, SamplingParams, SchedulerConfig, SequenceStatus
from course_lib.engine.attention.block_manager import BlockManager, block_hash
from course_lib.engine.attention.paged import PagedBackend
from tests.conftest import random_llama


# ----------------------------------------------------------------------------- the block manager
def test_cached_blocks_are_matched_reused_and_evicted_least_recent_first():
    bm = BlockManager(6, block_size=4)
    tokens = list(range(10, 22))  # 12 tokens: 3 full blocks
    a = bm.new_seq()
    bm.append(a, 12)
    bm.cache_blocks(a, tokens, 12)
    assert bm.match_prefix(tokens) == bm.tables[a][:2]  # the last token is always left to compute
    assert bm.match_prefix(tokens + [99]) == bm.tables[a]
    assert bm.match_prefix([10, 11, 12, 0] + tokens[4:]) == []  # the name covers the whole prefix
    b, n = bm.new_seq_with_prefix(tokens[:8] + [1, 2, 3])
    assert n == 8 and bm.tables[b] == bm.tables[a][:2] and bm.ref_count(bm.tables[a][0]) == 2
    assert (bm.prefix_hits, bm.prefix_queries) == (8, 11)
    bm.free_seq(a)  # block 2 (only a's) becomes cached-evictable; blocks 0, 1 are still b's
    assert (bm.num_free, bm.num_cached, bm.num_used) == (4, 1, 2)
    bm.free_seq(b)
    assert bm.num_cached == 3 and bm.num_free == 6
    bm.check_no_leaks()
    # a new sequence revives the matched cached blocks instead of computing them
    c, n = bm.new_seq_with_prefix(tokens + [5])
    assert n == 12 and bm.num_cached == 0 and bm.num_used == 3
    bm.free_seq(c)  # freed tail first, so the LRU order is blocks 2, 1, 0
    # three never-named blocks go first, then the cached ones, the tail of the prefix before its head
    d = bm.new_seq()
    bm.append(d, 16)
    assert bm.num_cached == 2 and bm.match_prefix(tokens + [5]) == [0, 1]  # block 2 (the tail) was evicted
    bm.append(d, 8)
    assert bm.num_cached == 0 and bm.match_prefix(tokens + [5]) == [] and bm.num_evictions == 3
    bm.free_seq(d)
    bm.check_no_leaks()


def test_truncate_into_a_named_block_forgets_it_and_fork_keeps_the_chain():
    bm = BlockManager(8, block_size=4)
    tokens = list(range(1, 13))
    a = bm.new_seq()
    bm.append(a, 12)
    bm.cache_blocks(a, tokens, 12)
    child = bm.fork(a)
    assert bm.hashes[child] == bm.hashes[a]
    bm.free_seq(child)
    bm.truncate(a, 6)  # block 1 becomes partly filled and only a holds it: its tail will be overwritten
    assert bm.match_prefix(tokens + [0]) == bm.tables[a][:1]
    assert len(bm.hashes[a]) == 1
    bm.free_seq(a)
    bm.check_no_leaks()
    assert block_hash(None, [1, 2]) == block_hash(None, (1, 2)) != block_hash(0, [1, 2])


def test_a_name_already_cached_keeps_its_block():
    bm = BlockManager(4, block_size=2)
    a, b = bm.new_seq(), bm.new_seq()
    bm.append(a, 2)
    bm.append(b, 2)
    bm.cache_blocks(a, [7, 8], 2)
    bm.cache_blocks(b, [7, 8], 2)  # computed the same block in the same step: a's stays the cached one
    assert bm.match_prefix([7, 8, 9]) == bm.tables[a]
    bm.free_seq(a)
    bm.free_seq(b)
    assert bm.num_cached == 1 and bm.num_free == 4
    bm.check_no_leaks()


# ----------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def model(tokenizer):
    hf = random_llama(tokenizer, seed=11)
    hf.lm_head.weight.data.mul_(100)  # wide logit gaps: greedy never hinges on the last bits
    return hf, tokenizer


SYSTEM = [(7 * i) % 97 + 3 for i in range(37)]  # a 37-token "system prompt" shared by every request
QUESTIONS = [[200 + i, 300 + 2 * i, 400 + 3 * i][: 1 + i % 3] for i in range(5)]


def _engine(model, prefix_caching, num_blocks=64, **cfg):
    hf, tok = model
    config = SchedulerConfig(**{"max_num_seqs": 4, "max_model_len": 96, "max_num_batched_tokens": 64, **cfg})
    backend = PagedBackend(2, 2, 16, num_blocks, 8, 96, prefix_caching=prefix_caching)
    return Engine(hf, tok, config=config, backend=backend)


def _run(engine, prompts, params, steps_between=0):
    """Add prompt i, run ``steps_between`` steps, add the next...; finish. Returns the sequences."""
    seqs = []
    for p in prompts:
        seqs.append(engine.add_request(p, params))
        for _ in range(steps_between):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    return seqs


@pytest.mark.parametrize("steps_between", [0, 2, 100], ids=["together", "interleaved", "sequential"])
def test_prefix_caching_outputs_equal_no_caching_and_blocks_do_not_leak(model, steps_between):
    prompts = [SYSTEM + q for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    plain = _run(_engine(model, False), prompts, params, steps_between)
    engine = _engine(model, True)
    cached = _run(engine, prompts, params, steps_between)
    assert [s.output_ids for s in cached] == [s.output_ids for s in plain]
    kv = engine.backend
    assert kv.prefix_queries == sum(len(p) for p in prompts)
    if steps_between:  # later requests find the 4 full blocks (32 tokens) of the system prompt
        assert kv.prefix_hits >= 32 * (len(prompts) - 1)
    kv.blocks.check_no_leaks()
    assert kv.bytes_used() == 0 and kv.bytes_reserved() == 0 and kv.blocks.num_cached > 0


def test_eviction_under_pressure_and_recompute_preemption_hit_their_own_blocks(model):
    """A pool of 10 blocks of 8 (80 tokens) for 6 requests of ~40 + 16: cached blocks are evicted for room,
    preempted sequences come back on their own cached blocks, and the tokens do not change."""
    prompts = [SYSTEM + q for q in QUESTIONS] + [[5 + i for i in range(40)]]
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    plain = _run(_engine(model, False, num_blocks=10), prompts, params, 1)
    engine = _engine(model, True, num_blocks=10)
    seqs = _run(engine, prompts, params, 1)
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain]
    assert sum(s.num_preemptions for s in seqs) > 0 and engine.backend.prefix_hits > 0
    assert engine.backend.blocks.num_evictions > 0
    engine.backend.blocks.check_no_leaks()
    assert all(s.status is SequenceStatus.FINISHED for s in seqs)


def test_prefix_caching_with_swap_and_chunked_prefill(model):
    prompts = [SYSTEM + q for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=14, ignore_eos=True)
    kw = dict(num_blocks=10, preemption="swap", max_num_batched_tokens=16)
    plain = _run(_engine(model, False, **kw), prompts, params, 1)
    engine = _engine(model, True, **kw)
    seqs = _run(engine, prompts, params, 1)
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain]
    assert engine.backend.prefix_hits > 0 and sum(s.swapped_bytes for s in seqs) > 0
    engine.backend.blocks.check_no_leaks()


def test_prefix_caching_bad_input(model):
    hf, tok = model
    with pytest.raises(ValueError, match="kv_cache='paged'"):
        Engine(hf, tok, prefix_caching=True)
    with pytest.raises(ValueError, match="prefix_caching=True"):
        Engine(hf, tok, backend=PagedBackend(2, 2, 16, 8, 8), prefix_caching=True)
    with pytest.raises(ValueError, match="prefix_caching must be a bool"):
        PagedBackend(2, 2, 16, 8, 8, prefix_caching="yes")
    engine = Engine(hf, tok, config=SchedulerConfig(max_model_len=96), kv_cache="paged", prefix_caching=True)
    assert engine.backend.prefix_caching
