"""Chapter 02's profiling helpers (course_lib.measure.profiling): decode matmuls timed alone, op counts, the
per-op floor, and what "busy" measures."""

import time
from types import SimpleNamespace

import pytest
import torch

from course_lib.engine import Engine
from course_lib.measure import profiling
from course_lib.models import accounting
from tests.conftest import random_llama


@pytest.fixture(scope="module")
def engine(tokenizer):
    return Engine(random_llama(tokenizer), tokenizer)


def test_time_matmuls(engine):
    lins = [lin for _, lin in engine.model.linears()]
    mats = profiling.matmul_weights(engine)
    shape = accounting.ModelShape.from_config(engine.hf_model.config)
    assert len(mats) == len(lins) and all(m.data_ptr() == lin.weight.data_ptr() for m, lin in zip(mats, lins))
    assert sum(m.numel() for m in mats) == accounting.matmul_params(shape)  # every multiplied weight, once
    assert tuple(mats[-1].shape) == (shape.vocab_size, shape.hidden_size)  # the LM head, last
    assert all(m.dim() == 2 for m in mats)
    t = profiling.time_matmuls(engine, batch=2, repeats=3)
    assert t.bytes == sum(m.numel() * 4 for m in mats) and t.flops == 2 * 2 * sum(m.numel() for m in mats)
    assert len(t.samples_s) == 3 and t.median_s > 0
    with pytest.raises(ValueError):
        profiling.time_matmuls(engine, batch=0)


class _CountingLinear(torch.nn.Linear):
    """A linear layer that counts its calls."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


def test_time_matmuls_calls_each_linear():
    torch.manual_seed(0)
    lins = [_CountingLinear(8, 12, bias=False), _CountingLinear(12, 8, bias=False), _CountingLinear(8, 20, bias=False)]
    fake = SimpleNamespace(
        model=SimpleNamespace(linears=lambda: iter([(f"l{i}", lin) for i, lin in enumerate(lins)])),
        device=torch.device("cpu"),
    )
    mats = profiling.matmul_weights(fake)
    assert len(mats) == 3 and all(m is lin.weight for m, lin in zip(mats, lins))
    t = profiling.time_matmuls(fake, batch=3, repeats=4)
    assert len({lin.calls for lin in lins}) == 1 and lins[0].calls >= 4  # every linear, once per timed call
    n = sum(lin.weight.numel() for lin in lins)
    assert t.flops == 2 * 3 * n and t.bytes == 4 * n and len(t.samples_s) == 4
    assert t.label == "3 decode matmuls, batch 3"


def test_count_ops_and_overhead():
    x = torch.ones(3)
    assert profiling.count_ops(lambda: x + 1) == 1
    assert profiling.count_ops(lambda: (x + 1) * 2 - x) == 3
    per_op = profiling.per_op_overhead_s(n=200)
    assert 0 < per_op < 1e-3


def test_cpu_busy_and_sampler():
    def spin():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.15:
            pass
        return "done"

    busy = profiling.cpu_busy(spin, threads=1)
    assert busy.result == "done" and busy.fraction > 0.5
    idle = profiling.cpu_busy(lambda: time.sleep(0.15), threads=1)
    assert idle.fraction < 0.3
    readings, wall, calls = profiling.sample_while(
        lambda: time.sleep(0.01), lambda: 42.0, min_seconds=0.1, interval_s=0.01
    )
    assert calls >= 5 and wall >= 0.1 and readings and set(readings) == {42.0}
    read, source = profiling.gpu_utilization_reader()
    if read is None:  # no GPU tooling here: a reason instead of a crash
        assert "nvidia-smi" in source
    else:
        assert 0 <= read() <= 100 and source in ("pynvml", "nvidia-smi")
