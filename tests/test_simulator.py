"""Chapter 06: traces, the serving simulator (the engine's own scheduler on a virtual clock), the cost model."""

import json
import math

import numpy as np
import pytest

from course_lib.engine import scheduler as sched
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.measure.metrics import SLO
from course_lib.serving.simulator import CostModel, fit_cost_model, run_real, simulate
from course_lib.serving.traces import (
    Trace,
    TraceRequest,
    bursty_arrivals,
    load_trace,
    lognormal_lengths,
    make_trace,
    poisson_arrivals,
    traces_dir,
)

COST = CostModel(a=2e-3, b=1e-4, c=5e-4, d=1e-7)
SHIPPED = ("poisson_small", "bursty_small", "shared_prefix", "long_prompts")


# ----------------------------------------------------------------------------- traces
def test_traces_are_seeded():
    a, b = make_trace(20, 5.0, seed=7), make_trace(20, 5.0, seed=7)
    assert a.to_dict() == b.to_dict()
    assert make_trace(20, 5.0, seed=8).to_dict() != a.to_dict()


def test_arrival_rates_match_the_request():
    n, rate = 20000, 5.0
    p = poisson_arrivals(rate, n, seed=1)
    assert p[0] == 0 and (np.diff(p) >= 0).all()
    assert abs((n - 1) / p[-1] / rate - 1) < 0.03
    g = np.diff(bursty_arrivals(rate, n, cv=3.0, seed=1))
    assert abs(1 / g.mean() / rate - 1) < 0.08  # same mean rate ...
    assert g.std() / g.mean() > 2.0  # ... much burstier than Poisson (CV 1)
    lens = lognormal_lengths(100, n, sigma=0.8, cap=10**6, seed=1)
    assert abs(lens.mean() / 100 - 1) < 0.05 and lens.min() >= 1
    assert lognormal_lengths(100, 500, sigma=2.0, cap=300).max() <= 300


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(rate=0.0),
        dict(rate=-1.0),
        dict(prompt_mean=0),
        dict(output_mean=-5),
        dict(prompt_max=0),
        dict(prefix_fraction=1.5, prefix_len=8),
        dict(prefix_fraction=-0.1, prefix_len=8),
        dict(prefix_fraction=0.5),  # a shared prefix of no tokens
        dict(arrival="uniform"),
        dict(n_requests=0),
    ],
)
def test_bad_trace_input(kwargs):
    args = dict(n_requests=10, rate=2.0) | kwargs
    with pytest.raises(ValueError):
        make_trace(**args)


def test_shared_prefix_and_round_trip(tmp_path):
    t = make_trace(40, 4.0, prompt_mean=20, prefix_len=16, prefix_fraction=0.5, prefix_groups=2, seed=3)
    grouped = [r for r in t.requests if r.prefix_group is not None]
    assert 0 < len(grouped) < len(t)
    pool = list(range(100, 4196))
    ids = t.prompt_ids(pool)
    for g in (0, 1):
        heads = {tuple(p[:16]) for p, r in zip(ids, t.requests) if r.prefix_group == g}
        assert len(heads) <= 1  # one system prompt per group
    assert all(len(p) == r.prompt_len for p, r in zip(ids, t.requests))
    back = Trace.load(t.save(tmp_path / "t.json"))
    assert back.to_dict() == json.loads(json.dumps(t.to_dict())) and back.prompt_ids(pool) == ids
    assert abs(t.with_rate(8.0).rate / 8.0 - 1) < 1e-9
    with pytest.raises(ValueError):
        Trace.from_dict({"requests": {"arrival_s": [0.0]}})


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_traces_are_small(name):
    assert (traces_dir() / f"{name}.json").stat().st_size <= 200_000
    t = load_trace(name)
    assert len(t) > 0 and t.max_model_len() <= 1024
    assert (traces_dir() / "README.md").read_text().count(name) >= 1


# ----------------------------------------------------------------------------- the simulator
CONFIGS = [
    ("continuous", True, 256, "contiguous"),
    ("continuous", False, 1024, "contiguous"),
    ("static", True, 256, "contiguous"),
    ("continuous", True, 128, "paged"),
]


@pytest.mark.parametrize("policy,chunked,budget,kv", CONFIGS)
def test_simulator_finishes_everything_within_budgets(policy, chunked, budget, kv):
    trace = load_trace("bursty_small")
    cfg = SchedulerConfig(policy=policy, max_num_seqs=8, max_num_batched_tokens=budget, chunked_prefill=chunked)
    res = simulate(trace, cfg, COST, kv_cache=kv, slo=SLO(0.5, 0.05))
    assert len(res.traces) == len(trace)
    assert [t.n_output for t in res.traces] == [r.max_new_tokens for r in trace.requests]
    assert res.max_step_tokens <= budget and res.max_step_seqs <= 8
    assert 0 < res.max_kv_tokens <= res.kv_capacity_tokens
    assert all(s.shape.prefill_tokens + s.shape.decode_rows > 0 for s in res.steps)
    assert res.summary.goodput_rps is not None and res.throughput > 0


def test_simulator_preempts_under_a_small_kv_budget():
    trace = load_trace("poisson_small").with_rate(100.0)
    cfg = SchedulerConfig(max_num_seqs=16, max_kv_tokens=1024, max_model_len=512)
    res = simulate(trace, cfg, COST, kv_cache="paged", block_size=16)
    assert [t.n_output for t in res.traces] == [r.max_new_tokens for r in trace.requests]
    assert res.num_preemptions > 0 and res.max_kv_tokens <= 1024


