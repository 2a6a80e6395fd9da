"""compression.step_model: the decode step as t0 + bytes / rate, with t0 measured by zero-byte layers."""

import math

import pytest
import torch

from course_lib.compression import decode_formats as df
from course_lib.compression import step_model as sm


def test_predictions_and_rates():
    assert sm.predicted_step_s(0.005, 500e6, 25e9) == pytest.approx(0.025)
    assert sm.predicted_speedup(0.005, 500e6, 125e6, 25e9) == pytest.approx(2.5)
    assert sm.speedup_cap(0.045, 0.005) == pytest.approx(9.0)
    assert sm.streamed_rate(0.045, 0.005, 500e6) == pytest.approx(12.5e9)
    assert sm.streamed_rate(0.004, 0.005, 500e6) == math.inf  # step below t0: noise, no rate
    for bad in (dict(t0_s=-1.0), dict(nbytes=float("nan")), dict(bandwidth=0)):
        args = {"t0_s": 0.005, "nbytes": 1e6, "bandwidth": 1e9, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            sm.predicted_step_s(**args)
    with pytest.raises(ValueError, match="both 0"):
        sm.predicted_speedup(0.0, 1e6, 0, 1e9)


def test_null_linear_has_no_bytes_and_the_right_width():
    lin = sm.NullLinear(7)
    assert lin(torch.ones(2, 3, 5)).shape == (2, 3, 7) and df.layer_bytes(lin) == 0
    with pytest.raises(ValueError, match="out_features"):
        sm.NullLinear(0)


def test_null_engine_step_runs_and_reads_nothing(target):
    """t0 measured on the tiny model: the zero-byte step runs through the engine and reads 0 bytes, and
    the engine gets its layers back (no timing asserted: a shared CI machine cannot order them)."""
    layers = dict(target.model.linears())
    null = sm.null_layers(layers)
    assert set(null) == set(layers)
    try:
        for n, lin in null.items():
            target.model.set_linear(n, lin)
        assert df.step_bytes(target) == (0, 0)
        assert len(df.step_times(target, steps=4, warmup=1)) == 4
    finally:
        for n, lin in layers.items():
            target.model.set_linear(n, lin)
    assert sum(df.step_bytes(target)) > 0
