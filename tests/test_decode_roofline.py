"""Decode on the roofline (chapter 01): the engine's timed steps, MBU, the floors and the bend of TPOT(b)."""

import math

import pytest

from course_lib.bottlenecks.decode_roofline import (
    DecodeStep,
    bend_batch,
    decode_sweep,
    linear_path,
    time_decode_steps,
)
from course_lib.engine import Engine
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.models import accounting

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def engine():
    return Engine("tiny-target", config=SchedulerConfig(max_model_len=64, max_num_seqs=4))


def test_timed_steps_count_the_engine_bytes_and_leave_it_idle(engine):
    shape = accounting.ModelShape.from_config(engine.hf_model.config)
    d = time_decode_steps(engine, batch=2, context_len=8, steps=3, warmup=1)
    assert len(d.step_s) == 3 and not engine.has_unfinished()
    assert d.context_len == pytest.approx(8 + 1 + 2)  # keys of the timed steps 1..3: 10, 11, 12
    assert d.flops == pytest.approx(accounting.decode_flops(shape, 11, 2))
    assert d.bytes == pytest.approx(accounting.decode_step_bytes(shape, 11, 2, "fp32"))
    assert d.tokens_per_s == pytest.approx(2 / d.tpot_s)
    assert d.mbu(1e9) == pytest.approx(d.bytes / d.tpot_s / 1e9)
    assert d.point().seconds == d.tpot_s and d.point().intensity == pytest.approx(d.intensity)


def test_sweep_intensity_grows_with_the_batch(engine):
    rows = decode_sweep(engine, [1, 2, 4], context_len=4, steps=2, warmup=0)
    assert [r.batch for r in rows] == [1, 2, 4]
    # weights dominate the bytes, so the intensity is about proportional to the batch
    assert rows[2].intensity / rows[0].intensity == pytest.approx(4, rel=0.2)
    assert rows[2].flops == pytest.approx(4 * rows[0].flops)


def test_bad_input_is_refused_before_any_work(engine):
    with pytest.raises(ValueError, match="max_num_seqs"):
        time_decode_steps(engine, batch=5, context_len=4)
    with pytest.raises(ValueError, match="max_model_len"):
        time_decode_steps(engine, batch=1, context_len=60, steps=5)
    with pytest.raises(ValueError, match="steps"):
        time_decode_steps(engine, batch=1, context_len=4, steps=0)
    with pytest.raises(ValueError, match="warmup"):
        time_decode_steps(engine, batch=1, context_len=4, warmup=-1)
    with pytest.raises(ValueError, match="strictly increasing"):
        decode_sweep(engine, [2, 1], context_len=4)
    assert not engine.has_unfinished()
    engine.add_request([5, 6, 7])
    with pytest.raises(ValueError, match="idle"):
        time_decode_steps(engine, batch=1, context_len=4)
    while engine.has_unfinished():
        engine.step()


def test_linear_path_names_the_packed_switch(engine):
    skinny = [lin for _, lin in engine.model.linears() if getattr(lin, "enabled", False)]
    if not skinny:
        pytest.skip("no oneDNN on this torch: every matmul is F.linear")
    limit = min(lin.max_packed_rows for lin in skinny)
    assert linear_path(engine, limit) == "oneDNN packed"
    assert linear_path(engine, limit + 1) == "F.linear"
    with pytest.raises(ValueError, match="rows"):
        linear_path(engine, 0)


def test_linear_path_names_the_native_step_and_the_course_gemv(engine):
    from course_lib.kernels import cpu_gemv

    if not cpu_gemv.available():
        pytest.skip("no C kernels here: the course's GEMV and the native step are not built")
    time_decode_steps(engine, batch=1, context_len=4, steps=1, warmup=0)  # the cache exists from here on
    assert linear_path(engine, 1) == "native C step"  # decode="auto", the default
    eager = Engine(engine.hf_model, engine.tokenizer, config=engine.config, decode="eager")
    assert linear_path(eager, cpu_gemv.MAX_ROWS) == "course GEMV"
    assert linear_path(eager, cpu_gemv.MAX_ROWS + 1) == "oneDNN packed"


def step(batch=1, seconds=(0.02, 0.021, 0.019), flops=1e8, bytes=5e8):
    return DecodeStep("t", batch, 16.0, seconds, flops, bytes)


