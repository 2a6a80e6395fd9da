"""course_lib.parallel.collectives, alpha_beta, interconnects, planning: the α–β fit recovers known values, predictions behave, a tiny real run works."""

import math
import sys

import pytest

from course_lib.parallel import alpha_beta, collectives, interconnects, planning, plots
from course_lib.parallel.collectives import CollectiveTiming


def _synthetic(alpha, beta, p=2, sizes=(8, 1024, 2**16, 2**20, 2**24), noise=0.0):
    rows = []
    for i, n in enumerate(sizes):
        for op in collectives.OPS:
            t = alpha_beta.ring_time(op, n, p, alpha, beta) * (1 + noise * (-1) ** i)
            rows.append(CollectiveTiming(op, p, n, t))
    return rows


def test_ring_formulas():
    assert alpha_beta.coefficients("all_reduce", 4) == (6.0, 1.5)
    assert alpha_beta.coefficients("all_gather", 4) == (3.0, 0.75)
    assert alpha_beta.coefficients("reduce_scatter", 8) == (7.0, 7 / 8)
    # all-reduce = reduce-scatter + all-gather
    for p in (2, 4, 8):
        ar = alpha_beta.ring_time("all_reduce", 1e6, p, 1e-5, 1e-9)
        assert ar == pytest.approx(
            alpha_beta.ring_time("reduce_scatter", 1e6, p, 1e-5, 1e-9)
            + alpha_beta.ring_time("all_gather", 1e6, p, 1e-5, 1e-9)
        )
    assert alpha_beta.ring_time("all_reduce", 1e6, 1, 1e-5, 1e-9) == 0.0


@pytest.mark.parametrize("p", [2, 4])
def test_fit_recovers_known_alpha_beta(p):
    fit = alpha_beta.fit_alpha_beta(_synthetic(30e-6, 2e-9, p=p))
    assert fit.alpha == pytest.approx(30e-6, rel=1e-6)
    assert fit.beta == pytest.approx(2e-9, rel=1e-6)
    assert fit.worst_error < 1e-6
    noisy = alpha_beta.fit_alpha_beta(_synthetic(30e-6, 2e-9, p=p, noise=0.1))
    assert noisy.alpha == pytest.approx(30e-6, rel=0.15) and noisy.beta == pytest.approx(2e-9, rel=0.15)
    assert noisy.worst_error < 0.25
    assert "worst error" in noisy.table()


def test_fit_stays_non_negative_and_checks_input():
    pure_bandwidth = [CollectiveTiming("all_reduce", 2, n, n * 1e-9) for n in (1e3, 1e6, 1e9)]
    fit = alpha_beta.fit_alpha_beta(pure_bandwidth)
    assert fit.alpha >= 0 and fit.beta == pytest.approx(1e-9, rel=1e-3)
    with pytest.raises(ValueError, match="at least 2"):
        alpha_beta.fit_alpha_beta(pure_bandwidth[:1])
    with pytest.raises(ValueError, match="seconds > 0"):
        alpha_beta.fit_alpha_beta([("all_reduce", 2, 8, 0.0), ("all_reduce", 2, 16, 1.0)])
    with pytest.raises(ValueError, match="op must be"):
        alpha_beta.coefficients("broadcast", 2)
    with pytest.raises(ValueError, match="p"):
        alpha_beta.coefficients("all_reduce", 0)
    fits = alpha_beta.fit_by_op(_synthetic(1e-5, 1e-9))
    assert sorted(fits) == ["all_gather p=2", "all_reduce p=2", "reduce_scatter p=2"]


MiB = 2**20
KNEE_SIZES = (8, 1024, 2**16, 2**20, 4 * MiB, 16 * MiB, 24 * MiB, 32 * MiB, 48 * MiB, 64 * MiB)


def _two_regime(alpha, beta, beta_large, knee, p=2, sizes=KNEE_SIZES, ops=collectives.OPS, noise=0.0):
    """Timings of the two-regime model: messages above ``knee`` pay ``beta_large`` per byte for all their bytes."""
    rows = []
    for i, n in enumerate(sizes):
        for op in ops:
            t = alpha_beta.ring_time(op, n, p, alpha, beta if n <= knee else beta_large) * (1 + noise * (-1) ** i)
            rows.append(CollectiveTiming(op, p, n, t))
    return rows


