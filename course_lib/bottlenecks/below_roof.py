"""Why a decode step read below the bandwidth roof, computed from what was measured, never written by hand.

A claim such as "decode at batch 1 is bandwidth-bound: MBU ≥ 50%" fails on some machines. The reason a
chapter prints under the ✗ must be one that the next cell cannot refute, so it is computed from two
measurements of the same step:
- its **dispatch floor**: the torch ops one step issues (``profiling.count_ops``) × the profile's per-op cost;
- its **matmuls alone** (``profiling.time_matmuls``): the weights streamed with nothing around them.
If the matmuls alone read below half the roof, the kernels themselves are the cause; if the step takes much
longer than its matmuls, the work around them is; the dispatch floor says how much of that is overhead.
"""

from __future__ import annotations

import math


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def why_below_roof(
    step_s: float,
    step_bytes: float,
    bandwidth: float,
    *,
    n_ops: int | None = None,
    per_op_s: float | None = None,
    matmul_s: float | None = None,
    matmul_bytes: float | None = None,
) -> str:
    """The measured reasons a step of ``step_bytes`` taking ``step_s`` reads below ``bandwidth`` (bytes/s).
    ``n_ops`` × ``per_op_s``: the step's dispatch floor; ``matmul_s`` (for ``matmul_bytes`` of weights): its
    matmuls timed alone. Give at least one of the two."""
    step_s, step_bytes, bandwidth = (
        _positive(n, v) for n, v in (("step_s", step_s), ("step_bytes", step_bytes), ("bandwidth", bandwidth))
    )
    if (n_ops is None) != (per_op_s is None) or (matmul_s is None) != (matmul_bytes is None):
        raise ValueError("give n_ops with per_op_s, and matmul_s with matmul_bytes")
    if n_ops is None and matmul_s is None:
        raise ValueError("give the dispatch floor (n_ops, per_op_s) or the matmuls' time (matmul_s, matmul_bytes)")
    bw = bandwidth / 1e9
    parts = [f"the step read {step_bytes / step_s / 1e9:.1f} GB/s of this machine's {bw:.1f} GB/s"]
    causes = []
    if matmul_s is not None:
        mm_s, mm_b = _positive("matmul_s", matmul_s), _positive("matmul_bytes", matmul_bytes)
        mm_gbps = mm_b / mm_s / 1e9
        rest = step_s - mm_s
        parts.append(f"its matmuls alone read {mm_gbps:.1f} GB/s ({mm_gbps / bw:.0%}) in {mm_s * 1e3:.1f} ms")
        if mm_gbps < 0.5 * bw:
            causes.append((mm_s / step_s, "the matmul kernels themselves read below half the roof"))
        if rest > 0:
            parts.append(f"the rest of the step takes {rest * 1e3:.1f} ms ({rest / step_s:.0%})")
            causes.append((rest / step_s, "the work around the matmuls"))
    if n_ops is not None:
        if isinstance(n_ops, bool) or not isinstance(n_ops, int) or n_ops < 0:
            raise ValueError(f"n_ops must be an int >= 0, got {n_ops!r}")
        floor = n_ops * _positive("per_op_s", per_op_s)
        parts.append(
            f"{n_ops} torch ops x {per_op_s * 1e6:.2f} µs = {floor * 1e3:.1f} ms of dispatch ({floor / step_s:.0%})"
        )
        causes.append((floor / step_s, "dispatching torch ops (overhead)"))
    share, cause = max(causes) if causes else (0.0, "")
    if share >= 0.5:
        verdict = f"the largest measured part: {cause} ({share:.0%} of the step)"
    elif matmul_s is None:
        verdict = (
            f"dispatch explains only {share:.0%}: the rest is the kernels and their memory traffic, "
            "which this step's matmuls were not timed alone to split"
        )
    else:
        verdict = f"no single measured part dominates; the largest is {cause} ({share:.0%} of the step)"
    return "; ".join(parts) + f"; {verdict}"


__all__ = ["why_below_roof"]