def test_virtual_clock_is_the_sum_of_step_costs():
    reqs = [TraceRequest(0.0, 10 + 7 * i, 3 + i) for i in range(12)]  # a burst: the clock never idles
    res = simulate(Trace(reqs), SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), COST)
    assert res.makespan_s == pytest.approx(res.busy_s, rel=1e-12)
    for s, nxt in zip(res.steps, res.steps[1:]):
        assert nxt.start_s == pytest.approx(s.start_s + s.dt_s, rel=1e-12)
        assert s.dt_s == pytest.approx(COST.shape_time(s.shape))
    # with gaps between arrivals the clock idles: busy time is less than the makespan
    spaced = simulate(Trace([TraceRequest(2.0 * i, 10, 3) for i in range(3)]), SchedulerConfig(), COST)
    assert spaced.busy_s < spaced.makespan_s


def test_continuous_beats_static_in_simulation():
    gpu_like = CostModel(a=5e-3, b=2e-5, c=5e-5)  # a decode row is nearly free next to the step's fixed cost
    trace = load_trace("bursty_small").with_rate(200.0)
    cont = simulate(trace, SchedulerConfig(policy="continuous", max_num_seqs=16), gpu_like)
    stat = simulate(trace, SchedulerConfig(policy="static", max_num_seqs=16), gpu_like)
    assert cont.throughput > 1.5 * stat.throughput


@pytest.mark.skipif("dynamic" not in sched.POLICIES, reason="the dynamic policy is not in the scheduler yet")
def test_dynamic_policy_if_present():
    cfg = SchedulerConfig(policy="dynamic", max_num_seqs=8)
    if hasattr(cfg, "max_wait_s"):
        cfg = SchedulerConfig(policy="dynamic", max_num_seqs=8, max_wait_s=0.05)
    res = simulate(load_trace("poisson_small"), cfg, COST)
    assert all(t.n_output > 0 for t in res.traces)


# ----------------------------------------------------------------------------- the cost model
def test_fit_recovers_known_coefficients(tmp_path):
    rng = np.random.default_rng(0)
    true = (3e-3, 8e-5, 4e-4, 2e-7)
    pts = []
    for p in (0, 32, 128, 512):
        for r in (0, 1, 4, 16):
            for ctx in (32, 512):
                if p == 0 and r == 0:
                    continue
                c = r * ctx
                t = true[0] + true[1] * p + true[2] * r + true[3] * c
                pts.append((p, r, c, t * (1 + 0.005 * rng.standard_normal())))
    m = fit_cost_model(pts, use_context=True)
    for got, want in zip((m.a, m.b, m.c, m.d), true):
        assert got == pytest.approx(want, rel=0.1)
    assert m.max_rel_err < 0.03 and m.n_points == len(pts)
    assert CostModel.load(m.save(tmp_path / "c.json")) == m
    with pytest.raises(ValueError):
        fit_cost_model([(1, 1, 1, 1.0)])
    with pytest.raises(ValueError):
        CostModel(a=math.nan, b=0.0, c=0.0)


# ----------------------------------------------------------------------------- a real run
def test_tiny_real_run_accounts_for_every_request():
    from course_lib.engine import Engine

    eng = Engine("tiny-target")
    trace = Trace([TraceRequest(0.02 * i, 8 + 4 * i, 3 + i % 3, offset=50 * i) for i in range(5)], "tiny")
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64)
    res = run_real(eng, trace, cfg, slo=SLO(5.0, 1.0))
    assert [t.request_id for t in res.traces] == list(range(5))
    assert [t.n_output for t in res.traces] == [r.max_new_tokens for r in trace.requests]
    assert all(t.ttft >= 0 for t in res.traces) and res.throughput > 0
    assert res.max_step_seqs <= 4 and res.max_step_tokens <= 64
    sim = simulate(trace, res.config, COST)
    assert [t.n_output for t in sim.traces] == [t.n_output for t in res.traces]


def test_prefix_caching_and_swap_if_present():
    import inspect

    from course_lib.engine.attention.paged import PagedBackend

    if "prefix_caching" not in inspect.signature(PagedBackend.__init__).parameters:
        pytest.skip("PagedBackend has no prefix cache yet")
    trace = load_trace("shared_prefix")
    cfg = SchedulerConfig(max_num_seqs=8)
    plain = simulate(trace, cfg, COST, kv_cache="paged")
    cached = simulate(trace, cfg, COST, kv_cache="paged", prefix_caching=True)
    prefill = [sum(s.shape.prefill_tokens for s in r.steps) for r in (plain, cached)]
    assert prefill[1] < prefill[0] and cached.busy_s < plain.busy_s
    assert [t.n_output for t in cached.traces] == [r.max_new_tokens for r in trace.requests]
    if "swap" in getattr(sched, "PREEMPTION_MODES", ()):
        small = SchedulerConfig(max_num_seqs=16, max_kv_tokens=1024, max_model_len=512, preemption="swap")
        res = simulate(load_trace("poisson_small").with_rate(100.0), small, COST, kv_cache="paged")
        assert all(t.n_output > 0 for t in res.traces) and res.max_kv_tokens <= 1024


def test_roofline_cost_model_is_flat_in_decode_rows():
    from course_lib.models.accounting import ModelShape, weight_bytes
    from course_lib.serving.simulator import roofline_cost_model

    cm = roofline_cost_model("llama-3-8b", "H100 SXM", "bf16")
    assert cm.c == 0 and cm.a == pytest.approx(
        weight_bytes(ModelShape.from_name("llama-3-8b"), "bf16") / 3.35e12, rel=0.05
    )
    assert cm.step_time(0, 64) == cm.step_time(0, 1)  # a decode step streams the weights once, whatever the batch
    assert cm.step_time(2048, 0) > cm.step_time(0, 1)
    with pytest.raises(ValueError):
        roofline_cost_model("llama-9")
