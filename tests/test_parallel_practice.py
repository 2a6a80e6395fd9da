"""Issue 25: sourced link latencies, plans against practice, steady-state PP decode, GiB and vocab-parallel
memory, held-out α–β scoring, bus bandwidth, replicas' ideal, and each new verdict fed a counter-example."""

import dataclasses
import json

import pytest

from course_lib.measure.claims import claim
from course_lib.parallel import alpha_beta, interconnects, plan_advice, planning, pp_decode, replica, tp_measure
from course_lib.parallel.collectives import CollectiveTiming
from course_lib.parallel.pp_schedule import Slot, Timeline

GIB = 2**30


# ----------------------------------------------------------------------------- 1: sourced link figures
def test_links_carry_nccl_latencies_and_a_status_per_figure():
    from course_lib.measure.references import reference

    table = interconnects.links()
    assert table["nvlink4"].latency_us == 0.6 and table["pcie4_x16"].latency_us == 1.0
    assert table["ib_ndr"].latency_us == 2.7 and all(lk.base_latency_us == 6.6 for lk in table.values())
    assert table["ib_ndr"].latency_status == "assumed" and table["nvlink4"].latency_status == "sourced"
    ref = reference("nccl_tuning_latency")
    assert "github.com/NVIDIA/nccl" in ref.url and ref.date == "2024-02-13"
    # an 8-GPU NVLink all-reduce of a few KB: 6.6 + 14 × 0.6 µs plus a negligible byte term, inside 5-20 µs
    t = interconnects.collective_time("all_reduce", 16e3, 8, "nvlink4")
    assert t == pytest.approx(15.0e-6 + 2 * 7 / 8 * 16e3 / 450e9)
    assert 5e-6 < t < 20e-6
    assert interconnects.collective_time("all_reduce", 16e3, 1, "nvlink4") == 0.0  # p = 1 sends nothing
    text = interconnects.format_links()
    assert "assumed" in text and "sourced" in text and "nccl_tuning_latency" in text


def test_a_link_without_a_valid_status_is_refused(tmp_path):
    raw = json.loads(interconnects.interconnects_path().read_text(encoding="utf-8"))
    raw["links"][0]["latency_status"] = "guessed"
    bad = tmp_path / "interconnects.json"
    bad.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(ValueError, match="latency_status"):
        interconnects._load_links(str(bad))


def test_practice_flag_is_silent_with_sourced_latencies_and_fires_on_a_flat_alpha():
    plan = planning.parallel_plan("llama-3-70b", 8, "nvlink4", gpu="H100 SXM", batch=1)
    assert plan_advice.practice_flag(plan) is None
    tp8 = next(e for e in plan if (e.tp, e.pp) == (8, 1))
    assert tp8.latency_s == min(e.latency_s for e in plan if e.memory.fits)
    flat = dataclasses.replace(interconnects.link("nvlink4"), latency_us=5.0, base_latency_us=0.0)
    flag = plan_advice.practice_flag(planning.parallel_plan("llama-3-70b", 8, flat, gpu="H100 SXM", batch=1))
    assert flag and "contradicts deployed practice" in flag and "tp=4" in flag and "160 calls" in flag
    with pytest.raises(ValueError, match="plan must"):
        plan_advice.practice_flag([])


def test_nccl_tree_beats_ring_at_scale_and_bus_bandwidth_convention():
    one_ring, one_tree = (interconnects.nccl_latency_us(a, 1) for a in ("ring", "tree"))
    assert one_ring == pytest.approx(6.6 + 14 * 0.6) and abs(one_ring - one_tree) < 1
    assert interconnects.nccl_latency_us("tree", 16) < interconnects.nccl_latency_us("ring", 16) / 3
    alg, bus = interconnects.bus_bandwidth("all_reduce", 1e9, 0.5, 8)
    assert alg == 2e9 and bus == pytest.approx(2e9 * 14 / 8)
    assert interconnects.bus_bandwidth("all_gather", 1e9, 1.0, 2)[1] == pytest.approx(0.5e9)
    with pytest.raises(ValueError, match="algorithm"):
        interconnects.nccl_latency_us("butterfly", 2)
    with pytest.raises(ValueError, match="seconds"):
        interconnects.bus_bandwidth("all_reduce", 1e6, 0.0, 2)


