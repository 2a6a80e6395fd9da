"""Prefill/decode disaggregation: KV hand-over, two real worker processes, clean failure, the scale model."""

import dataclasses
import os
import signal
import time

import pytest
import torch

from course_lib.engine import SamplingParams
from course_lib.engine.attention import ContiguousBackend
from course_lib.measure.metrics import SLO
from course_lib.serving.disagg import (
    DisaggregatedServer,
    SimConfig,
    WorkerError,
    extract_kv,
    install_kv,
    kv_transfer_bytes,
    link_gbps,
    max_goodput_per_gpu,
    plot_disagg_sweep,
    serve_colocated,
    simulate_colocated,
    simulate_disaggregated,
    sweep_rates,
)
from course_lib.serving.disagg.simulate import _Costs
from course_lib.serving.workload import Request

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[(7 * i + 3) % 4000 + 10 for i in range(n)] for n in (5, 23, 61)]


@pytest.fixture(scope="module")
def server():
    srv = DisaggregatedServer("tiny-target", start_timeout=240.0).start()
    yield srv
    srv.close()
    assert srv.alive() == []


def _formula(engine, n):
    m = engine.model
    return kv_transfer_bytes(m.num_layers, m.num_kv_heads, m.head_dim, 4, n)  # fp32


def test_extract_install_roundtrip(target):
    be = target.backend
    h = be.allocate()
    try:
        be.append(h, 9)
        target.forward([h], [PROMPTS[1][:9]], [0])
        kv = extract_kv(be, h)  # (2, L, Hkv, 9, hd)
        assert kv.shape == (2, be.num_layers, be.num_kv_heads, 9, be.head_dim)
        assert kv.numel() * kv.element_size() == _formula(target, 9)
        other = ContiguousBackend(be.num_layers, be.num_kv_heads, be.head_dim, 64, 2)
        h2 = install_kv(other, kv)
        assert other.length(h2) == 9
        torch.testing.assert_close(other.k[3][h2, :, :9], be.k[3][h, :, :9], rtol=0, atol=0)
        torch.testing.assert_close(other.v[0][h2, :, :9], be.v[0][h, :, :9], rtol=0, atol=0)
        with pytest.raises(ValueError, match="length"):
            extract_kv(be, h, 10)
        with pytest.raises(ValueError, match="kv must be"):
            install_kv(other, kv[:, :2])
        with pytest.raises(ValueError, match="backend must be a ContiguousBackend"):
            extract_kv(object(), h)
    finally:
        be.free(h)


def test_disaggregated_greedy_equals_colocated_and_bytes(server, target):
    expected = [r.output_ids for r in target.generate(PROMPTS, SamplingParams(max_new_tokens=6, ignore_eos=True))]
    assert server.generate(PROMPTS, 6) == expected
    reqs = [Request(tuple(p), 6) for p in PROMPTS]
    arrivals = [0.0, 0.05, 0.1]
    run = server.serve(reqs, arrivals)
    assert run.outputs == expected
    assert sorted(t.prompt_tokens for t in run.transfers) == [5, 23, 61]
    for t in run.transfers:
        assert t.bytes == _formula(target, t.prompt_tokens)
        assert t.seconds > 0 and t.predicted_s("nvlink4") == pytest.approx(7.2e-6 + t.bytes / 450e9)
    assert run.transfer_bytes() == sum(_formula(target, len(p)) for p in PROMPTS)
    for tr in run.traces:
        assert tr.n_output == 6 and tr.ttft > 0
    base = serve_colocated(target, reqs, arrivals)
    assert base.outputs == expected


def test_worker_killed_raises_and_leaves_no_process(server):
    os.kill(server.processes[1].pid, signal.SIGKILL)  # the decode worker dies mid-service
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="decode-worker"):
        server.serve([Request(tuple(PROMPTS[0]), 4)], timeout=60)
    assert time.monotonic() - t0 < 30
    assert server.alive() == [] and all(p.exitcode is not None for p in server.closed_processes)


