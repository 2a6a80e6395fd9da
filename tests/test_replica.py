"""Replica parallelism: the router spreads requests, every replica answers exactly as one engine would."""

import pytest
import torch

from course_lib.engine import SamplingParams
from course_lib.parallel.replica import ReplicaResult, assign, serve_replicas
from tests.test_pipeline import single_engine, spawned_children

MODEL = "tiny-target"


def test_round_robin_spreads_by_count():
    assert assign([5] * 5, 2, "round_robin") == [[0, 2, 4], [1, 3]]
    assert assign([1, 2, 3], 1, "round_robin") == [[0, 1, 2]]
    assert assign([1], 3, "round_robin") == [[0], [], []]


def test_least_loaded_spreads_by_work():
    # one long request first: round-robin would still give replica 0 every other request
    costs = [100, 10, 10, 10, 10, 10]
    assert assign(costs, 2, "round_robin") == [[0, 2, 4], [1, 3, 5]]
    assert assign(costs, 2, "least_loaded") == [[0], [1, 2, 3, 4, 5]]
    assert assign([3, 3, 3], 3, "least_loaded") == [[0], [1], [2]]  # ties: the lowest index


def test_bad_input():
    for n in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n_replicas"):
            assign([1], n)
    with pytest.raises(ValueError, match="policy"):
        assign([1], 2, "random")
    with pytest.raises(ValueError, match="costs"):
        assign([1, -2], 2)
    with pytest.raises(ValueError, match="params"):
        serve_replicas(MODEL, [[1, 2]], params=[SamplingParams()] * 2)
    with pytest.raises(ValueError, match="prompts"):
        serve_replicas(MODEL, [])
    with pytest.raises(ValueError, match="each replica process loads its own copy"):
        serve_replicas(object(), [[1, 2]])
    assert spawned_children() == []


def test_replica_result_throughput():
    r = ReplicaResult([[1, 2], [3]], [[0], [1]], [0.5, 1.5], 3)
    assert r.wall_s == 1.5 and r.tokens_per_s == 2.0


def test_replicas_equal_single_engine():
    torch.manual_seed(0)
    prompts = [torch.randint(0, 4096, (n,)).tolist() for n in (20, 5, 31, 12, 8, 26)]
    params = SamplingParams(max_new_tokens=8)  # greedy, stops at EOS like the single engine
    single = [r.output_ids for r in single_engine().generate(prompts, params)]
    two = serve_replicas(MODEL, prompts, 2, "least_loaded", params, timeout_s=90)  # the 1-replica run: same code
    assert two.output_ids == single
    # work = prompt + 8 tokens = 28, 13, 39, 20, 16, 34: replica loads 28|13 → 28|52 → 48|52 → 64|52 → 64|86
    assert two.assignment == [[0, 3, 4], [1, 2, 5]]
    assert two.tokens == sum(len(o) for o in single) and two.tokens_per_s > 0
    print(f"\n2 replicas: {two.tokens_per_s:.0f} tok/s, per replica {[round(s * 1e3) for s in two.replica_s]} ms")
    assert spawned_children() == []