# ----------------------------------------------------------------------------- 2: PP decode in the steady state
def test_step_s_is_a_steady_state_round_and_never_below_one_pass():
    for m in (1, 2, 4, 8):
        e = planning.pp_time("llama-3-70b", 2, batch=8, micro_batches=m, gpu="H100 SXM")
        assert e.step_s >= e.latency_s * 0.999  # PP never lowers TPOT below one pass through the stages
        if m > 1:  # no fill and drain charged per step (the old model: (m + pp − 1) slots)
            assert e.step_s < (m + 1) * (e.stage_s + e.p2p_s)
    m1 = planning.pp_time("llama-3-70b", 2, batch=8, micro_batches=1, gpu="H100 SXM")
    assert m1.decode_idle == pytest.approx(0.5, abs=0.01) and m1.bubble == 0.5
    m4 = planning.pp_time("llama-3-70b", 2, batch=8, micro_batches=4, gpu="H100 SXM")
    assert m4.decode_idle == 0.0 and m4.bubble == pytest.approx(0.2)
    tp1 = planning.estimate("llama-3-70b", 1, 1, batch=8, gpu="H100 SXM")
    assert tp1.step_s == tp1.latency_s


def _decode_timeline(m: int, t=1.0, c: float = 0.0, steps: int = 6, p: int = 2) -> Timeline:
    """The steady state the pipeline worker runs, simulated: micro-batch j's step k starts on stage 0 when
    its token of step k − 1 is back (c after the last stage finished it) and stage 0 is free. ``t`` is one
    slot's seconds, or a tuple of them per stage."""
    ts = tuple(t) if isinstance(t, tuple) else (t,) * p
    end = {}
    free = [0.0] * p
    slots = []
    for k in range(1, steps + 1):
        for j in range(m):
            for s in range(p):
                ready = end[(p - 1, k - 1, j)] + c if (s == 0 and k > 1) else (end[(s - 1, k, j)] + c if s else 0.0)
                start = max(ready, free[s])
                end[(s, k, j)] = free[s] = start + ts[s]
                slots.append(Slot(s, j, start, start + ts[s], k, ts[s]))
    return Timeline(p, m, slots)


def test_decode_rows_measure_the_steady_state_idle_and_tpot():
    row1 = pp_decode.decode_row(_decode_timeline(1), batch=8)
    assert row1.idle == pytest.approx(0.5) and row1.predicted == pytest.approx(0.5)  # m = 1: by construction
    assert row1.tpot == pytest.approx(2.0)
    row4 = pp_decode.decode_row(_decode_timeline(4), batch=8)
    assert row4.idle == pytest.approx(0.0, abs=1e-9) and row4.tpot == pytest.approx(4.0)
    with_hops = pp_decode.decode_row(_decode_timeline(2, c=0.5), batch=8)
    assert with_hops.t_comm == pytest.approx(0.5) and with_hops.idle == pytest.approx(with_hops.predicted, abs=0.05)
    assert pp_decode.steady_idle(2, 2, 1.0, 0.5) == pytest.approx(1 - 2 / 3)
    # the verdicts of the notebook, fed counter-examples: m = 1 idles far more than "≤ predicted + 0.1" at m=4
    assert not claim("idle within 0.10", row1.idle - row4.predicted, at_most=0.10)
    assert claim("idle within 0.10", row4.idle - row4.predicted, at_most=0.10)
    assert not claim("TPOT not lowered", 0.5, at_least=0.9)  # a run where TPOT halved would fail it
    with pytest.raises(ValueError, match="decode steps"):
        pp_decode.decode_row(_decode_timeline(1, steps=2), batch=8)
    with pytest.raises(ValueError, match="no decode timelines"):
        pp_decode.decode_rows({1: []}, batch=8)