@pytest.mark.parametrize("knee", [24 * MiB, 4 * MiB])
@pytest.mark.parametrize("p", [2, 4])
def test_two_regime_fit_recovers_alpha_beta_beta_large_and_knee(knee, p):
    rows = _two_regime(250e-6, 0.5e-9, 1.4e-9, knee, p=p)
    fit = alpha_beta.fit_alpha_beta(rows, label="synthetic", knee="auto")
    assert fit.knee_bytes == knee  # the largest size of the first regime, exactly
    assert fit.knee_next_bytes == min(n for n in KNEE_SIZES if n > knee)
    assert fit.alpha == pytest.approx(250e-6, rel=1e-6)
    assert fit.beta == pytest.approx(0.5e-9, rel=1e-6)
    assert fit.beta_large == pytest.approx(1.4e-9, rel=1e-6)
    assert fit.worst_error < 1e-6
    assert fit.gbps == pytest.approx(2.0) and fit.gbps_large == pytest.approx(1 / 1.4)
    # predict switches β at the knee; the datasheet path (collective_time) honours a fit's knee too
    assert fit.beta_at(knee) == fit.beta and fit.beta_at(knee + 1) == fit.beta_large
    assert fit.predict("all_gather", 64 * MiB, p) == pytest.approx(
        alpha_beta.ring_time("all_gather", 64 * MiB, p, 250e-6, 1.4e-9)
    )
    assert interconnects.collective_time("all_gather", 64 * MiB, p, fit) == fit.predict("all_gather", 64 * MiB, p)
    # the plain fit of the same data misses; a knee given by hand gives the same fit as the one found
    assert alpha_beta.fit_alpha_beta(rows).worst_error > 0.3
    fixed = alpha_beta.fit_alpha_beta(rows, knee=knee)
    assert (fixed.alpha, fixed.beta, fixed.beta_large) == pytest.approx((fit.alpha, fit.beta, fit.beta_large))
    # printed: the knee, β_large and the regime of every size
    text = fit.describe()
    assert "β_large" in text and "knee between" in text and "worst error 0%" in text
    assert "regime" in fit.table() and fit.table().count("large") >= 2
    assert repr(fit).startswith("<AlphaBetaFit synthetic:")
    worst_timing, worst_err = fit.worst()
    assert worst_timing in fit.timings and abs(worst_err) == fit.worst_error
    # page faults: synthetic timings have no counts; with counts, the knee sits where fresh pages start
    assert fit.page_fault_agreement() is None
    counted = [
        CollectiveTiming(t.op, t.p, t.nbytes, t.seconds, t.nbytes / collectives.PAGE_BYTES if t.nbytes > knee else 1.0)
        for t in rows
    ]
    assert counted[-1].fresh_page_share == 1.0 and counted[0].fresh_page_share > 0.5  # 1 fault on 8 bytes
    with_faults = alpha_beta.fit_alpha_beta(counted, knee="auto")
    assert with_faults.page_fault_agreement() == 1.0  # messages of 256 pages (1 MiB) and more
    assert with_faults.page_fault_mismatches() == []
    assert {t.nbytes for t in with_faults.page_fault_mismatches(min_pages=0)} == {8, 1024}
    assert with_faults.page_fault_agreement(min_pages=0) == pytest.approx(0.8)  # 8 B and 1 KiB: 1 fault reads fresh
    assert alpha_beta.fit_alpha_beta(counted).page_fault_agreement() is None  # no knee


