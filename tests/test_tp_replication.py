"""KV-head replication and uneven head counts in tensor parallelism (course_lib.parallel.tp_plan, tp_load, tp_equal).

The split rules against hand-worked cases and every rank's heads; the sliced loader against load-then-cut
(bit for bit); and two TP groups against one process: tiny-target at TP=4 (2 KV heads, each on 2 ranks)
and SmolLM2-135M at TP=3 (9 query heads, 3 KV heads). Multi-process runs go through ``tp_equality``,
which launches one process, then the group (a few seconds of start-up each).
"""

from __future__ import annotations

import pytest
import torch

from course_lib.engine import Engine
from course_lib.parallel.tp_comm import Comm
from course_lib.parallel.tp_load import checkpoint_folder, load_rank_model
from course_lib.parallel.tp_model import release_unsharded, shard_model
from course_lib.parallel.tp_plan import (
    check_tp_degree,
    kv_bytes_per_rank,
    kv_heads_per_rank,
    rank_shard,
    valid_tp_degrees,
)

SMOL = "smollm2-135m-instruct"


def test_valid_degrees():
    assert valid_tp_degrees(9, 3, 1536) == [1, 3]  # SmolLM2-135M: 9 does not split in 2; 1536 % 9 != 0
    assert valid_tp_degrees(8, 2, 640) == [1, 2, 4, 8]  # tiny-target: 4 and 8 replicate the 2 KV heads
    assert valid_tp_degrees(8, 1, 640) == [1, 2, 4, 8]  # MQA: the one KV head on every rank
    assert valid_tp_degrees(64, 8, 28672) == [1, 2, 4, 8, 16, 32, 64]  # Llama-3-70B
    assert valid_tp_degrees(12, 4, 1536) == [1, 2, 4, 12]  # 3 and 6: a rank's query heads would use two KV heads


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((9, 3, 1536, 2), r"world_size=2 does not divide num_attention_heads=9 .*valid world_size .*: \[1, 3\]"),
        ((12, 4, 1536, 6), r"world_size=6 neither divides num_key_value_heads=4 .*multiple of it.*\[1, 2, 4, 12\]"),
        ((12, 4, 1536, 3), r"neither divides num_key_value_heads=4"),
        ((8, 2, 100, 8), r"does not divide intermediate_size=100 .*\[1, 2, 4\]"),
        ((8, 3, 640, 2), r"num_key_value_heads=3 must divide num_attention_heads=8"),
        ((8, 2, 640, 0), r"world_size must be a positive int, got 0"),
        ((8, 2, 640, 2.0), r"world_size must be a positive int"),
    ],
)
def test_impossible_splits_are_refused_by_name(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        check_tp_degree(*args)


@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (8, 1), (9, 3), (64, 8), (12, 4), (8, 8)])
def test_each_rank_keeps_the_kv_heads_its_query_heads_use(heads, kv_heads):
    for p in valid_tp_degrees(heads, kv_heads, 1536 * 8):
        shards = [rank_shard(heads, kv_heads, 1536 * 8, r, p) for r in range(p)]
        group = heads // kv_heads  # query heads per KV head
        assert [h for s in shards for h in s.q_heads] == list(range(heads))  # every query head once
        for s in shards:
            used = sorted({h // group for h in s.q_heads})
            assert list(s.kv_heads) == used  # exactly the KV heads this rank's queries read
            assert len(s.kv_heads) == kv_heads_per_rank(kv_heads, p)
            assert s.kv_replicas == max(1, p // kv_heads)
        held = [h for s in shards for h in s.kv_heads]
        assert sorted(set(held)) == list(range(kv_heads)) and len(held) == max(p, kv_heads)
    with pytest.raises(ValueError, match="rank"):
        rank_shard(heads, kv_heads, 1536 * 8, heads, 1)


def test_kv_bytes_per_rank_stop_shrinking_at_the_kv_heads():
    assert kv_bytes_per_rank(30, 3, 64, 1, 4) == 30 * 2 * 3 * 64 * 4  # SmolLM2 fp32: 46,080 B per token
    assert kv_bytes_per_rank(30, 3, 64, 3, 4) == 30 * 2 * 1 * 64 * 4  # a third on each rank
    assert kv_bytes_per_rank(6, 1, 32, 2, 4) == kv_bytes_per_rank(6, 1, 32, 1, 4)  # MQA: replicated, not split
    assert kv_bytes_per_rank(80, 8, 128, 16, 2) == kv_bytes_per_rank(80, 8, 128, 8, 2)  # 70B past TP=8
    with pytest.raises(ValueError, match="head_dim"):
        kv_bytes_per_rank(6, 1, 0, 2, 4)


@pytest.mark.parametrize("model, p", [("tiny-target", 2), ("tiny-target", 4), ("tiny-target-mqa", 2)])
def test_sliced_load_equals_load_then_cut(model, p):
    for rank in range(p):
        cut = Engine(model, linear="reference")
        shard_model(cut.model, rank, p, Comm(rank, p))
        freed = release_unsharded(cut.hf_model)
        assert freed > 0 and cut.hf_model.model.layers[0].self_attn.q_proj.weight.numel() == 0
        hf, tok = load_rank_model(checkpoint_folder(model), rank, p)
        sliced = Engine(hf, tok, linear="reference")
        shard_model(sliced.model, rank, p, Comm(rank, p), presliced=True)
        for (name, a), (_, b) in zip(cut.model.linears(), sliced.model.linears()):
            assert torch.equal(a.weight, b.weight), f"{model} rank {rank}/{p}: {name}"
        assert torch.equal(cut.model.embed_weight, sliced.model.embed_weight)
        assert hf.lm_head.weight is hf.model.embed_tokens.weight  # tied, as in the file
        assert (sliced.model.num_heads, sliced.model.num_kv_heads) == (8 // p, 1)


def test_presliced_model_for_another_split_is_refused():
    hf, tok = load_rank_model(checkpoint_folder("tiny-target"), 0, 2)
    engine = Engine(hf, tok, linear="reference")
    with pytest.raises(ValueError, match="not rank 0's slice"):
        shard_model(engine.model, 0, 4, Comm(0, 4), presliced=True)


def test_tp4_replicated_gqa_equals_one_process():
    from course_lib.parallel.tp_equal import tp_equality

    res = tp_equality("tiny-target", 4, ["def fibonacci(n):", "import os\n\n\ndef read(path):"], max_new_tokens=6)
    assert [(r["heads"], r["kv_heads"]) for r in res.ranks] == [(2, 1)] * 4  # KV head 0 on ranks 0-1, 1 on 2-3
    # fp32 sums split over ranks and added in another order: a few ulps of the largest logit (1.3e-5 at |15|
    # on a Sapphire Rapids VM, AVX-512 kernels), a sharding bug O(1)
    assert res.logits_close(atol=1e-5, rtol=2e-6), res.max_abs_diff
    assert res.argmax_equal and res.greedy_equal
    assert res.memory_total("peak_rss") >= res.memory_total("pss") > 0
    assert "TP=4" in str(res) and len(res.answers) == 2 and res.startup_s("tp") > 0


def test_tp_equality_refuses_bad_input_before_launching():
    from course_lib.parallel.tp_equal import tp_equality

    with pytest.raises(ValueError, match=r"num_attention_heads=8.*\[1, 2, 4, 8\]"):
        tp_equality("tiny-target", 3, ["x"])
    with pytest.raises(ValueError, match="prompts"):
        tp_equality("tiny-target", 2, "x")
    with pytest.raises(ValueError, match="max_new_tokens"):
        tp_equality("tiny-target", 2, ["x"], max_new_tokens=0)
    with pytest.raises(ValueError, match="chat=True"):
        tp_equality("tiny-target", 2, [[1, 2]], chat=True)


@pytest.mark.slow
def test_smollm2_tp3_equals_one_process(smollm2_cache, monkeypatch):
    from course_lib.parallel.tp_equal import tp_equality

    monkeypatch.setenv("COURSE_CACHE_DIR", str(smollm2_cache))  # the spawned ranks inherit it
    questions = ["What is the capital of France?", "How many legs does a spider have?"]
    res = tp_equality(SMOL, 3, questions, chat=True, max_new_tokens=6)
    assert [(r["heads"], r["kv_heads"]) for r in res.ranks] == [(3, 1)] * 3
    assert (res.single["heads"], res.single["kv_heads"]) == (9, 3)
    assert res.logits_close(atol=1e-3, rtol=1e-5), res.max_abs_diff  # 30 layers of reordered fp32 sums
    assert res.argmax_equal and res.greedy_equal
    with pytest.raises(ValueError, match=r"num_attention_heads=9 .*\[1, 3\]"):
        tp_equality(SMOL, 2, questions, chat=True)
