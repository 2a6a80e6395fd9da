"""course_lib.parallel.comm: the α–β fit recovers known values, predictions behave, a tiny real run works."""

import math

import pytest

from course_lib.parallel import comm
from course_lib.parallel.comm import CollectiveTiming


def _synthetic(alpha, beta, p=2, sizes=(8, 1024, 2**16, 2**20, 2**24), noise=0.0):
    rows = []
    for i, n in enumerate(sizes):
        for op in comm.OPS:
            t = comm.ring_time(op, n, p, alpha, beta) * (1 + noise * (-1) ** i)
            rows.append(CollectiveTiming(op, p, n, t))
    return rows


def test_ring_formulas():
    assert comm.coefficients("all_reduce", 4) == (6.0, 1.5)
    assert comm.coefficients("all_gather", 4) == (3.0, 0.75)
    assert comm.coefficients("reduce_scatter", 8) == (7.0, 7 / 8)
    # all-reduce = reduce-scatter + all-gather
    for p in (2, 4, 8):
        ar = comm.ring_time("all_reduce", 1e6, p, 1e-5, 1e-9)
        assert ar == pytest.approx(
            comm.ring_time("reduce_scatter", 1e6, p, 1e-5, 1e-9) + comm.ring_time("all_gather", 1e6, p, 1e-5, 1e-9)
        )
    assert comm.ring_time("all_reduce", 1e6, 1, 1e-5, 1e-9) == 0.0


@pytest.mark.parametrize("p", [2, 4])
def test_fit_recovers_known_alpha_beta(p):
    fit = comm.fit_alpha_beta(_synthetic(30e-6, 2e-9, p=p))
    assert fit.alpha == pytest.approx(30e-6, rel=1e-6)
    assert fit.beta == pytest.approx(2e-9, rel=1e-6)
    assert fit.worst_error < 1e-6
    noisy = comm.fit_alpha_beta(_synthetic(30e-6, 2e-9, p=p, noise=0.1))
    assert noisy.alpha == pytest.approx(30e-6, rel=0.15) and noisy.beta == pytest.approx(2e-9, rel=0.15)
    assert noisy.worst_error < 0.25
    assert "worst error" in noisy.table()


def test_fit_stays_non_negative_and_checks_input():
    pure_bandwidth = [CollectiveTiming("all_reduce", 2, n, n * 1e-9) for n in (1e3, 1e6, 1e9)]
    fit = comm.fit_alpha_beta(pure_bandwidth)
    assert fit.alpha >= 0 and fit.beta == pytest.approx(1e-9, rel=1e-3)
    with pytest.raises(ValueError, match="at least 2"):
        comm.fit_alpha_beta(pure_bandwidth[:1])
    with pytest.raises(ValueError, match="seconds > 0"):
        comm.fit_alpha_beta([("all_reduce", 2, 8, 0.0), ("all_reduce", 2, 16, 1.0)])
    with pytest.raises(ValueError, match="op must be"):
        comm.coefficients("broadcast", 2)
    with pytest.raises(ValueError, match="p"):
        comm.coefficients("all_reduce", 0)
    fits = comm.fit_by_op(_synthetic(1e-5, 1e-9))
    assert sorted(fits) == ["all_gather p=2", "all_reduce p=2", "reduce_scatter p=2"]


def test_links_are_sourced_and_predictions_monotonic():
    from course_lib.references import reference

    table = comm.links()
    assert {"nvlink4", "nvlink3", "pcie4_x16", "pcie5_x16", "ib_ndr"} <= set(table)
    assert table["nvlink4"].gbps == 450 and table["nvlink3"].gbps == 300 and table["ib_ndr"].gbps == 50
    for lk in table.values():
        assert reference(lk.reference).url and reference(lk.latency_reference).url
    by_bw = sorted(table.values(), key=lambda lk: lk.gbps)
    for op in comm.OPS:
        for p in (2, 8):
            times = [comm.collective_time(op, 2**26, p, lk) for lk in by_bw]
            assert times == sorted(times, reverse=True)  # more bandwidth -> less time
            sizes = [comm.collective_time(op, n, p, "nvlink4") for n in (0, 1e3, 1e6, 1e9)]
            assert sizes == sorted(sizes)
    with pytest.raises(ValueError, match="link must be"):
        comm.collective_time("all_reduce", 1e6, 2, "carrier-pigeon")
    with pytest.raises(ValueError, match="nbytes"):
        comm.collective_time("all_reduce", -1, 2)


def test_tp_pp_estimates_llama3_70b_on_h100():
    plan = comm.parallel_plan("llama-3-70b", 8, "nvlink4", gpu="H100 SXM")
    assert {(e.tp, e.pp) for e in plan} >= {(1, 1), (8, 1), (1, 8), (2, 4)}
    one = next(e for e in plan if (e.tp, e.pp) == (1, 1))
    assert not one.memory.fits  # 141 GB of bf16 weights do not fit in 80 GB
    tp8 = comm.tp_time_per_token("llama-3-70b", 8, "nvlink4")
    assert tp8.memory.fits and tp8.memory.weights == pytest.approx(one.memory.weights / 8)
    assert tp8.compute_s == pytest.approx(one.compute_s / 8, rel=0.01)
    # Megatron: 2 all-reduces of batch * hidden * 2 bytes per layer
    ar = comm.collective_time("all_reduce", 8192 * 2, 8, "nvlink4")
    assert tp8.tp_comm_s == pytest.approx(2 * 80 * ar)
    assert comm.tp_time_per_token("llama-3-70b", 8, "pcie4_x16").latency_s > tp8.latency_s
    # pipelining a decode step does not shorten one token's path
    pp8 = comm.pp_time("llama-3-70b", 8, "nvlink4")
    assert pp8.latency_s >= one.latency_s and pp8.memory.total == pytest.approx(one.memory.total / 8)
    assert comm.pp_time("llama-3-70b", 4, batch=8, micro_batches=8).bubble == pytest.approx(3 / 11)
    # KV heads are not split past num_kv_heads (8)
    kv8 = comm.memory_per_device("llama-3-70b", 8, batch=4).kv
    assert comm.memory_per_device("llama-3-70b", 16, batch=4).kv == pytest.approx(kv8)
    assert "TPOT" in comm.format_plan(plan)
    with pytest.raises(ValueError, match="tp"):
        comm.estimate("llama-3-70b", tp=3)
    with pytest.raises(ValueError, match="micro_batches"):
        comm.pp_time("llama-3-70b", 2, batch=3, micro_batches=2)


def test_plots_draw_on_their_own_figure():
    from matplotlib.figure import Figure

    fit = comm.fit_alpha_beta(_synthetic(30e-6, 2e-9), label="synthetic")
    assert isinstance(comm.plot_alpha_beta(fit), Figure)
    assert isinstance(comm.plot_plan(comm.parallel_plan()), Figure)


def test_tiny_real_measurement():
    rows = comm.measure_collectives(2, sizes=(64, 2**16), ops=("all_reduce", "all_gather"), repeats=2, warmup=1)
    assert [(r.op, r.p) for r in rows] == [("all_reduce", 2)] * 2 + [("all_gather", 2)] * 2
    assert all(r.seconds > 0 and math.isfinite(r.seconds) for r in rows)
    assert comm.fit_alpha_beta(rows).alpha >= 0
    with pytest.raises(ValueError, match="sizes"):
        comm.measure_collectives(2, sizes=())
    with pytest.raises(ValueError, match="ops"):
        comm.measure_collectives(2, ops=("broadcast",))