def test_unequal_stages_idle_as_the_per_stage_model_predicts_and_the_equal_stage_one_misses():
    # a last stage 1.5x the first (the LM head and sampling live there): the light stage waits every round
    for m, c in ((1, 0.0), (2, 0.0), (4, 0.0), (4, 0.3), (8, 0.2)):
        row = pp_decode.decode_row(_decode_timeline(m, t=(1.0, 1.5), c=c, steps=20), batch=8)
        assert row.t_stages == pytest.approx((1.0, 1.5)) and row.imbalance == pytest.approx(1.2)
        assert row.idle == pytest.approx(row.predicted, abs=0.02)  # the per-stage model holds
        assert row.replay_free == pytest.approx(pp_decode.steady_idle_stages(m, (1.0, 1.5), 0.0), abs=0.02)
    big = pp_decode.decode_row(_decode_timeline(8, t=(1.0, 1.5), steps=40), batch=8)
    assert big.predicted == pytest.approx(1 - 1.25 / 1.5) and big.equal_stages == 0.0  # 0.167 vs 0
    # counter-example: the equal-stage prediction fails the notebook's verdict on the same run
    assert not claim("idle within 0.10 of equal stages", big.idle - big.equal_stages, at_most=0.10)
    assert claim("idle within 0.10 of the per-stage model", big.idle - big.predicted, at_most=0.10)
    assert pp_decode.idle_cause(big).startswith("the schedule itself: ")
    # equal stages reduce to steady_idle
    assert pp_decode.steady_idle_stages(2, (1.0, 1.0), 0.5) == pytest.approx(pp_decode.steady_idle(2, 2, 1.0, 0.5))
    jitter = dataclasses.replace(big, replay_free=big.predicted + 0.1, idle=big.predicted + 0.1)
    assert pp_decode.idle_cause(jitter).startswith("the schedule itself, through slot-to-slot variation")
    for bad in ((), (1.0, 0.0)):
        with pytest.raises(ValueError, match="t_stages"):
            pp_decode.steady_idle_stages(2, bad, 0.0)
    with pytest.raises(ValueError, match="m >= 1"):
        pp_decode.steady_idle_stages(0, (1.0,), 0.0)


def test_tightened_bubble_check_tells_neighbouring_m_apart():
    from course_lib.parallel.pp_schedule import bubble_fraction

    gap = min(abs(bubble_fraction(2, a) - bubble_fraction(2, b)) for a, b in ((1, 2), (2, 4)))
    assert gap == pytest.approx(2 / 15)
    assert claim("m=4 bubble", abs(0.21 - bubble_fraction(2, 4)), at_most=gap / 2)
    assert not claim("m=4 bubble", abs(bubble_fraction(2, 2) - bubble_fraction(2, 4)), at_most=gap / 2)  # m=2's value


# ----------------------------------------------------------------------------- 5: GiB, vocab-parallel memory
def test_memory_is_in_gib_and_a_replicated_vocabulary_costs_more():
    vp = planning.memory_per_device("llama-3-70b", 8, 1, gpu="H100 SXM")
    rep = planning.memory_per_device("llama-3-70b", 8, 1, gpu="H100 SXM", vocab_parallel=False)
    assert vp.capacity == 80 * GIB
    table = 128256 * 8192 * 2  # one (V, D) bf16 matrix; Llama-3-70B's head is not tied
    assert rep.vocab_bytes == pytest.approx(2 * table) and vp.vocab_bytes == pytest.approx(2 * table / 8)
    assert rep.weights - vp.weights == pytest.approx(2 * table * 7 / 8)
    one = planning.memory_per_device("llama-3-70b", 1, 1, gpu="H100 SXM")
    assert one.weights == pytest.approx(planning.memory_per_device("llama-3-70b", 1, 1, vocab_parallel=False).weights)
    pp2 = planning.memory_per_device("llama-3-70b", 1, 2, gpu="H100 SXM")
    assert pp2.weights == pytest.approx((one.weights - 2 * table) / 2 + table)  # an end stage holds one matrix
    with pytest.raises(ValueError, match="vocab_parallel"):
        planning.memory_per_device("llama-3-70b", 8, 1, vocab_parallel="yes")
    e_vp = planning.estimate("llama-3-70b", 8, 1, batch=1, gpu="H100 SXM")
    e_rep = planning.estimate("llama-3-70b", 8, 1, batch=1, gpu="H100 SXM", vocab_parallel=False)
    assert e_rep.compute_s > e_vp.compute_s and e_rep.tp_comm_s < e_vp.tp_comm_s


# ----------------------------------------------------------------------------- 10: break-even, TP vs DP
def test_tp_break_even_balances_saved_reads_and_added_all_reduces():
    be = plan_advice.tp_break_even(30, 576, 2, "nvlink4", bandwidth=3.35e12)
    ar = interconnects.collective_time("all_reduce", 576 * 2, 2, "nvlink4")
    assert be.comm_s == pytest.approx(60 * ar)
    assert be.weight_bytes * (1 - 1 / 2) / 3.35e12 == pytest.approx(be.comm_s)
    assert be.weight_bytes > 0.27e9  # SmolLM2-135M in bf16 (0.27 GB) is below it: TP=2 does not pay
    assert "TP=2" in str(be)
    with pytest.raises(ValueError, match="tp"):
        plan_advice.tp_break_even(30, 576, 1, bandwidth=1e12)
    with pytest.raises(ValueError, match="bandwidth"):
        plan_advice.tp_break_even(30, 576, 2, bandwidth=0)


