"""Chapter 02's workloads and client side (course_lib.serving): right shapes, right bookkeeping, fits that
recover known costs."""

import numpy as np
import pytest

from course_lib import serving
from course_lib.engine import Engine
from tests.conftest import random_llama

TEXT = "import os\nimport sys\n\n\ndef main(argv):\n    return 0\n" * 40


@pytest.fixture(scope="module")
def engine(tokenizer):
    return Engine(random_llama(tokenizer), tokenizer)


@pytest.fixture(scope="module")
def pool(tokenizer):
    return serving.prompt_pool(tokenizer, 200, text=TEXT)


def test_prompt_pool_and_slices(tokenizer, pool):
    assert len(pool) == 200 and pool == serving.prompt_pool(tokenizer, 200, text=TEXT)
    assert serving.prompt_of_length(pool, 5, 3) == pool[3:8]
    assert serving.prompt_of_length(pool, 5, 198) == pool[198:] + pool[:3]  # wraps around
    with pytest.raises(ValueError, match="pool of at least"):
        serving.prompt_of_length(pool, 201)
    with pytest.raises(ValueError, match="only"):
        serving.prompt_pool(tokenizer, 10_000, text="x = 1\n")


def test_workload_is_seeded_and_long_tailed(pool):
    w = serving.make_workload(pool, 200, prompt_lens=(4, 40), output_median=10, output_max=100, seed=3)
    assert w == serving.make_workload(pool, 200, prompt_lens=(4, 40), output_median=10, output_max=100, seed=3)
    assert w != serving.make_workload(pool, 200, prompt_lens=(4, 40), output_median=10, output_max=100, seed=4)
    lens = [len(r.prompt_ids) for r in w]
    outs = np.array([r.max_new_tokens for r in w])
    assert min(lens) >= 4 and max(lens) <= 40
    assert outs.min() >= 2 and outs.max() <= 100
    assert outs.mean() > np.median(outs)  # a long right tail pulls the mean above the median
    with pytest.raises(ValueError):
        serving.make_workload(pool, 3, prompt_lens=(10, 5))
    with pytest.raises(ValueError):
        serving.Request((), 3)


def test_serve_static_batches_cut_traces_and_queue(engine, pool):
    reqs = [
        serving.Request(tuple(pool[:6]), 3),
        serving.Request(tuple(pool[6:10]), 5),
        serving.Request(tuple(pool[:2]), 2),
    ]
    alone = serving.serve(engine, reqs, batch_size=1)
    batched = serving.serve(engine, reqs, batch_size=3)
    for traces in (alone, batched):
        assert [t.n_output for t in traces] == [3, 5, 2]
        assert [t.prompt_tokens for t in traces] == [6, 4, 2]
        assert [t.request_id for t in traces] == [0, 1, 2]
    assert len({t.arrival for t in batched}) == 1  # one batch: one arrival
    assert len({t.arrival for t in alone}) == 3  # each request arrives as it is served
    queued = serving.serve(engine, reqs, batch_size=1, common_arrival=True)
    assert len({t.arrival for t in queued}) == 1
    assert queued[2].ttft > queued[0].latency  # the last one waited for the others
    rebased = serving.with_common_arrival(alone)
    assert all(r.arrival == alone[0].arrival for r in rebased)
    assert rebased[2].ttft >= alone[2].ttft and rebased[1].token_times == alone[1].token_times
    with pytest.raises(ValueError):
        serving.serve(engine, [], batch_size=1)
    with pytest.raises(ValueError):
        serving.serve(engine, reqs, batch_size=0)


def test_sweeps_shapes(engine, pool):
    pts = serving.ttft_sweep(engine, pool, (4, 16), repeats=2)
    assert [p.prompt_len for p in pts] == [4, 16] and all(p.ttft_s > 0 and len(p.samples_s) == 2 for p in pts)
    runs = serving.tpot_sweep(engine, pool, (1, 3), prompt_len=8, new_tokens=4, repeats=3)
    assert [r.batch for r in runs] == [1, 3]
    for r in runs:
        assert len(r.traces) == r.batch and all(t.n_output == 4 for t in r.traces)
        assert r.tpot_s > 0 and r.decode_tokens_per_s == pytest.approx(r.batch / r.tpot_s)
    grid = serving.latency_grid(engine, pool, (4, 8), (2, 3), repeats=1)
    assert [(i, o) for i, o, _ in grid] == [(4, 2), (4, 3), (8, 2), (8, 3)]
    with pytest.raises(ValueError, match="new_tokens"):
        serving.tpot_sweep(engine, pool, (1,), new_tokens=1)
    with pytest.raises(ValueError):
        serving.ttft_sweep(engine, pool, ())


def test_fit_latency_recovers_known_costs():
    a, b, c = 0.004, 0.0002, 0.02
    pts = [(i, o, a + b * i + c * o) for i in (16, 64, 256) for o in (4, 16, 64)]
    fit = serving.fit_latency(pts)
    assert (fit.a, fit.b, fit.c) == pytest.approx((a, b, c), rel=1e-9)
    assert fit.ratio == pytest.approx(100) and fit.rms_s < 1e-12
    assert fit.predict([16], [4])[0] == pytest.approx(a + 16 * b + 4 * c)
    with pytest.raises(ValueError, match="vary"):
        serving.fit_latency([(16, 4, 1.0), (32, 4, 2.0), (64, 4, 3.0)])  # output never varies
    with pytest.raises(ValueError):
        serving.fit_latency([(1, 2, 3.0)])


def test_prefill_interference_budget_sets_the_chunks(engine, pool):
    runs = serving.prefill_interference(
        engine, pool, [16, 256], prompt_len=64, running_prompt=8, running_tokens=12, join_after=3, repeats=1
    )
    small, big = runs
    assert (small.budget, big.budget) == (16, 256)
    assert small.prefill_steps >= 4 and big.prefill_steps == 1  # 64 tokens in chunks of <= 15 vs one step
    for r in runs:
        assert 0 < r.running_tpot_s <= r.running_max_gap_s and r.new_ttft_s > 0
    with pytest.raises(ValueError, match="join_after"):
        serving.prefill_interference(engine, pool, [16], running_tokens=4, join_after=5)
    with pytest.raises(ValueError, match="budgets"):
        serving.prefill_interference(engine, pool, [])
    with pytest.raises(ValueError, match="pool holds"):
        serving.prefill_interference(engine, pool, [16], prompt_len=500)