def test_two_regime_fit_with_noise_and_without_a_knee():
    noisy = alpha_beta.fit_alpha_beta(_two_regime(250e-6, 0.5e-9, 1.4e-9, 24 * MiB, noise=0.1), knee="auto")
    assert noisy.knee_bytes == 24 * MiB
    assert noisy.beta == pytest.approx(0.5e-9, rel=0.15) and noisy.beta_large == pytest.approx(1.4e-9, rel=0.15)
    assert noisy.worst_error < 0.25
    # one regime in the data: "auto" keeps the plain model, exact or noisy
    for noise in (0.0, 0.1):
        plain = alpha_beta.fit_alpha_beta(_two_regime(250e-6, 0.5e-9, 0.5e-9, 24 * MiB, noise=noise), knee="auto")
        assert plain.knee_bytes is None and plain.beta_large is None and plain.gbps_large is None
        assert "β_large" not in plain.describe() and "regime" not in plain.table()
    # cheaper bytes past a size are not a knee of this model (and one odd last point is not a regime)
    faster = alpha_beta.fit_alpha_beta(_two_regime(250e-6, 1.4e-9, 0.5e-9, 24 * MiB), knee="auto")
    assert faster.knee_bytes is None
    last_only = alpha_beta.fit_alpha_beta(_two_regime(250e-6, 0.5e-9, 1.4e-9, 48 * MiB), knee="auto")
    assert last_only.knee_bytes is None
    # fit_by_op finds a knee per op: here only the all-gather has one
    rows = _two_regime(250e-6, 0.5e-9, 1.4e-9, 24 * MiB, ops=("all_gather",))
    rows += _two_regime(150e-6, 0.6e-9, 0.6e-9, 24 * MiB, ops=("all_reduce",))
    fits = alpha_beta.fit_by_op(rows)
    assert fits["all_gather p=2"].knee_bytes == 24 * MiB and fits["all_reduce p=2"].knee_bytes is None
    assert all(f.knee_bytes is None for f in alpha_beta.fit_by_op(rows, knee=None).values())


def test_two_regime_fit_rejects_bad_input():
    rows = _two_regime(250e-6, 0.5e-9, 1.4e-9, 24 * MiB)
    for bad in (0, -1, math.nan, math.inf, "llc", True):
        with pytest.raises(ValueError, match="knee must be"):
            alpha_beta.fit_alpha_beta(rows, knee=bad)
    with pytest.raises(ValueError, match="one above"):
        alpha_beta.fit_alpha_beta(rows, knee=64 * MiB)  # nothing measured above it
    with pytest.raises(ValueError, match="two measured sizes at or below"):
        alpha_beta.fit_alpha_beta(rows, knee=8)
    with pytest.raises(ValueError, match="give both or neither"):
        alpha_beta.AlphaBetaFit(1e-5, 1e-9, tuple(rows), knee_bytes=1e6)
    with pytest.raises(ValueError, match="knee_bytes > 0"):
        alpha_beta.AlphaBetaFit(1e-5, 1e-9, tuple(rows), knee_bytes=-1.0, beta_large=1e-9)
    few = alpha_beta.fit_alpha_beta(rows[:9], knee="auto")  # 3 sizes: too few for two regimes of two sizes each
    assert few.knee_bytes is None
    with pytest.raises(ValueError, match="nbytes"):
        alpha_beta.fit_alpha_beta(rows, knee="auto").predict("all_reduce", -1, 2)


def test_links_are_sourced_and_predictions_monotonic():
    from course_lib.measure.references import reference

    table = interconnects.links()
    assert {"nvlink4", "nvlink3", "pcie4_x16", "pcie5_x16", "ib_ndr"} <= set(table)
    assert table["nvlink4"].gbps == 450 and table["nvlink3"].gbps == 300 and table["ib_ndr"].gbps == 50
    for lk in table.values():
        assert reference(lk.reference).url and reference(lk.latency_reference).url
    by_bw = sorted(table.values(), key=lambda lk: lk.gbps)
    for op in collectives.OPS:
        for p in (2, 8):
            times = [interconnects.collective_time(op, 2**26, p, lk) for lk in by_bw]
            assert times == sorted(times, reverse=True)  # more bandwidth -> less time
            sizes = [interconnects.collective_time(op, n, p, "nvlink4") for n in (0, 1e3, 1e6, 1e9)]
            assert sizes == sorted(sizes)
    with pytest.raises(ValueError, match="link must be"):
        interconnects.collective_time("all_reduce", 1e6, 2, "carrier-pigeon")
    with pytest.raises(ValueError, match="nbytes"):
        interconnects.collective_time("all_reduce", -1, 2)


