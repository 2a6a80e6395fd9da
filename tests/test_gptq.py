"""GPTQ (compression.gptq) and its calibration (compression.calibrate)."""

import pytest
import torch

from course_lib.compression.calibrate import HessianRecorder, collect_inputs
from course_lib.compression.gptq import (
    gptq_quantize,
    quantize_engine_gptq,
    quantize_engine_gptq_sequential,
    relative_output_error,
)
from course_lib.compression.quantize import QuantConfig, dequantize, quantize

CONFIGS = [
    QuantConfig(4, False, "group", 32),
    QuantConfig(4, True, "channel"),
    QuantConfig(4, True, "group", 64),
    QuantConfig(8, True, "channel"),
    QuantConfig(8, False, "group", 32),
]


def correlated_layer(out=96, k=128, n=1024, seed=0):
    """A random layer and inputs X = Z·A: correlated features (and a few large ones), as real activations have."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(k, k, generator=g) / k**0.5 + 0.3 * torch.eye(k)
    X = torch.randn(n, k, generator=g) @ A
    X[:, :4] *= 5.0  # a few outlier features
    W = torch.randn(out, k, generator=g) * 0.05
    return W, X, 2.0 * X.T @ X / n


def output_error(X, W, W_hat):
    return float((X @ W.T - X @ W_hat.T).norm())


@pytest.mark.parametrize("config", [QuantConfig(4, False, "group", 32), QuantConfig(4, True, "channel")])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_beats_rtn_on_the_layer_output(config, act_order):
    W, X, H = correlated_layer()
    rtn = output_error(X, W, dequantize(quantize(W, config)))
    gptq = output_error(X, W, dequantize(gptq_quantize(W, H, config, act_order=act_order)))
    assert gptq < 0.85 * rtn, (gptq, rtn)
    # relative_output_error computes the same ratio from H alone
    W_hat = dequantize(gptq_quantize(W, H, config))
    direct = output_error(X, W, W_hat) ** 2 / float((X @ W.T).norm()) ** 2
    assert relative_output_error(W, W_hat, H) == pytest.approx(direct, rel=1e-3)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("act_order", [False, True])
def test_same_format_as_rtn_and_values_on_the_grid(config, act_order):
    W, X, H = correlated_layer(out=32, k=64, n=256, seed=1)
    qw = gptq_quantize(W, H, config, block_size=48, act_order=act_order)  # blocks not a multiple of 32/64
    ref = quantize(W, config)
    assert qw.data.dtype == ref.data.dtype and qw.data.shape == ref.data.shape
    assert qw.scale.shape == ref.scale.shape and qw.zero.shape == ref.zero.shape and qw.shape == ref.shape
    assert qw.nbytes == ref.nbytes
    if config.symmetric:
        assert torch.all(qw.zero == 0)
    q = qw.int_values().long()
    assert q.min() >= config.qmin and q.max() <= config.qmax
    # every dequantized value is q·scale + zero of its group, for an integer q in range
    w_hat = dequantize(qw)
    g = qw.group_size
    grid = q.float() * qw.scale.repeat_interleave(g, dim=1) + qw.zero.repeat_interleave(g, dim=1)
    assert torch.equal(w_hat, grid)
    # and re-quantizing the GPTQ weights with their own scales gives back the same integers
    assert torch.equal(quantize_with_same(w_hat, qw).int_values(), qw.int_values())


def quantize_with_same(w, qw):
    from course_lib.compression.quantize import quantize_with

    return quantize_with(w, qw.scale, qw.zero, qw.config)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_identity_hessian_is_round_to_nearest(config):
    # uncorrelated inputs of equal size: no column can compensate another, GPTQ = RTN
    W, _, _ = correlated_layer(out=48, k=128, seed=2)
    qw = gptq_quantize(W, torch.eye(128), config)
    ref = quantize(W, config)
    same = (qw.int_values() == ref.int_values()).float().mean().item()
    assert same > 0.99
    torch.testing.assert_close(qw.scale, ref.scale)


def test_dead_inputs_and_singular_hessian():
    W, X, _ = correlated_layer(out=16, k=32, n=8, seed=3)  # n < k: XᵀX is singular
    X[:, 5] = 0.0  # an input that is always zero
    H = 2.0 * X.T @ X / X.shape[0]
    config = QuantConfig(4, False, "group", 16)
    qw = gptq_quantize(W, H, config, damp=0.0)  # damping raised automatically until Cholesky works
    w_hat = dequantize(qw)
    assert torch.isfinite(w_hat).all()
    assert output_error(X, W, w_hat) <= output_error(X, W, dequantize(quantize(W, config)))


def test_bad_input():
    W, _, H = correlated_layer(out=8, k=32, n=64)
    config = QuantConfig(4, False, "group", 16)
    with pytest.raises(ValueError, match="H must be"):
        gptq_quantize(W, H[:16, :16], config)
    with pytest.raises(ValueError, match="H must be"):
        gptq_quantize(W, H[0], config)
    with pytest.raises(ValueError, match="config"):
        gptq_quantize(W, H, QuantConfig(4, True, "tensor"))
    with pytest.raises(ValueError, match="config"):
        gptq_quantize(W, H, "int4")
    with pytest.raises(ValueError, match="weight"):
        gptq_quantize(W[0], H, config)
    with pytest.raises(ValueError, match="weight"):
        gptq_quantize(quantize(W, config), H, config)
    with pytest.raises(ValueError, match="weight"):
        gptq_quantize(W, H, QuantConfig(4, False, "group", 64))  # 64 does not divide 32
    with pytest.raises(ValueError, match="H must be"):
        gptq_quantize(W, H * float("nan"), config)
    with pytest.raises(ValueError, match="damp"):
        gptq_quantize(W, H, config, damp=-1.0)
    with pytest.raises(ValueError, match="block_size"):
        gptq_quantize(W, H, config, block_size=0)


def test_hessian_recorder_matches_stored_activations():
    from course_lib.engine.layers import Linear

    g = torch.Generator().manual_seed(4)
    lin = Linear(torch.randn(6, 10, generator=g))
    rec = HessianRecorder(lin)
    xs = [torch.randn(3, 7, 10, generator=g), torch.randn(5, 10, generator=g)]
    for x in xs:
        torch.testing.assert_close(rec(x), lin(x))
    X = torch.cat([x.reshape(-1, 10) for x in xs])
    torch.testing.assert_close(rec.hessian(), 2 * X.T @ X / X.shape[0])


@pytest.fixture(scope="module")
def engine():
    from course_lib.engine.engine import Engine

    # One intra-op thread: these small ops gain nothing from two, and on a shared 2-core CPU two OpenMP
    # threads competing with other processes make them several times slower (measured: ~30 s vs ~6 s).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Engine("tiny-target")
    torch.set_num_threads(threads)


def test_collect_inputs_restores_the_layers(engine):
    before = dict(engine.model.linears())
    hs = collect_inputs(engine, names=["layers.0.qkv", "layers.0.down"], n_samples=2, seq_len=16)
    assert set(hs) == {"layers.0.qkv", "layers.0.down"}
    assert hs["layers.0.down"].shape == (before["layers.0.down"].in_features,) * 2
    torch.testing.assert_close(hs["layers.0.qkv"], hs["layers.0.qkv"].T)
    assert all(after is before[n] for n, after in engine.model.linears())
    with pytest.raises(ValueError, match="names"):
        collect_inputs(engine, names=["layers.0.nope"], n_samples=1, seq_len=8)
    with pytest.raises(ValueError, match="split"):
        collect_inputs(engine, n_samples=1, seq_len=8, split="test")


def test_engine_bad_input(engine):
    from course_lib.engine.engine import Engine

    config = QuantConfig(4, False, "group", 64)
    hessians = collect_inputs(engine, names=["layers.0.qkv"], n_samples=1, seq_len=8)
    fresh = Engine(engine.hf_model, engine.tokenizer)
    with pytest.raises(ValueError, match="hessians has no entry"):
        quantize_engine_gptq(fresh, config, hessians)
    with pytest.raises(ValueError, match="hessians must be"):
        quantize_engine_gptq(fresh, config, [hessians["layers.0.qkv"]])
    with pytest.raises(ValueError, match="config"):
        quantize_engine_gptq(fresh, QuantConfig(4, True, "tensor"), hessians)
    with pytest.raises(ValueError, match="path"):
        quantize_engine_gptq(fresh, config, hessians, path="gpu")
    assert all(type(a) is type(b) for (_, a), (_, b) in zip(fresh.model.linears(), engine.model.linears()))


def test_sequential_quantizes_every_layer_but_the_head(engine):
    from course_lib.compression.linear import WeightOnlyLinear
    from course_lib.engine.engine import Engine

    e = Engine(engine.hf_model, engine.tokenizer)
    config = QuantConfig(4, True, "channel")
    report = quantize_engine_gptq_sequential(e, config, n_samples=2, seq_len=32)
    names = [n for n, _ in e.model.linears()]
    assert list(report["layers"]) == names[:-1] and report["calibration_seconds"] > 0
    assert all(isinstance(lin, WeightOnlyLinear) for n, lin in e.model.linears() if n != "lm_head")
    assert not isinstance(e.model.lm_head, WeightOnlyLinear)
    assert all(v["gptq_error"] < v["rtn_error"] for v in report["layers"].values())


def test_gptq_engine_has_lower_perplexity_than_rtn(engine):
    from course_lib.compression.evaluate import perplexity
    from course_lib.compression.linear import WeightOnlyLinear
    from course_lib.engine.engine import Engine

    config = QuantConfig(4, False, "group", 64)
    hessians = collect_inputs(engine, n_samples=8, seq_len=128)  # train split
    assert "lm_head" in hessians and len(hessians) == len(list(engine.model.linears()))

    rtn = Engine(engine.hf_model, engine.tokenizer)
    for name, lin in list(rtn.model.linears())[:-1]:
        rtn.model.set_linear(name, WeightOnlyLinear.from_linear(lin, config))
    gptq = Engine(engine.hf_model, engine.tokenizer)
    report = quantize_engine_gptq(gptq, config, hessians, include_lm_head=False)
    assert list(report["layers"]) == [n for n, _ in engine.model.linears()][:-1]
    assert all(v["gptq_error"] < v["rtn_error"] for v in report["layers"].values())
    kinds = {n: type(lin).__name__ for n, lin in gptq.model.linears()}
    assert kinds.pop("lm_head") != "WeightOnlyLinear" and set(kinds.values()) == {"WeightOnlyLinear"}

    ppl_rtn = perplexity(rtn, max_tokens=8192)
    ppl_gptq = perplexity(gptq, max_tokens=8192)
    assert ppl_gptq < ppl_rtn, (ppl_gptq, ppl_rtn)


def test_a_forward_stopped_after_the_last_recorded_layer_records_the_same_inputs(engine):
    """Without lm_head among the names, calibration stops after the last recorded decoder layer (no logits):
    the Hessians equal those of the full forward, which runs when lm_head is recorded too."""
    short = collect_inputs(engine, names=["layers.1.qkv", "layers.2.down"], n_samples=2, seq_len=16)
    full = collect_inputs(engine, names=["layers.1.qkv", "layers.2.down", "lm_head"], n_samples=2, seq_len=16)
    for n in short:
        torch.testing.assert_close(short[n], full[n], rtol=0, atol=0)
