"""Chapter 02's load generator and sweeps: right shapes, right bookkeeping, predictions that match the formulas."""
import time

import numpy as np
import pytest
import torch

from course_lib import serving_bench as sb
from course_lib.engine.generate import Engine
from course_lib.hardware import gpu_spec
from course_lib.models import accounting
from tests.conftest import random_llama

TEXT = "import os\nimport sys\n\n\ndef main(argv):\n    return 0\n" * 40


@pytest.fixture(scope="module")
def engine(tokenizer):
    return Engine(random_llama(tokenizer), tokenizer)


@pytest.fixture(scope="module")
def pool(tokenizer):
    return sb.prompt_pool(tokenizer, 200, text=TEXT)


def test_prompt_pool_and_slices(tokenizer, pool):
    assert len(pool) == 200 and pool == sb.prompt_pool(tokenizer, 200, text=TEXT)
    assert sb.prompt_of_length(pool, 5, 3) == pool[3:8]
    assert sb.prompt_of_length(pool, 5, 198) == pool[198:] + pool[:3]  # wraps around
    with pytest.raises(ValueError, match="pool of at least"):
        sb.prompt_of_length(pool, 201)
    with pytest.raises(ValueError, match="only"):
        sb.prompt_pool(tokenizer, 10_000, text="x = 1\n")


def test_workload_is_seeded_and_long_tailed(pool):
    w = sb.make_workload(pool, 200, prompt_lens=(4, 40), output_median=10, output_max=100, seed=3)
    assert w == sb.make_workload(pool, 200, prompt_lens=(4, 40), output_median=10, output_max=100, seed=3)
    assert w != sb.make_workload(pool, 200, prompt_lens=(4, 40), output_median=10, output_max=100, seed=4)
    lens = [len(r.prompt_ids) for r in w]
    outs = np.array([r.max_new_tokens for r in w])
    assert min(lens) >= 4 and max(lens) <= 40
    assert outs.min() >= 2 and outs.max() <= 100
    assert outs.mean() > np.median(outs)  # a long right tail pulls the mean above the median
    with pytest.raises(ValueError):
        sb.make_workload(pool, 3, prompt_lens=(10, 5))
    with pytest.raises(ValueError):
        sb.Request((), 3)


def test_serve_static_batches_cut_traces_and_queue(engine, pool):
    reqs = [sb.Request(tuple(pool[:6]), 3), sb.Request(tuple(pool[6:10]), 5), sb.Request(tuple(pool[:2]), 2)]
    alone = sb.serve(engine, reqs, batch_size=1)
    batched = sb.serve(engine, reqs, batch_size=3)
    for traces in (alone, batched):
        assert [t.n_output for t in traces] == [3, 5, 2]
        assert [t.prompt_tokens for t in traces] == [6, 4, 2]
        assert [t.request_id for t in traces] == [0, 1, 2]
    assert len({t.arrival for t in batched}) == 1  # one batch: one arrival
    assert len({t.arrival for t in alone}) == 3  # each request arrives as it is served
    queued = sb.serve(engine, reqs, batch_size=1, common_arrival=True)
    assert len({t.arrival for t in queued}) == 1
    assert queued[2].ttft > queued[0].latency  # the last one waited for the others
    rebased = sb.with_common_arrival(alone)
    assert all(r.arrival == alone[0].arrival for r in rebased)
    assert rebased[2].ttft >= alone[2].ttft and rebased[1].token_times == alone[1].token_times
    with pytest.raises(ValueError):
        sb.serve(engine, [], batch_size=1)
    with pytest.raises(ValueError):
        sb.serve(engine, reqs, batch_size=0)


def test_sweeps_shapes(engine, pool):
    pts = sb.ttft_sweep(engine, pool, (4, 16), repeats=2)
    assert [p.prompt_len for p in pts] == [4, 16] and all(p.ttft_s > 0 and len(p.samples_s) == 2 for p in pts)
    runs = sb.tpot_sweep(engine, pool, (1, 3), prompt_len=8, new_tokens=4, repeats=3)
    assert [r.batch for r in runs] == [1, 3]
    for r in runs:
        assert len(r.traces) == r.batch and all(t.n_output == 4 for t in r.traces)
        assert r.tpot_s > 0 and r.decode_tokens_per_s == pytest.approx(r.batch / r.tpot_s)
    grid = sb.latency_grid(engine, pool, (4, 8), (2, 3), repeats=1)
    assert [(i, o) for i, o, _ in grid] == [(4, 2), (4, 3), (8, 2), (8, 3)]
    with pytest.raises(ValueError, match="new_tokens"):
        sb.tpot_sweep(engine, pool, (1,), new_tokens=1)
    with pytest.raises(ValueError):
        sb.ttft_sweep(engine, pool, ())