def test_tp_vs_dp_uses_the_same_gpus_and_total_batch():
    tp, rep = plan_advice.tp_vs_dp("llama-3-8b", 8, batch=64)
    assert (tp.tp, tp.batch) == (8, 64) and (rep.tp, rep.batch) == (1, 8)
    assert "replicas" in plan_advice.format_tp_vs_dp(batches=(8,))
    with pytest.raises(ValueError, match="split evenly"):
        plan_advice.tp_vs_dp(batch=12)


# ----------------------------------------------------------------------------- 4: held-out α–β score
def _timings(alpha=20e-6, beta=1e-9, sizes=(4, 64, 1024, 2**14, 2**18, 2**20, 2**22, 2**24)):
    return [CollectiveTiming("all_reduce", 2, n, alpha * 2 + n * beta) for n in sizes]


def test_held_out_scores_sizes_the_fit_never_saw():
    fits, scored = alpha_beta.held_out(_timings())
    assert len(scored) == 3 and max(abs(e) for _, e in scored) < 1e-6  # exact data: exact predictions
    assert {t.nbytes for t, _ in scored}.isdisjoint({t.nbytes for t in fits["all_reduce"].timings})
    bad = _timings()
    bad[3] = dataclasses.replace(bad[3], seconds=bad[3].seconds * 3)  # a held-out size 3× slow
    _, scored = alpha_beta.held_out(bad)
    worst = max(abs(e) for _, e in scored)
    assert not claim("within ±30%", worst, at_most=0.30)  # the notebook's verdict, fed a counter-example
    with pytest.raises(ValueError, match="every"):
        alpha_beta.held_out(_timings(), every=1)
    with pytest.raises(ValueError, match="hold out"):
        alpha_beta.held_out(_timings(sizes=(4, 64)))


# ----------------------------------------------------------------------------- 3 and 4: replicas, TP on a CPU
def test_replica_ideal_comes_from_the_engine_own_times():
    r = replica.ReplicaResult([[1]], [[0]], [2.0], 10, probe_s=[1.1, 0.9])
    assert r.ideal_speedup == pytest.approx(2.0 / 1.1)
    assert replica.ReplicaResult([[1]], [[0]], [2.0], 10).ideal_speedup is None
    with pytest.raises(ValueError, match="probe_split needs n_replicas=1"):
        replica.serve_replicas("tiny-target", [[1, 2]], n_replicas=2, probe_split=2)
    with pytest.raises(ValueError, match="probe_split must be"):
        replica.serve_replicas("tiny-target", [[1, 2]], n_replicas=1, probe_split=-1)


def test_wait_split_separates_waiting_from_the_collective():
    r0 = [("all_reduce", 0.0, 1.0), ("all_reduce", 2.0, 2.5)]  # rank 0 came first both times
    r1 = [("all_reduce", 0.8, 1.0), ("all_reduce", 2.4, 2.5)]
    out = tp_measure._wait_split([r0, r1])
    assert out["allreduce_wait_s"] == pytest.approx(0.6) and out["allreduce_pure_s"] == pytest.approx(0.15)
    assert tp_measure._wait_split([r0]) == {} and tp_measure._wait_split([r0, r1[:1]]) == {}


def test_collectives_refuse_a_bad_backend():
    from course_lib.parallel.collectives import measure_collectives

    with pytest.raises(ValueError, match="backend"):
        measure_collectives(2, [64], backend="mpi")


def test_recorded_smollm2_run_loads_as_tp_equality():
    from course_lib.parallel import tp_record

    res, meta = tp_record.load_recorded()
    assert res.world_size == 3 and len(res.ranks) == 3 and res.answers
    assert meta["command"].startswith("python -m course_lib.parallel.tp_record") and meta["date"]
    assert res.argmax_equal and res.greedy_equal and res.max_abs_diff <= 1e-3
    assert "TP=3" in str(res)


def test_plot_legends_sit_beside_or_above_the_data():
    from course_lib.parallel import plots

    fig = plots.plot_alpha_beta(alpha_beta.fit_alpha_beta(_timings()))
    legend = fig.axes[0].get_legend()
    assert legend.get_bbox_to_anchor().x0 >= fig.axes[0].get_window_extent().x1  # outside, right of the axes
    plan = planning.parallel_plan("llama-3-70b", 8, "nvlink4", gpu="H100 SXM")
    fig = plots.plot_plan(plan)
    for ax in fig.axes:
        tallest = max(p.get_y() + p.get_height() for p in ax.patches)
        assert tallest <= ax.get_ylim()[1] / 1.25  # head-room above the tallest bar for the legend


