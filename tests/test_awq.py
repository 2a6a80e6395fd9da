"""AWQ (compression.awq) against a brute-force reference: the α search on real activations, the scales,
the layer that keeps the input scale, and bad input refused before any work."""

import pytest
import torch

from course_lib.compression import awq
from course_lib.compression.quantize import QuantConfig, dequantize, quantize

CFG = QuantConfig(4, False, "group", 32)


def _layer(seed=0, n=8, k=64, rows=256):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(n, k, generator=g)
    X = torch.randn(rows, k, generator=g)
    X[:, :3] *= 25.0  # a few salient input channels, as in an LLM
    return W, X


def _brute_force(W, X, grid):
    """Every α by hand: s_j = max(mean|x_j|, 1e-4)^α / √(max·min), Ŵ = RTN(W·s) / s, error on X itself."""
    m = X.abs().mean(0)
    ref = X @ W.T
    errs = {}
    for a in grid:
        s = [max(float(v), 1e-4) ** a for v in m]
        norm = (max(s) * min(s)) ** 0.5
        s = torch.tensor([max(v / norm, 1e-4) for v in s])
        w_hat = dequantize(quantize(W * s, CFG)) / s
        errs[a] = float(((ref - X @ w_hat.T) ** 2).sum() / (ref**2).sum())
    return errs


def test_search_matches_brute_force_and_beats_rtn():
    W, X = _layer()
    H = 2 * X.T @ X / X.shape[0]
    r = awq.awq_search(W, H, X.abs().mean(0), CFG)
    bf = _brute_force(W, X, awq.GRID)
    for a in awq.GRID:
        assert r["errors"][a] == pytest.approx(bf[a], rel=1e-3)
    assert r["alpha"] == min(bf, key=bf.get)
    assert r["errors"][0.0] == pytest.approx(r["rtn_error"], rel=1e-6)  # α = 0 is RTN
    assert r["errors"][r["alpha"]] < 0.7 * r["rtn_error"]  # salient channels: scaling pays


def test_no_salient_channels_no_gain():
    """Counter-example: with equal activations every s is 1, so AWQ is RTN."""
    W, _ = _layer()
    X = torch.ones(64, W.shape[1])
    r = awq.awq_search(W, 2 * X.T @ X / 64, X.abs().mean(0), CFG)
    assert r["errors"][r["alpha"]] == pytest.approx(r["rtn_error"], rel=1e-6)


def test_scaled_input_linear_computes_with_w_hat():
    W, X = _layer(1)
    r = awq.awq_search(W, 2 * X.T @ X / X.shape[0], X.abs().mean(0), CFG)
    lin = awq.ScaledInputLinear(r["qweight"], r["scales"], path="reference")
    x = X[:4]
    torch.testing.assert_close(lin(x), x @ r["w_hat"].T, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(lin.weight, r["w_hat"], rtol=1e-5, atol=1e-5)


def test_scales_and_bad_input():
    m = torch.tensor([1.0, 4.0, 16.0])
    s = awq.awq_scales(m, 0.5)
    assert float(s.max() * s.min()) == pytest.approx(1.0)
    assert torch.allclose(s / s[0], torch.tensor([1.0, 2.0, 4.0]))
    with pytest.raises(ValueError, match="alpha"):
        awq.awq_scales(m, 1.5)
    W, X = _layer()
    with pytest.raises(ValueError, match="H must be"):
        awq.awq_search(W, torch.eye(3), X.abs().mean(0), CFG)
    with pytest.raises(ValueError, match="config"):
        awq.awq_search(W, torch.eye(64), X.abs().mean(0), QuantConfig(4, False, "tensor"))
    with pytest.raises(ValueError, match="grid"):
        awq.awq_search(W, torch.eye(64), X.abs().mean(0), CFG, grid=())


def test_awq_layers_on_the_tiny_model():
    from course_lib.engine import Engine

    eng = Engine("tiny-target")
    names = ["layers.0.qkv", "layers.0.down"]
    stats = awq.collect_awq_stats(eng, names, n_samples=2, seq_len=32)
    layers, report = awq.awq_layers(eng, CFG, stats)
    assert set(layers) == set(names)
    for v in report["layers"].values():
        assert v["awq_error"] <= v["rtn_error"] * (1 + 1e-6)
    with pytest.raises(ValueError, match="stats has no entry"):
        awq.awq_layers(eng, CFG, stats, names=["layers.1.qkv"])
