"""compression.apply.gemv_speed with a working set: enough copies of each format's weight to read past the
cache, copies that really hold their own bytes, a bf16 row, and the hot (one copy) time beside it."""

import pytest
import torch

from course_lib.compression import apply
from course_lib.compression.linear import WeightOnlyLinear
from course_lib.compression.quantize import QuantConfig

pytestmark = pytest.mark.usefixtures("one_thread")
INT4 = QuantConfig(4, False, "group", 128)


def test_working_set_sets_the_copies_and_adds_bf16():
    rows = apply.gemv_speed(256, 256, [INT4], repeats=3, bf16=True, working_set=1 << 20)
    assert [r.name for r in rows] == ["fp32 F.linear", INT4.name, "bf16 F.linear"]
    for r in rows:
        assert r.working_set >= 1 << 20 and (r.copies - 1) * r.weight_bytes < 1 << 20
        assert r.hot_seconds is not None and len(r.samples) == 3
    assert rows[0].weight_bytes == 256 * 256 * 4 and rows[2].weight_bytes == 256 * 256 * 2
    assert rows[1].weight_bytes == 256 * 256 // 2 + 2 * 256 * 2 * 2  # nibbles + 16-bit scale and zero per group
    plain = apply.gemv_speed(256, 256, [INT4], repeats=3)
    assert all(r.copies == 1 and r.hot_seconds is None for r in plain)
    with pytest.raises(ValueError, match="working_set"):
        apply.gemv_speed(256, 256, [INT4], working_set=0)


def test_a_timing_copy_owns_what_its_forward_reads():
    from course_lib.engine.layers import Linear

    base = Linear(torch.randn(64, 128))
    q = WeightOnlyLinear.from_linear(base, INT4)
    x = torch.randn(1, 128)
    want = q(x)
    c = apply._copy_for_timing(q)
    if q.path == "gemv":  # the course's kernel: its nibbles and fp16 scales
        assert c._gemv.packed.data_ptr() != q._gemv.packed.data_ptr() and c._gemv.s.data_ptr() != q._gemv.s.data_ptr()
    else:
        assert c._prepared[1].data_ptr() != q._prepared[1].data_ptr()
    torch.testing.assert_close(c(x), want)
    f = apply._copy_for_timing(base)
    assert f.weight.data_ptr() != base.weight.data_ptr() and torch.equal(f.weight, base.weight)