def test_fit_latency_recovers_known_costs():
    a, b, c = 0.004, 0.0002, 0.02
    pts = [(i, o, a + b * i + c * o) for i in (16, 64, 256) for o in (4, 16, 64)]
    fit = sb.fit_latency(pts)
    assert (fit.a, fit.b, fit.c) == pytest.approx((a, b, c), rel=1e-9)
    assert fit.ratio == pytest.approx(100) and fit.rms_s < 1e-12
    assert fit.predict([16], [4])[0] == pytest.approx(a + 16 * b + 4 * c)
    with pytest.raises(ValueError, match="vary"):
        sb.fit_latency([(16, 4, 1.0), (32, 4, 2.0), (64, 4, 3.0)])  # output never varies
    with pytest.raises(ValueError):
        sb.fit_latency([(1, 2, 3.0)])


def test_predictions_follow_the_roofline():
    shape = accounting.ModelShape.from_name("llama-2-7b")
    spec = gpu_spec("H100 SXM")
    peak, bw = spec.peak_flops("bf16"), spec.bandwidth
    step = sb.decode_time(shape, 1, peak, bw, "bf16")
    assert step == pytest.approx(accounting.decode_step_bytes(shape, 1, 1, "bf16") / bw)
    assert sb.prefill_time(shape, 512, peak, bw, "bf16") == pytest.approx(accounting.prefill_flops(shape, 512) / peak)
    # one output token ≈ (bytes per param / 2) × ridge input tokens
    ratio = sb.output_input_ratio(shape, peak, bw, "bf16")
    assert ratio == pytest.approx(spec.ridge("bf16"), rel=0.05)
    assert sb.output_input_ratio(shape, peak, bw, "fp32") == pytest.approx(2 * ratio, rel=1e-6)
    # a big batch crosses the ridge: the step becomes compute-bound
    assert sb.decode_time(shape, 1, peak, bw, "bf16", batch=1024) == pytest.approx(
        accounting.decode_flops(shape, 1, 1024) / peak)
    total = sb.generation_flops(shape, 10, 3)
    assert total == pytest.approx(accounting.prefill_flops(shape, 10) + accounting.decode_flops(shape, 11)
                                  + accounting.decode_flops(shape, 12))
    assert sb.generation_flops(shape, 10, 1) == accounting.prefill_flops(shape, 10)


def test_time_matmuls(engine):
    mats = sb.matmul_weights(engine)
    shape = accounting.ModelShape.from_config(engine.hf_model.config)
    assert sum(m.numel() for m in mats) == accounting.matmul_params(shape)  # every multiplied weight, once
    assert mats[-1] is engine.model.lm_head and all(m.dim() == 2 for m in mats)
    t = sb.time_matmuls(engine, batch=2, repeats=3)
    assert t.bytes == sum(m.numel() * 4 for m in mats) and t.flops == 2 * 2 * sum(m.numel() for m in mats)
    assert len(t.samples_s) == 3 and t.median_s > 0
    with pytest.raises(ValueError):
        sb.time_matmuls(engine, batch=0)


def test_count_ops_and_overhead():
    x = torch.ones(3)
    assert sb.count_ops(lambda: x + 1) == 1
    assert sb.count_ops(lambda: (x + 1) * 2 - x) == 3
    per_op = sb.per_op_overhead_s(n=200)
    assert 0 < per_op < 1e-3


def test_cpu_busy_and_sampler():
    def spin():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.15:
            pass
        return "done"

    busy = sb.cpu_busy(spin, threads=1)
    assert busy.result == "done" and busy.fraction > 0.5
    idle = sb.cpu_busy(lambda: time.sleep(0.15), threads=1)
    assert idle.fraction < 0.3
    readings, wall, calls = sb.sample_while(lambda: time.sleep(0.01), lambda: 42.0, min_seconds=0.1, interval_s=0.01)
    assert calls >= 5 and wall >= 0.1 and readings and set(readings) == {42.0}
    read, source = sb.gpu_utilization_reader()
    if read is None:  # no GPU tooling here: a reason instead of a crash
        assert "nvidia-smi" in source
    else:
        assert 0 <= read() <= 100 and source in ("pynvml", "nvidia-smi")