def test_floors_of_a_step():
    d = step()
    f = d.floors(bandwidth=25e9, peak_flops=1e11, overhead_s=1e-3)
    assert f["bandwidth-bound"] == pytest.approx(0.02) and f["compute-bound"] == pytest.approx(1e-3)
    assert f["overhead-bound"] == 1e-3
    assert step(flops=1e10).floors(bandwidth=25e9, peak_flops=1e11)["compute-bound"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="overhead_s"):
        d.floors(bandwidth=25e9, peak_flops=1e11, overhead_s=-1)
    with pytest.raises(ValueError, match="bandwidth"):
        d.floors(bandwidth=0, peak_flops=1e11)


def test_decode_step_validates():
    assert step().tpot_s == pytest.approx(0.02) and step().spread == pytest.approx(0.1)
    with pytest.raises(ValueError, match="step_s"):
        step(seconds=())
    with pytest.raises(ValueError, match="step_s"):
        step(seconds=(0.01, -1.0))
    with pytest.raises(ValueError, match="bandwidth"):
        step().mbu(0)


def test_bend_recovers_the_knee_of_a_roofline():
    batches = [1, 2, 4, 8, 16, 32, 64]
    for knee in (4.0, 10.0, 24.0):
        t = [max(0.02, 0.02 / knee * b) for b in batches]
        bend = bend_batch(batches, t)
        assert bend.batch == pytest.approx(knee, rel=0.05)
        assert bend.floor_s == pytest.approx(0.02, rel=0.05)
    noisy = [max(0.02, 0.002 * b) * (1 + 0.05 * (-1) ** i) for i, b in enumerate(batches)]
    assert bend_batch(batches, noisy).batch == pytest.approx(10, rel=0.3)


def test_a_flat_curve_has_no_bend():
    """The counter-example: a curve that never rises must not report a bend inside its range."""
    batches = [1, 2, 4, 8, 16]
    bend = bend_batch(batches, [0.02, 0.0201, 0.0199, 0.0202, 0.02])
    assert bend.batch is None and bend.flat_points == 5
    rising = bend_batch(batches, [0.01 * b for b in batches])  # proportional from the start
    assert rising.batch <= 2 and rising.flat_points == 1


def test_bend_refuses_bad_input():
    with pytest.raises(ValueError, match="same length"):
        bend_batch([1, 2, 4], [0.1, 0.2])
    with pytest.raises(ValueError, match="at least 3"):
        bend_batch([1, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match="increasing"):
        bend_batch([1, 4, 2], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="tpots"):
        bend_batch([1, 2, 4], [0.1, math.nan, 0.3])


def test_count_decode_ops_leaves_the_engine_idle(engine):
    from course_lib.bottlenecks.decode_roofline import count_decode_ops

    eager = Engine(engine.hf_model, engine.tokenizer, config=engine.config, decode="eager")
    n1 = count_decode_ops(eager, context_len=4)
    n2 = count_decode_ops(eager, batch=2, context_len=4)
    assert n1 > 6 * 5 and not eager.has_unfinished()  # several ops per layer of the 6-layer model
    assert n2 < 1.5 * n1  # a flat batch: the same ops for two sequences, not twice as many
    if engine.fast is not None and engine.fast.mode == "native":  # the default: the whole forward is one C call
        assert count_decode_ops(engine, context_len=4) < n1 / 3
    with pytest.raises(ValueError, match="context_len"):
        count_decode_ops(engine, context_len=0)


def test_plot_tpot_vs_batch():
    from course_lib.bottlenecks.decode_plots import plot_tpot_vs_batch

    rows = [step(batch=b, seconds=(0.02 * max(1, b / 8),)) for b in (1, 2, 4, 8, 16, 32)]
    bend = bend_batch([r.batch for r in rows], [r.tpot_s for r in rows])
    fig, ax = plot_tpot_vs_batch(rows, [r.tpot_s for r in rows], ridge_batch=8.0, bend=bend, switch_rows=16)
    assert ax.get_xscale() == "log" and len(ax.get_legend().get_texts()) == 5
    with pytest.raises(ValueError, match="equally long"):
        plot_tpot_vs_batch(rows, [0.02])


def test_release_memory_reports_this_process():
    import os

    from course_lib.bottlenecks.decode_roofline import release_memory

    rss = release_memory()
    if os.path.exists("/proc/self/status"):
        assert 10 * 2**20 < rss < 64 * 2**30
    else:
        assert rss == 0
