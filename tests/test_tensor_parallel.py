"""Tensor and sequence parallelism (course_lib.parallel.tp_model, sequence_parallel) against the single-process engine, on 2 gloo ranks.

One ``launch`` of two workers runs every distributed check and sends its tensors home; the single-process
reference is computed here, in the test process. fp32 tolerance: 1e-5 (the row-parallel sums are
reordered, so the results agree to rounding, not bit for bit).
"""

from __future__ import annotations

import os

import pytest
import torch

from course_lib.engine import Engine, SamplingParams
from course_lib.parallel.launcher import launch
from course_lib.parallel.tp_comm import Comm, tp_comm_bytes
from course_lib.parallel.tp_equal import logits_run
from course_lib.parallel.tp_measure import TPStepTimes, _step_worker
from course_lib.parallel.tp_model import shard_model, tp_engine

PROMPTS = ["def fibonacci(n):", "The quick brown fox jumps over the"]  # 9 + 13 tokens: N even, then odd
WORLD = 2
ATOL = RTOL = 1e-5


def _logits_run(engine, prompts=PROMPTS, decode_steps: int = 2, last_only: bool = False) -> list[torch.Tensor]:
    """A prefill of ``prompts`` (all positions), then greedy decode steps of one token per sequence."""
    return logits_run(engine, prompts, decode_steps, last_only)


def _stats(engine) -> dict:
    m = engine.model
    ops = {op: (s.calls, s.payload_bytes, s.sent_bytes) for op, s in m.comm.stats.items()}
    return {"ops": ops, "rows_normed": m.rows_normed}


def _tp_worker(rank: int, world_size: int) -> dict:
    """Every distributed check on one rank; returns plain tensors and numbers."""
    torch.set_num_threads(1)
    tp = tp_engine(rank, world_size, linear="reference")
    sp = tp_engine(rank, world_size, linear="reference", sequence_parallel=True)
    res = {"pid": os.getpid(), "kv_heads": tp.backend.num_kv_heads, "heads": tp.model.num_heads}
    res["tp"] = _logits_run(tp)
    res["sp"] = _logits_run(sp)
    res["sp_one"] = _logits_run(sp, PROMPTS[:1], 1)  # one sequence: an odd N prefill, then a lone decode token
    for name, engine in (("tp", tp), ("sp", sp)):  # bytes and norm rows of one prefill of N tokens
        for key, prompts in (("two", PROMPTS), ("one", PROMPTS[:1])):
            engine.model.reset_stats()
            _logits_run(engine, prompts, 0, last_only=True)
            res[f"stats_{name}_{key}"] = _stats(engine)
    for method in ("native", "all_to_all", "all_reduce"):
        sp.model.comm.reduce_scatter = method
        res[f"rs_{method}"] = _logits_run(sp, PROMPTS, 0)[0]
    greedy = SamplingParams(max_new_tokens=8)
    res["greedy_tp"] = [r.output_ids for r in tp.generate(PROMPTS, greedy)]
    res["greedy_sp"] = [r.output_ids for r in sp.generate(PROMPTS, greedy)]
    default = tp_engine(rank, world_size)  # the default linear (skinny on a CPU), as the notebook runs it
    res["greedy_default"] = [r.output_ids for r in default.generate(PROMPTS, greedy)]
    mqa = tp_engine(rank, world_size, "tiny-target-mqa", linear="reference")  # 1 KV head: replicated on both ranks
    res["mqa"] = _logits_run(mqa)
    res["mqa_heads"] = (mqa.model.num_heads, mqa.backend.num_kv_heads, mqa.model.rank_shard.kv_replicas)
    res["greedy_mqa"] = [r.output_ids for r in mqa.generate(PROMPTS, greedy)]
    res["step_times"] = _step_worker(
        rank, world_size, batch=2, context=8, repeats=2, warmup=1
    )  # what tp_step_times runs
    return res


@pytest.fixture(scope="module")
def ranks():
    return launch(_tp_worker, WORLD, threads_per_worker=1, timeout_s=120)


