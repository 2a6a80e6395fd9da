"""Flash-Decoding (split-KV): the partials and their combine equal one softmax over the whole cache."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.kernels import HAS_TRITON, interpreter_on
from course_lib.kernels import flash_decoding as fd


def _sdpa(q, k, v):
    H, Hkv = q.shape[1], k.shape[1]
    kk, vv = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    return F.scaled_dot_product_attention(q[:, :, None], kk, vv)[:, :, 0]


SHAPES = [  # awkward: L not a multiple of the splits, more splits than keys, GQA groups of 3, MHA, one key
    dict(B=1, H=9, Hkv=3, L=37, d=64, S=4),
    dict(B=2, H=4, Hkv=1, L=5, d=16, S=8),
    dict(B=3, H=2, Hkv=2, L=1, d=32, S=3),
    dict(B=1, H=8, Hkv=2, L=130, d=32, S=7),
]


@pytest.mark.parametrize("c", SHAPES)
def test_reference_equals_sdpa(c):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(c["B"], c["H"], c["d"], generator=g)
    k = torch.randn(c["B"], c["Hkv"], c["L"], c["d"], generator=g) * 3
    v = torch.randn(c["B"], c["Hkv"], c["L"], c["d"], generator=g)
    out = fd.flash_decoding(q, k, v, c["S"], path="torch")
    torch.testing.assert_close(out, _sdpa(q, k, v), atol=1e-5, rtol=1e-5)


def test_combine_without_rescale_is_wrong():
    """The counter-example: averaging the chunks' outputs (no log-sum-exp weights) is not attention."""
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 2, 16, generator=g), torch.randn(1, 2, 40, 16, generator=g) * 3, torch.randn(1, 2, 40, 16)
    o, lse = fd.split_kv_partials_ref(q, k, v, 4)
    assert not torch.allclose(o.mean(-2), _sdpa(q, k, v), atol=1e-3)
    torch.testing.assert_close(fd.combine(o, lse), _sdpa(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not HAS_TRITON or not (torch.cuda.is_available() or interpreter_on()), reason="needs Triton")
@pytest.mark.parametrize("c", SHAPES[:2] + SHAPES[3:])
def test_triton_equals_reference(c):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(2)
    q = torch.randn(c["B"], c["H"], c["d"], generator=g).to(dev)
    k = (torch.randn(c["B"], c["Hkv"], c["L"], c["d"], generator=g) * 3).to(dev)
    v = torch.randn(c["B"], c["Hkv"], c["L"], c["d"], generator=g).to(dev)
    out = fd.flash_decoding(q, k, v, c["S"], path="triton")
    torch.testing.assert_close(out.cpu(), _sdpa(q, k, v).cpu(), atol=1e-4, rtol=1e-4)


def test_occupancy_and_splits():
    assert fd.sm_fill(1, 8, 1, 132) == pytest.approx(8 / 132)
    assert fd.sm_fill(1, 8, 17, 132) == 1.0
    assert fd.splits_to_fill(1, 8, 132, 65536) == 17  # ⌈132 / 8⌉
    assert fd.splits_to_fill(1, 8, 132, 1024) == 4  # chunks of at least 256 keys
    assert fd.splits_to_fill(64, 8, 132, 65536) == 1  # a big batch fills the GPU by itself


def test_bad_input():
    q, k = torch.randn(1, 4, 16), torch.randn(1, 3, 8, 16)
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        fd.flash_decoding(q, k, k, 2, path="torch")
    with pytest.raises(ValueError, match="num_splits"):
        fd.flash_decoding(q, torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16), 0, path="torch")