def test_tp_pp_estimates_llama3_70b_on_h100():
    plan = planning.parallel_plan("llama-3-70b", 8, "nvlink4", gpu="H100 SXM")
    assert {(e.tp, e.pp) for e in plan} >= {(1, 1), (8, 1), (1, 8), (2, 4)}
    one = next(e for e in plan if (e.tp, e.pp) == (1, 1))
    assert not one.memory.fits  # 141 GB of bf16 weights do not fit in 80 GB
    tp8 = planning.tp_time_per_token("llama-3-70b", 8, "nvlink4")
    assert tp8.memory.fits and tp8.memory.weights == pytest.approx(one.memory.weights / 8)
    assert tp8.compute_s == pytest.approx(one.compute_s / 8, rel=0.01)
    # Megatron: 2 all-reduces of batch * hidden * 2 bytes per layer
    ar = interconnects.collective_time("all_reduce", 8192 * 2, 8, "nvlink4")
    logits = interconnects.collective_time("all_gather", 128256 * 2, 8, "nvlink4")  # vocab-parallel head
    assert tp8.tp_comm_s == pytest.approx(2 * 80 * ar + ar + logits)  # + the vocab-parallel embedding's
    replicated = planning.tp_time_per_token("llama-3-70b", 8, "nvlink4", vocab_parallel=False)
    assert replicated.tp_comm_s == pytest.approx(2 * 80 * ar)
    assert planning.tp_time_per_token("llama-3-70b", 8, "pcie4_x16").latency_s > tp8.latency_s
    # pipelining a decode step does not shorten one token's path
    pp8 = planning.pp_time("llama-3-70b", 8, "nvlink4")
    table = 128256 * 8192 * 2  # an end stage also holds the embedding or the LM head
    assert pp8.latency_s >= one.latency_s
    assert pp8.memory.weights == pytest.approx((one.memory.weights - 2 * table) / 8 + table)
    assert pp8.memory.kv == pytest.approx(one.memory.kv / 8)
    assert planning.pp_time("llama-3-70b", 4, batch=8, micro_batches=8).bubble == pytest.approx(3 / 11)
    # KV heads are not split past num_kv_heads (8)
    kv8 = planning.memory_per_device("llama-3-70b", 8, batch=4).kv
    assert planning.memory_per_device("llama-3-70b", 16, batch=4).kv == pytest.approx(kv8)
    assert "TPOT" in planning.format_plan(plan)
    with pytest.raises(ValueError, match="tp"):
        planning.estimate("llama-3-70b", tp=3)
    with pytest.raises(ValueError, match="micro_batches"):
        planning.pp_time("llama-3-70b", 2, batch=3, micro_batches=2)


def test_plots_draw_on_their_own_figure():
    from matplotlib.figure import Figure

    fit = alpha_beta.fit_alpha_beta(_synthetic(30e-6, 2e-9), label="synthetic")
    assert isinstance(plots.plot_alpha_beta(fit), Figure)
    assert isinstance(plots.plot_plan(planning.parallel_plan()), Figure)
    fits = alpha_beta.fit_by_op(_two_regime(250e-6, 0.5e-9, 1.4e-9, 24 * MiB))
    fig = plots.plot_alpha_beta(fits.values(), links_to_show=(), marks={"L3": 32 * MiB})
    ax = fig.axes[0]
    knee_lines = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert len(knee_lines) == 3 and all(ln.get_xdata()[0] == 24 * MiB for ln in knee_lines)
    assert any(t.get_text().strip() == "L3" for t in ax.texts)
    with pytest.raises(ValueError, match="AlphaBetaFit"):
        plots.plot_alpha_beta([])


def test_tiny_real_measurement():
    rows = collectives.measure_collectives(
        2, sizes=(64, 2**16), ops=("all_reduce", "all_gather"), repeats=2, warmup=1, min_time_s=0.01, launches=2
    )
    assert [(r.op, r.p) for r in rows] == [("all_reduce", 2)] * 2 + [("all_gather", 2)] * 2
    assert all(r.seconds > 0 and math.isfinite(r.seconds) for r in rows)
    if sys.platform == "linux":  # minor page faults are counted (a stray fault or two can land in any call, so
        # the fresh-page share means something only for large messages: see the notebook's ≥ 1 MiB check)
        assert all(r.page_faults is not None and r.page_faults >= 0 for r in rows)
    assert alpha_beta.fit_alpha_beta(rows).alpha >= 0
    with pytest.raises(ValueError, match="sizes"):
        collectives.measure_collectives(2, sizes=())
    with pytest.raises(ValueError, match="ops"):
        collectives.measure_collectives(2, ops=("broadcast",))
    with pytest.raises(ValueError, match="quantile"):
        collectives.measure_collectives(2, quantile=1.5)
    with pytest.raises(ValueError, match="min_time_s"):
        collectives.measure_collectives(2, min_time_s=-1)
    with pytest.raises(ValueError, match="max_repeats"):
        collectives.measure_collectives(2, repeats=5, max_repeats=3)
    with pytest.raises(ValueError, match="launches"):
        collectives.measure_collectives(2, launches=0)