# ----------------------------------------------------------------------------- 10: expert and context parallelism
def test_moe_reference_and_routing():
    import torch

    from course_lib.parallel import expert_parallel as ep

    w = ep.make_moe(16, 32, 4, seed=1)
    x = torch.randn(10, 16, generator=torch.Generator().manual_seed(2))
    idx, gate = ep.route(x, w, 2)
    assert idx.shape == (10, 2) and torch.allclose(gate.sum(-1), torch.ones(10))
    dense = torch.stack(
        [sum(gate[n, j] * ep.expert_forward(x[n : n + 1], w, int(idx[n, j]))[0] for j in range(2)) for n in range(10)]
    )
    assert torch.allclose(ep.moe_reference(x, w, 2), dense, atol=1e-6)
    with pytest.raises(ValueError, match="k must be"):
        ep.route(x, w, 5)
    with pytest.raises(ValueError, match="num_experts"):
        ep.make_moe(16, 32, 0)


def test_ring_attention_merge_equals_softmax_attention_in_one_process():
    import torch

    from course_lib.parallel import ring_attention as ra

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 2, 4, generator=g) for _ in range(3))
    pos = torch.arange(8)
    acc, mx, sm = torch.zeros_like(q), torch.full((2, 8), float("-inf")), torch.zeros(2, 8)
    for blk in (slice(4, 8), slice(0, 4)):  # blocks in any order: the merge is exact
        acc, mx, sm = ra.merge(acc, mx, sm, *ra.block_attention(q, k[blk], v[blk], pos, pos[blk]))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    ).transpose(0, 1)
    assert torch.allclose(acc / sm.T[..., None], ref, atol=1e-6)
    assert ra.ring_bytes_per_rank(256, 4, 32, 2) == 128 * 4 * 32 * 4 * 2


@pytest.mark.parametrize("method", ["all_to_all", "all_gather"])
def test_expert_and_ring_parallel_equal_one_process(method):
    from course_lib.parallel import expert_parallel as ep
    from course_lib.parallel import ring_attention as ra
    from course_lib.parallel.launcher import launch

    out = launch(ep.ep_and_ring_worker, 2, {"tokens": 32, "exchange_method": method}, {"seq_len": 64})
    for r in out:
        assert r["ep"]["max_abs_diff"] <= 1e-5 and r["ep"]["method"] == method
        assert sum(r["ep"]["expert_tokens"]) == 32 * 2  # every token reached its top-2 experts
        assert r["ring"]["max_abs_diff"] <= 1e-5
        assert r["ring"]["bytes_sent"] == ra.ring_bytes_per_rank(64, 4, 32, 2)
    a2a, gathered = (out[0]["ep"]["bytes_sent"], out[0]["ep"]["rows_to_others"] * out[0]["ep"]["row_bytes"])
    if method == "all_to_all":
        assert a2a < 2 * gathered + 1  # dispatch rows out and combine rows back, no more
    # a counter-example for the notebook's verdict: a wrong combine (weights dropped) is far off
    assert not claim("EP equals one process", 0.5, at_most=1e-5)


# ----------------------------------------------------------------------------- counter-examples for the other verdicts
def test_sp_bytes_verdict_fails_when_the_reduce_scatter_falls_back_to_all_reduce():
    from course_lib.parallel.tp_comm import tp_comm_bytes

    tp = tp_comm_bytes(256, 6, 128, 2)["all_reduce"]
    sp = tp_comm_bytes(256, 6, 128, 2, sequence_parallel=True)
    assert claim("SP sends no more than TP", (sp["reduce_scatter"] + sp["all_gather"]) / tp, at_most=1.10)
    fallback = 2 * sp["reduce_scatter"] + sp["all_gather"]  # reduce-scatter done as an all-reduce: 2× its bytes
    assert not claim("SP sends no more than TP", fallback / tp, at_most=1.10)