def test_worker_exception_propagates_and_leaves_no_process():
    srv = DisaggregatedServer("tiny-target", start_timeout=240.0, _fault="decode")
    t0 = time.monotonic()
    with srv, pytest.raises(WorkerError, match="injected fault in the decode worker"):
        srv.serve([Request(tuple(PROMPTS[0]), 4)], timeout=60)
    assert srv.alive() == [] and all(not p.is_alive() for p in srv.closed_processes)
    assert time.monotonic() - t0 < 240


def test_bad_input():
    with pytest.raises(ValueError, match="prompt_len"):
        kv_transfer_bytes(2, 2, 32, 2, 0)
    with pytest.raises(ValueError, match="link"):
        link_gbps("carrier pigeon")
    with pytest.raises(ValueError, match="threads_per_worker"):
        DisaggregatedServer(threads_per_worker=0)
    with pytest.raises(ValueError, match="arrivals"):
        serve_colocated(None, [Request((1, 2), 2)], [0.0, 1.0])
    with pytest.raises(ValueError, match="prompt_len"):
        SimConfig(prompt_len=0)
    with pytest.raises(ValueError, match="compute_efficiency"):
        SimConfig(compute_efficiency=1.5)
    with pytest.raises(ValueError, match="num_decode"):
        simulate_disaggregated(SimConfig(num_requests=5), 1.0, 1, 0)


SMALL = SimConfig(num_requests=60, output_len=64, prompt_len=2048)


def test_simulation_disaggregation_removes_decode_interference():
    rate = 20.0
    colo = simulate_colocated(SMALL, rate, 2)
    dis = simulate_disaggregated(SMALL, rate, 1, 1)
    # colocated: some decode waits a whole prefill (≥ one prompt's prefill time); disaggregated: never more than a step
    costs = _Costs(SMALL)
    assert colo.max_itl.max() >= costs.prefill(1)
    assert dis.max_itl.max() < costs.prefill(1) / 2
    assert dis.row()["tpot_p99"] < colo.row()["tpot_p99"]
    assert (dis.ttft > 0).all() and (colo.ttft > 0).all()


def test_simulation_faster_link_lowers_ttft():
    slow = simulate_disaggregated(dataclasses.replace(SMALL, link=1.0), 4.0)
    fast = simulate_disaggregated(dataclasses.replace(SMALL, link="nvlink4"), 4.0)
    assert fast.transfer_s < slow.transfer_s
    assert fast.row()["ttft_p50"] < slow.row()["ttft_p50"]
    assert fast.transfer_s == pytest.approx(2 * 32 * 8 * 128 * 2 * 2048 / 450e9)


def test_sweep_goodput_and_plot():
    slo = SLO(ttft_s=0.2, tpot_s=0.008)
    cfg = dataclasses.replace(SMALL, num_requests=40)
    rows = sweep_rates(cfg, [2.0, 16.0], setups=(2, (1, 1)), slo=slo)
    assert len(rows) == 4 and {r["setup"] for r in rows} == {"colocated ×2", "disaggregated 1P+1D"}
    for r in rows:
        assert 0 <= r["attainment"] <= 1
        assert r["goodput_per_gpu"] == pytest.approx(r["rate"] * r["attainment"] / 2)
    assert max_goodput_per_gpu(rows, "disaggregated 1P+1D") >= 1.0
    fig = plot_disagg_sweep(rows, slo)
    assert len(fig.axes) == 4
    with pytest.raises(ValueError, match="setup"):
        sweep_rates(cfg, [1.0], setups=("x",))


def test_transfer_time_counts_the_link_latency():
    """A 2,048-token Llama-3-8B KV cache (bf16) is 268 MB: 5.4 ms over InfiniBand NDR; a tiny message costs
    its latency: one NCCL call over one hop (6.6 µs base + 0.6 µs NVLink / 2.7 µs network step)."""
    from course_lib.serving.disagg.handover import transfer_s

    big = kv_transfer_bytes(32, 8, 128, 2, 2048)
    assert big == 268_435_456
    assert transfer_s(big, "infiniband_ndr") == pytest.approx(9.3e-6 + big / 50e9)
    assert transfer_s(1000, "nvlink4") == pytest.approx(7.2e-6 + 1000 / 450e9)  # latency-bound: ~3× the bytes' time
    assert transfer_s(1000, 450.0) == pytest.approx(1000 / 450e9)  # a bare GB/s has no latency
