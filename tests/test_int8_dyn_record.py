"""compression.int8_dyn_record: int8 weights × int8 dynamic activations, the helpers behind its record."""

import json
import warnings

import pytest
import torch

from course_lib.compression import int8_dyn_record as R
from course_lib.compression.decode_formats import INT8, quantize_chunked
from course_lib.compression.linear import WeightOnlyLinear, dynamic_supports

pytestmark = pytest.mark.usefixtures("one_thread")


def _dyn(seed=0, out=24, k=32):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, k, generator=g)
    qw = quantize_chunked(w, INT8)
    if not dynamic_supports(qw):
        pytest.skip("no fbgemm on this machine")
    return WeightOnlyLinear(qw, None, path="dynamic", max_rows=1 << 30)


def test_per_tensor_error_matches_torchs_dynamic_quantization():
    x = torch.randn(7, 33) * 3 + 0.5
    with warnings.catch_warnings():  # torch 2.13 marks quantized tensors deprecated
        warnings.simplefilter("ignore")
        ref = torch.quantize_per_tensor_dynamic(x, torch.quint8, False).dequantize()  # linear_dynamic's rounding
    want = float((x - ref).norm() / x.norm())
    assert R.per_tensor_int8_error(x) == pytest.approx(want, rel=1e-3)
    assert R.per_tensor_int8_error(torch.linspace(0, 255, 256)) == pytest.approx(0.0, abs=1e-7)  # on the grid
    for bad in (torch.ones(1), torch.arange(4), [1.0, 2.0]):
        with pytest.raises(ValueError, match="x must be"):
            R.per_tensor_int8_error(bad)


def test_row_chunks_give_each_row_its_own_scale():
    lin = _dyn()
    x = torch.randn(6, 32)
    x[0] *= 200  # one outlier row, as the first token of a window
    per_row = R.RowChunked(lin, 1)
    want = torch.cat([lin(x[i : i + 1]) for i in range(6)])
    assert torch.equal(per_row(x), want)
    assert torch.equal(R.RowChunked(lin, 6)(x), lin(x))  # one chunk: the layer itself
    exact = x @ lin.weight.T
    err = lambda y: float((y[1:] - exact[1:]).norm() / exact[1:].norm())  # noqa: E731
    assert err(per_row(x)) < err(lin(x)) / 5  # counter-example: one shared grid loses the small rows
    assert per_row.out_features == 24 and per_row(x.reshape(2, 3, 32)).shape == (2, 3, 24)
    with pytest.raises(ValueError, match="rows must be"):
        R.RowChunked(lin, 0)
    with pytest.raises(ValueError, match="layer must"):
        R.RowChunked(object(), 1)


def test_dynamic_layers_and_outliers_on_tiny_target(target):
    if not dynamic_supports(quantize_chunked(torch.randn(16, 16), INT8)):
        pytest.skip("no fbgemm on this machine")
    names = [n for n, _ in target.model.linears()]
    layers = R.dynamic_layers(target, rows_per_scale=1, weight_only=("down",))
    assert list(layers) == names
    assert all(
        isinstance(layers[n], WeightOnlyLinear) and layers[n].path != "dynamic" for n in names if n.endswith("down")
    )
    assert all(isinstance(layers[n], R.RowChunked) for n in names if not n.endswith("down"))
    plain = R.dynamic_layers(target)
    assert all(plain[n].path == "dynamic" for n in names)
    with pytest.raises(ValueError, match="weight_only"):
        R.dynamic_layers(target, weight_only=("mlp",))
    with pytest.raises(ValueError, match="rows_per_scale"):
        R.dynamic_layers(target, rows_per_scale=0)
    import numpy as np

    window = np.arange(100, 133, dtype=np.int64)
    stats = R.activation_outliers(target, window)
    assert list(stats) == names
    for v in stats.values():
        assert v["outlier"] >= 1.0 and 0 <= v["at"] < 32 and 0 <= v["err_token"] and 0 <= v["err_window"] < 1
    assert dict(target.model.linears())[names[0]].__class__.__name__ != "Tap"  # the float layers are back


def test_load_record_names_a_missing_field(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"machine": "m", "command": "c", "rows": []}))
    with pytest.raises(ValueError, match="held_text"):
        R.load_record(p)
    d = R.load_record()  # the committed record
    rows = {r["format"]: r for r in d["rows"]}
    assert rows["int8 per-channel RTN"]["tokens"] == rows["int8-dyn, per token"]["tokens"]


def test_round_blocks_gives_each_block_its_own_scale():
    x = torch.tensor([[1.0, -0.5, 100.0, 2.0], [0.3, 0.2, 0.1, 0.0]])
    y = R.round_blocks(x, 2)
    assert torch.equal(
        y[:, :2],
        torch.round(x[:, :2] / (x[:, :2].abs().amax(-1, keepdim=True) / 127))
        * (x[:, :2].abs().amax(-1, keepdim=True) / 127),
    )
    assert y[0, 2] == pytest.approx(100.0) and y[0, 3] == pytest.approx(2.0, abs=100 / 127 / 2)
    assert (y[0, :2] - x[0, :2]).abs().max() < 1 / 127  # the outlier's block does not spoil its neighbour
    whole = R.round_blocks(x, 4)  # one block per row: the outlier's scale for all four
    assert (whole[0, :2] - x[0, :2]).abs().max() > 0.1
    assert torch.equal(R.round_blocks(torch.zeros(2, 4), 2), torch.zeros(2, 4))
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="block must"):
            R.round_blocks(x, bad)
    with pytest.raises(ValueError, match="x must"):
        R.round_blocks(torch.ones(2, 5), 2)


def test_block_layers_on_tiny_target(target):
    layers = R.block_layers(target, 32)
    names = [n for n, _ in target.model.linears()]
    assert list(layers) == names and all(isinstance(v, R.BlockRounded) for v in layers.values())
    n0 = names[0]
    lin = dict(target.model.linears())[n0]
    x = torch.randn(3, lin.weight.shape[1])
    want = torch.nn.functional.linear(R.round_blocks(x, 32), layers[n0].layer.weight, lin.bias)
    assert torch.allclose(layers[n0](x), want) and layers[n0].out_features == lin.weight.shape[0]
    with pytest.raises(ValueError, match="block must"):
        R.BlockRounded(lin, 0)
    with pytest.raises(ValueError, match="already quantized"):
        from course_lib.compression.requant import swap

        with swap(target, R.dynamic_layers(target)):
            R.block_layers(target)
