"""SmoothQuant: outliers found in a real model, and smoothing that shrinks W8A8's error when they are big."""

import pytest
import torch

from course_lib.compression.smoothquant import channel_absmax, outlier_ratio, smooth_scales, w8a8_error
from course_lib.engine import Engine


def test_smoothing_keeps_the_product_and_fixes_big_outliers():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 128, generator=g)
    w = torch.randn(64, 128, generator=g) * 0.05
    s = smooth_scales(x.abs().amax(0), w, 0.5)
    torch.testing.assert_close((x / s) @ (w * s).T, x @ w.T, rtol=1e-4, atol=1e-4)  # X·Wᵀ unchanged
    calm = w8a8_error(x, w)
    x[:, 7] *= 60.0  # an outlier channel, the size SmoothQuant reports in large LLMs
    loud = w8a8_error(x, w)
    assert loud.plain > 2 * calm.plain  # one channel ruins per-token activation scales
    assert loud.smoothed < loud.plain / 3  # and smoothing moves the difficulty into the weights
    assert loud.weight_only < loud.plain
    with pytest.raises(ValueError, match="alpha"):
        smooth_scales(x.abs().amax(0), w, 1.5)
    with pytest.raises(ValueError, match="agree on in"):
        w8a8_error(x, w[:, :10])


def test_channel_absmax_on_the_engine_restores_its_layers():
    eng = Engine("tiny-target")
    before = dict(eng.model.linears())
    ids = eng.tokenizer("def main(argv):\n    return 0\n" * 8)["input_ids"][:64]
    stats = channel_absmax(eng, [ids], keep_rows=32)
    assert set(stats) == {n for n in before if n.endswith(("qkv", "gate_up"))}
    for name, (absmax, rows) in stats.items():
        assert absmax.shape == (before[name].in_features,) and rows.shape == (32, before[name].in_features)
        assert outlier_ratio(absmax) >= 1.0
    assert all(dict(eng.model.linears())[n] is lin for n, lin in before.items())  # recorders removed
    with pytest.raises(ValueError, match="unknown layers"):
        channel_absmax(eng, [ids], names=["layers.99.qkv"])