def test_overhead_bound_and_replica_verdicts_fail_on_counter_examples():
    from course_lib.models.accounting import ModelShape, weight_bytes

    tiny = weight_bytes(ModelShape.from_embedded("tiny-target"), "fp32")
    bw = 20e9
    assert claim("overhead-bound", tiny / bw / 0.010, at_most=0.25)  # a 10 ms step: the reads are 10% of it
    assert not claim("overhead-bound", tiny / bw / (tiny / bw * 1.5), at_most=0.25)  # a bandwidth-bound step
    one = replica.ReplicaResult([[1]], [[0]], [2.0], 100, probe_s=[1.0, 1.0])  # ideal 2×
    two_good, two_bad = replica.ReplicaResult([[1]], [[0]], [1.1], 100), replica.ReplicaResult([[1]], [[0]], [2.0], 100)
    assert claim("≥ 80% of ideal", two_good.tokens_per_s / one.tokens_per_s / one.ideal_speedup, at_least=0.8)
    assert not claim("≥ 80% of ideal", two_bad.tokens_per_s / one.tokens_per_s / one.ideal_speedup, at_least=0.8)


def test_pure_all_reduce_verdict_fails_when_waiting_is_billed_to_the_call():
    fit = alpha_beta.fit_alpha_beta(_timings())
    predicted = fit.predict("all_reduce", 4096, 2)
    r0 = [("all_reduce", 0.0, predicted * 3)]  # rank 0 arrived first and waited
    r1 = [("all_reduce", predicted * 2, predicted * 3)]
    split = tp_measure._wait_split([r0, r1])
    assert claim("call alone within ±30% of the fit", abs(split["allreduce_pure_s"] / predicted - 1), at_most=0.30)
    assert not claim("rank 0's whole time within ±30%", abs(3 * predicted / predicted - 1), at_most=0.30)


def _serialised_timeline(m: int = 4, t: float = 1.0, steps: int = 6, p: int = 2) -> Timeline:
    """A run whose stages never overlap (one core for both, or a serialising wait): each slot starts when
    the previous slot of any stage ended, though each stage only did its own CPU work ``t / 2`` of it."""
    slots, now = [], 0.0
    for k in range(1, steps + 1):
        for j in range(m):
            for s in range(p):
                slots.append(Slot(s, j, now, now + t, k, t / 2, now))
                now += t
    return Timeline(p, m, slots)


def test_decode_trace_tells_the_schedule_from_the_machine():
    full = pp_decode.decode_row(_decode_timeline(4), batch=8)  # simulated: the cpu of each slot is its t
    assert full.replay_idle == pytest.approx(full.idle, abs=1e-9) and full.overlap > 0.8
    # counter-example: stages that never overlap idle ~0.5 against ~0 predicted, and the trace names why
    ser = pp_decode.decode_row(_serialised_timeline(), batch=8)
    assert ser.idle == pytest.approx(0.5, abs=0.05) and ser.overlap == pytest.approx(0.0)
    assert ser.cpu_share == pytest.approx(0.5) and ser.replay_idle < 0.1 and ser.replay_free < 0.1
    assert not claim("idle ≤ predicted + 0.10", ser.idle - ser.predicted, at_most=0.10)
    assert pp_decode.idle_cause(ser).startswith("the machine")
    # "micro-batches in flight fill the pipeline" (idle at m ≤ half of m = 1's): holds when they overlap, fails
    # when the stages never run at once
    m1 = pp_decode.decode_row(_decode_timeline(1), batch=8)
    assert claim("m fills the pipe", full.idle / m1.idle, at_most=0.5)
    assert not claim("m fills the pipe", ser.idle / m1.idle, at_most=0.5)
    # the schedule's own miss: m = 1 idles 0.5 in the replay too
    assert pp_decode.idle_cause(pp_decode.decode_row(_decode_timeline(1), batch=8)).startswith("the schedule")
    # full CPU but long waits: the messages
    assert ser.outside == pytest.approx(0.5, abs=0.05)  # never blocked in a receive: the time is between slots
    between = dataclasses.replace(ser, cpu_share=1.0)
    assert pp_decode.idle_cause(between).startswith("time between the slots")
    waits = dataclasses.replace(ser, cpu_share=1.0, blocked=0.45, outside=0.05)
    assert pp_decode.idle_cause(waits).startswith("waiting on messages")
    hops = dataclasses.replace(ser, cpu_share=1.0, replay_idle=ser.idle)  # only the hand-offs explain it
    assert pp_decode.idle_cause(hops).startswith("the hand-offs")
    replay = pp_decode.replay_decode(_serialised_timeline())
    assert replay.stages == 2 and len(replay.slots) == len(_serialised_timeline().slots)
    with pytest.raises(ValueError, match="CPU times"):
        pp_decode.replay_decode(Timeline(2, 1, [Slot(0, 0, 0.0, 1.0, 1)]))
