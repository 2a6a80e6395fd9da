"""The computed reason a decode step read below the bandwidth roof."""

import pytest

from course_lib.bottlenecks.below_roof import why_below_roof


def test_slow_kernels_are_named_when_the_matmuls_alone_are_slow():
    text = why_below_roof(0.024, 540e6, 58e9, matmul_s=0.022, matmul_bytes=538e6, n_ops=10, per_op_s=3e-6)
    assert "24.5 GB/s (42%)" in text and "the matmul kernels themselves read below half the roof" in text
    assert text.endswith("(92% of the step)")


def test_overhead_is_named_when_dispatch_fills_the_step():
    text = why_below_roof(0.004, 20e6, 58e9, n_ops=1200, per_op_s=3e-6)
    assert "1200 torch ops x 3.00 µs = 3.6 ms of dispatch (90%)" in text
    assert "dispatching torch ops (overhead) (90% of the step)" in text


def test_work_around_fast_matmuls():
    text = why_below_roof(0.02, 540e6, 58e9, matmul_s=0.01, matmul_bytes=538e6)
    assert "matmul kernels" not in text and "the work around the matmuls (50% of the step)" in text


@pytest.mark.parametrize(
    "kw",
    [
        dict(step_s=0, step_bytes=1, bandwidth=1, n_ops=1, per_op_s=1e-6),
        dict(step_s=1, step_bytes=1, bandwidth=1),
        dict(step_s=1, step_bytes=1, bandwidth=1, n_ops=1),
        dict(step_s=1, step_bytes=1, bandwidth=1, n_ops=-1, per_op_s=1e-6),
    ],
)
def test_bad_input_is_named(kw):
    with pytest.raises(ValueError):
        why_below_roof(**kw)


def test_a_small_dispatch_share_is_not_called_the_cause():
    text = why_below_roof(0.02, 270e6, 33e9, n_ops=253, per_op_s=2.67e-6)
    assert "dispatch explains only 3%" in text and "largest measured part" not in text
