"""compression.bits_curve: any bit width's grid, the same as quantize's at 8 and 4 bits; bytes; the curve."""

import pytest
import torch

from course_lib.compression import bits_curve as bc
from course_lib.compression.quantize import QuantConfig, dequantize, quantize
from course_lib.engine import Engine

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("bits,group", [(8, 32), (4, 32), (4, 64)])
def test_fake_quant_is_quantize_where_both_exist(bits, group):
    w = torch.randn(16, 128, generator=torch.Generator().manual_seed(bits)) * 0.02
    want = dequantize(quantize(w, QuantConfig(bits, False, "group", group)))
    torch.testing.assert_close(bc.fake_quant(w, bits, group), want, atol=1e-6, rtol=0)


def test_fewer_bits_err_more_and_levels_are_counted():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    errs = [(bc.fake_quant(w, b, 32) - w).pow(2).mean().item() for b in bc.BITS]
    assert errs == sorted(errs)  # 8 bits first, 2 bits last
    assert all(len(torch.unique(row)) <= 4 for row in bc.fake_quant(w, 2, 64))  # 2 bits: 4 levels per group
    assert bc.bytes_per_weight(4, 64) == pytest.approx(0.5 + 4 / 64)
    with pytest.raises(ValueError, match="bits"):
        bc.fake_quant(w, 1, 32)
    with pytest.raises(ValueError, match="divide"):
        bc.fake_quant(w, 4, 48)


def test_bits_curve_on_the_tiny_model(target):
    from course_lib.compression import requant

    eng = Engine(target.hf_model, target.tokenizer, linear="reference")
    windows = requant.held_windows(eng, 1, seq_len=64)
    before = dict(eng.model.linears())
    rows = bc.bits_curve(eng, windows, bits=(8, 2), group_size=32)
    ref = requant.score(eng, windows, batch=1).perplexity
    assert rows[0]["perplexity"] == pytest.approx(ref, rel=0.02) and rows[1]["perplexity"] > rows[0]["perplexity"]
    assert all(lin is before[n] for n, lin in eng.model.linears())