@pytest.fixture(scope="module")
def single_mqa():
    engine = Engine("tiny-target-mqa", linear="reference")
    return {
        "logits": _logits_run(engine),
        "greedy": [r.output_ids for r in engine.generate(PROMPTS, SamplingParams(max_new_tokens=8))],
    }


@pytest.fixture(scope="module")
def single():
    engine = Engine("tiny-target", linear="reference")
    return {
        "engine": engine,
        "logits": _logits_run(engine),
        "logits_one": _logits_run(engine, PROMPTS[:1], 1),
        "greedy": [r.output_ids for r in engine.generate(PROMPTS, SamplingParams(max_new_tokens=8))],
        "lens": [len(p) for p in engine.encode(PROMPTS)],
    }


def _close(actual: list[torch.Tensor], expected: list[torch.Tensor], what: str) -> None:
    assert len(actual) == len(expected)
    for step, (a, e) in enumerate(zip(actual, expected)):
        diff = (a - e).abs()
        assert a.shape == e.shape, f"{what} step {step}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        assert torch.allclose(a, e, atol=ATOL, rtol=RTOL), (
            f"{what} step {step}: max |diff| {diff.max():.3g}, mean {diff.mean():.3g}"
        )


def test_shards_hold_their_heads(ranks):
    for r in ranks:
        assert (r["heads"], r["kv_heads"]) == (8 // WORLD, 2 // WORLD)


def test_tp_logits_match_single_process(ranks, single):
    for rank, r in enumerate(ranks):
        _close(r["tp"], single["logits"], f"TP rank {rank}")  # prefill (all positions) + 2 decode steps


def test_sp_logits_match_tp_and_single_process(ranks, single):
    for rank, r in enumerate(ranks):
        _close(r["sp"], r["tp"], f"SP vs TP rank {rank}")
        _close(r["sp"], single["logits"], f"SP rank {rank}")
        _close(r["sp_one"], single["logits_one"], f"SP one sequence rank {rank}")


def test_reduce_scatter_methods_agree(ranks, single):
    for r in ranks:
        for method in ("native", "all_to_all", "all_reduce"):
            _close([r[f"rs_{method}"]], single["logits"][:1], f"reduce_scatter={method}")


def test_greedy_tokens_identical(ranks, single):
    for r in ranks:
        assert r["greedy_tp"] == single["greedy"]
        assert r["greedy_sp"] == single["greedy"]
        assert r["greedy_default"] == single["greedy"]
        assert all(len(ids) == 8 for ids in single["greedy"])


@pytest.mark.parametrize("key", ["two", "one"])
def test_sp_sends_the_bytes_of_tp_and_norms_one_pth_of_the_rows(ranks, single, key):
    m = single["engine"].model
    L, D = m.num_layers, m.config.hidden_size
    N = sum(single["lens"]) if key == "two" else single["lens"][0]
    M = 2 if key == "two" else 1  # rows the head needs: SP assembles them with one small all-reduce
    for r in ranks:
        tp, sp = r[f"stats_tp_{key}"], r[f"stats_sp_{key}"]
        assert tp["ops"]["all_reduce"][0] == 2 * L  # one all-reduce per block, two blocks per layer
        assert tp["ops"]["all_reduce"][1] == 2 * L * N * D * 4
        assert sp["ops"]["reduce_scatter"][0] == sp["ops"]["all_gather"][0] == 2 * L
        pred_tp, pred_sp = tp_comm_bytes(D, L, N, WORLD), tp_comm_bytes(D, L, N, WORLD, sequence_parallel=True)
        assert tp["ops"]["all_reduce"][2] == pytest.approx(pred_tp["all_reduce"])
        assert sp["ops"]["reduce_scatter"][2] == pytest.approx(pred_sp["reduce_scatter"])
        assert sp["ops"]["all_gather"][2] == pytest.approx(pred_sp["all_gather"])
        head = 2 * (WORLD - 1) / WORLD * M * D * 4
        assert sp["ops"]["all_reduce"][2] == pytest.approx(head)
        rs_ag = sp["ops"]["reduce_scatter"][2] + sp["ops"]["all_gather"][2]
        padded = WORLD * -(-N // WORLD)
        assert rs_ag == pytest.approx(pred_tp["all_reduce"] * padded / N)  # RS + AG = AR (on the padded rows)
        assert sp["rows_normed"] == pred_sp["rows_normed"] == 2 * L * padded // WORLD
        assert pred_tp["rows_normed"] == 2 * L * N
    assert (sum(single["lens"]) % WORLD, single["lens"][0] % WORLD) == (0, 1)  # an even and an uneven split


def test_step_times_count_two_all_reduces_per_layer(ranks, single):
    m = single["engine"].model
    L, D = m.num_layers, m.config.hidden_size
    times = TPStepTimes.from_ranks([r["step_times"] for r in ranks], batch=2, context=8, threads_per_worker=1)
    assert times.world_size == WORLD and len(times.step.samples_s) == 2 and len(times.rank_step_median_s) == WORLD
    assert times.allreduce_calls_per_step == 2 * L  # a decode step of 2 sequences: 2 all-reduces of (2, D) a layer
    assert times.allreduce_bytes_per_step == 2 * L * 2 * D * 4
    assert 0 < times.allreduce_share <= 1 and "TP=2" in str(times)
    # every rank dispatched the same operators, the all-reduces among them; waiting and the call itself apart
    assert times.ops_per_step > times.allreduce_calls_per_step
    assert times.allreduce_pure_s > 0 and times.allreduce_wait_s >= 0


def test_no_process_left_behind(ranks):
    import multiprocessing

    assert multiprocessing.active_children() == []
    for r in ranks:
        with pytest.raises(ProcessLookupError):
            os.kill(r["pid"], 0)


def test_world_size_one_is_the_single_process_engine(single):
    engine = tp_engine(0, 1, linear="reference")  # no process group needed
    _close(_logits_run(engine), single["logits"], "TP=1")
    assert engine.model.comm.sent_bytes == 0


def test_mqa_replicates_its_kv_head_and_matches_single_process(ranks, single_mqa):
    for rank, r in enumerate(ranks):
        assert r["mqa_heads"] == (4, 1, 2)  # 4 query heads, the one KV head, held by both ranks
        _close(r["mqa"], single_mqa["logits"], f"MQA TP rank {rank}")
        assert r["greedy_mqa"] == single_mqa["greedy"]


@pytest.mark.parametrize(
    "model, world_size, names",
    [
        ("tiny-target", 3, r"does not divide num_attention_heads=8 .*valid world_size .*: \[1, 2, 4, 8\]"),
        ("tiny-target", 16, "num_attention_heads=8"),
        ("tiny-target-mqa", 3, r"num_attention_heads=8.*\[1, 2, 4, 8\]"),
    ],
)
def test_world_size_must_divide_heads(model, world_size, names):
    with pytest.raises(ValueError, match=names):
        tp_engine(0, world_size, model)  # refused before any process group or weight


def test_bad_rank_and_double_sharding(single):
    with pytest.raises(ValueError, match="rank"):
        Comm(2, 2)
    with pytest.raises(ValueError, match="torch.distributed"):
        tp_engine(0, 2)  # no process group in the test process
    engine = tp_engine(0, 1)
    with pytest.raises(ValueError, match="already sharded"):
        shard_model(engine.model.model, 0, 1, engine.model.comm)


def test_tp_generate_matches_single_process_and_checks_input(single):
    from course_lib.parallel.tp_measure import tp_generate

    ranks_out = tp_generate(["def fibonacci(n):"], world_size=2, max_new_tokens=4)
    assert ranks_out[0] == ranks_out[1]
    ref = Engine("tiny-target").generate(["def fibonacci(n):"], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert ranks_out[0] == [ref[0].output_ids]
    with pytest.raises(ValueError, match="prompts"):
        tp_generate("def f():")
