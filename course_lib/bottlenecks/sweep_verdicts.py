"""Chapter 01's roofline verdicts, with the roofline's own prediction as each threshold.

``level_off_verdict``: the roofline says an intensity sweep climbs the bandwidth slope and levels off at
the compute roof, reaching half of it at half the ridge intensity. A curve that flattens near the ridge
but far *below* the roof (op overhead sets its plateau) does not confirm that, so the verdict locates
the knee where the FLOP/s first reach half the roof, and fails, saying where the plateau sat, when they
never do. ``batch_cost_verdict``: below the ridge batch the roofline predicts a decode step of batch b
costs floor(b) ÷ floor(1) times batch 1's (≈ 1: the weights are read once for all rows); the claim
"adding sequences costs little" holds when the measured ratio stays within ``tolerance`` of that
prediction, not merely below b/2. Introduced in 01_bottlenecks_1_roofline_overhead.ipynb and 01_bottlenecks_2_prefill_decode.ipynb.
"""

from __future__ import annotations

from collections.abc import Mapping

from course_lib.measure.claims import Verdict, claim

#: "Near the ridge": the knee within this factor of where the roofline puts it, either way.
KNEE_FACTOR = 2.0


def level_off_verdict(
    gflops: Mapping[int, float], peak_gflops: float, k_ridge: float, *, low_plateau_reason: str = ""
) -> Verdict:
    """``gflops``: {k (FMA steps per element): measured GFLOP/s}; ``peak_gflops``: the compute roof;
    ``k_ridge``: the k whose intensity is the ridge (4 × ridge for fp32). The roofline reaches half the
    roof at k_ridge / 2; the claim holds when the sweep first reaches half the roof within
    ``KNEE_FACTOR`` of that k. ``low_plateau_reason`` is added to the reason when it never does."""
    if not gflops or not peak_gflops > 0 or not k_ridge > 0:
        raise ValueError("gflops must be a non-empty {k: GFLOP/s}, and peak_gflops and k_ridge > 0")
    statement = "the FLOP/s level off at the compute roof near the ridge"
    reached = [k for k in sorted(gflops) if gflops[k] >= 0.5 * peak_gflops]
    if not reached:
        best = max(gflops.values()) / peak_gflops
        return claim(
            f"{statement} (first: they reach half the roof)",
            best,
            at_least=0.5,
            why_not=f"the sweep levels off at {best:.0%} of the roof: something other than this roof sets the "
            "plateau, so where it flattens says nothing about the ridge"
            + (f"; {low_plateau_reason}" if low_plateau_reason else ""),
        )
    knee = reached[0] / (k_ridge / 2)
    return claim(
        f"{statement} (half the roof reached at k = {reached[0]}; the roofline says k = {k_ridge / 2:.0f})",
        knee,
        at_least=1 / KNEE_FACTOR,
        at_most=KNEE_FACTOR,
        why_not="the sweep reached the roof's height but not where the measured bandwidth and peak put "
        "the ridge: the two peaks were measured on other kernels than this one",
    )


def batch_cost_verdict(
    batch: int,
    measured_ratio: float,
    predicted_ratio: float,
    *,
    tolerance: float = 0.25,
    spread=None,
    why_not: str = "",
) -> Verdict:
    """``measured_ratio`` = step(batch) ÷ step(1); ``predicted_ratio`` = the roofline floors' same ratio.
    Holds when measured ≤ predicted × (1 + ``tolerance``); ``spread`` as in ``claim``; ``why_not``: a reason
    computed from the run (none is printed without one)."""
    if not predicted_ratio > 0 or not tolerance >= 0:
        raise ValueError(f"predicted_ratio must be > 0 and tolerance >= 0, got {predicted_ratio!r}, {tolerance!r}")
    return claim(
        f"below the ridge batch, a batch of {batch} costs what the roofline predicts: at most "
        f"{1 + tolerance:.2f} x its {predicted_ratio:.2f}x batch 1's step",
        measured_ratio,
        at_most=predicted_ratio * (1 + tolerance),
        spread=spread,
        why_not=why_not,
    )
