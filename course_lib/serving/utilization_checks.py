"""Chapter 02-2's verdicts on throughput and utilization, each with the claim's own threshold.

MFU and MBU orderings judged against what the roofline predicts for them (not against 1); MFU against the
measured matmul peak and against the theoretical peak, each with its own bar; "utilization is not the goal"
(Huyen) as a comparison of each phase's use of the resource that binds it; busy time that cannot tell a
low-MFU loop from a high-MFU one; the uncertainty of the latency fit's output:input ratio (a residual
bootstrap) and its reconciliation with the ratio of the measured parts (TPOT over the TTFT slope). Prefill is
compute-bound and decode bandwidth-bound; these functions only compute, the notebook measures. Introduced in
02_metrics_2_throughput_utilization.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from course_lib.measure.claims import Verdict, claim
from course_lib.measure.costs import check_positive_int


# ----------------------------------------------------------------------------- MFU / MBU orderings
def roofline_orderings(shape, *, prompt_len: int, context_len: int, peak_flops: float, bandwidth: float, dtype="fp32"):
    """(prefill MFU ÷ decode MFU, decode MBU ÷ prefill MBU) if each phase ran exactly at its roofline floor
    (batch-1 decode): the size of the orderings Huyen states, predicted."""
    from course_lib.bottlenecks import roof_check, time_floors

    u = roof_check.utilization(
        shape,
        prompt_len=prompt_len,
        ttft_s=time_floors.prefill_time(shape, prompt_len, peak_flops, bandwidth, dtype),
        context_len=context_len,
        tpot_by_batch={1: time_floors.decode_time(shape, context_len, peak_flops, bandwidth, dtype)},
        peak_flops=peak_flops,
        bandwidth=bandwidth,
        dtype=dtype,
    )
    return u["prefill"]["mfu"] / u["decode b=1"]["mfu"], u["decode b=1"]["mbu"] / u["prefill"]["mbu"]


def ordering(
    statement: str, measured_ratio: float, predicted_ratio: float, spread=None, uses: dict[str, float] | None = None
) -> Verdict:
    """Claim: an ordering holds by at least half the factor the roofline predicts for it. ``uses``: each
    phase's share of its own binding roof (``binding_use``), from which the reason is computed: the phase
    farthest below its roof is the one that brought the two utilizations closer."""
    why = ""
    if uses:
        (low, u_low), *_ = sorted(uses.items(), key=lambda kv: kv[1])
        shares = ", ".join(f"{name} {u:.0%}" for name, u in uses.items())
        why = f"each phase's use of its binding roof: {shares}; the {low}, farthest below its roof, narrows the gap"
    return claim(
        f"{statement}, by at least half the roofline's {predicted_ratio:.0f}x",
        measured_ratio,
        at_least=predicted_ratio / 2,
        spread=spread,
        why_not=why,
    )


# ----------------------------------------------------------------------------- MFU, two peaks
def mfu_two_peaks(flops_per_s: float, measured_peak: float, theoretical_peak: float | None) -> dict:
    """{"measured": MFU vs the measured matmul peak, "theoretical": vs cores x clock x FLOP/cycle (or None)}."""
    return {
        "measured": flops_per_s / measured_peak,
        "theoretical": None if not theoretical_peak else flops_per_s / theoretical_peak,
    }


def mfu_good_theoretical(mfu_theoretical: float) -> Verdict:
    """Huyen's bar, defined against the theoretical peak: MFU > 50% is good."""
    return claim(
        "prefill clears Huyen's bar: MFU > 50% of the theoretical peak",
        mfu_theoretical,
        at_least=0.5,
        why_not="the matmuls do not keep the FMA units busy (too few rows, or the library's kernel)",
    )


def mfu_near_measured(mfu_measured: float, spread=None, why_not: str = "") -> Verdict:
    """The measured peak's own bar: the prefill runs within 20% of this machine's best square matmul.
    ``why_not``: a reason computed from the run (none is printed without one)."""
    return claim(
        "prefill runs as fast as this machine's best matmul (>= 80% of the measured matmul peak)",
        mfu_measured,
        at_least=0.8,
        spread=spread,
        why_not=why_not,
    )


def bf16_theoretical(fp32_theoretical: float | None, isa: Sequence[str]) -> float | None:
    """bf16 FLOP/s ceiling: 2x fp32 where AVX-512 BF16 is present (VDPBF16PS does two bf16 products per fp32
    lane per instruction), else None (no bf16 FMA: bf16 is converted and runs at the fp32 rate or below)."""
    if not fp32_theoretical:
        return None
    return 2 * fp32_theoretical if "avx512_bf16" in set(isa) else None


# ----------------------------------------------------------------------------- utilization is not the goal
def binding_use(mfu: float, mbu: float) -> float:
    """How well a phase uses the resource that binds it: the larger of its MFU and MBU."""
    return max(mfu, mbu)


def low_mfu_can_be_optimal(
    decode_mfu: float, decode_mbu: float, prefill_mfu: float, prefill_mbu: float, why_not: str = ""
) -> Verdict:
    """Claim (Huyen): utilization is not the goal. The batch-1 decode, at a small MFU, uses its binding resource
    (bandwidth) at least half as well as the prefill uses its own (compute). ``why_not``: the measured reason
    the decode read below its roof (``bottlenecks.below_roof.why_below_roof``); none is printed without it."""
    return claim(
        f"a decode at {decode_mfu:.1%} MFU is not badly run: it uses the resource that binds it (bandwidth) at "
        "least half as well as the prefill uses compute",
        binding_use(decode_mfu, decode_mbu) / binding_use(prefill_mfu, prefill_mbu),
        at_least=0.5,
        why_not=why_not,
    )


# ----------------------------------------------------------------------------- busy is not MFU
def busy_blind(busy_a: float, busy_b: float, mfu_a: float, mfu_b: float) -> tuple[Verdict, Verdict]:
    """Two claims: the two loops' MFUs differ >= 5x, and their busy shares differ < 1.25x (busy cannot tell)."""
    hi, lo = max(mfu_a, mfu_b), min(mfu_a, mfu_b)
    differ = claim("the two loops' MFUs differ at least 5x", hi / lo if lo > 0 else float("inf"), at_least=5)
    b_hi, b_lo = max(busy_a, busy_b), min(busy_a, busy_b)
    blind = claim(
        "busy time cannot tell them apart: their busy shares differ by less than 1.25x",
        b_hi / b_lo if b_lo > 0 else float("inf"),
        at_most=1.25,
        why_not="the low-MFU loop left its cores idle (no spin-waiting thread pool): busy time tracked the work",
    )
    return differ, blind


# ----------------------------------------------------------------------------- the output:input ratio
def bootstrap_fit_ratio(points, draws: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """(5th, 50th, 95th percentile) of c/b of latency = a + b·input + c·output under a residual bootstrap:
    refit ``draws`` times with the fit's residuals resampled onto its fitted values."""
    arr = np.asarray(list(points), dtype=float)
    if arr.ndim != 2 or arr.shape[1] != 3 or arr.shape[0] < 4:
        raise ValueError("points must be at least 4 (input_tokens, output_tokens, latency_s) triples")
    check_positive_int("draws", draws)
    X = np.column_stack([np.ones(len(arr)), arr[:, 0], arr[:, 1]])  # (N, 3)
    coef, *_ = np.linalg.lstsq(X, arr[:, 2], rcond=None)
    fitted = X @ coef
    resid = arr[:, 2] - fitted
    resid = resid * np.sqrt(len(arr) / (len(arr) - 3))  # undo the fit's shrinkage of the residuals
    rng = np.random.default_rng(seed)
    ys = fitted + rng.choice(resid, size=(draws, len(arr)), replace=True)  # (draws, N)
    coefs = np.linalg.lstsq(X, ys.T, rcond=None)[0]  # (3, draws)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = coefs[2] / coefs[1]
    lo, mid, hi = np.percentile(ratios[np.isfinite(ratios)], [5, 50, 95])
    return float(lo), float(mid), float(hi)


def parts_ratio(tpot_s: float, ttft_short_s: float, ttft_long_s: float, n_short: int, n_long: int) -> float:
    """One output token in input tokens from the measured parts: TPOT ÷ the TTFT slope per prompt token."""
    if n_long <= n_short:
        raise ValueError(f"n_long must exceed n_short, got {n_long} and {n_short}")
    slope = (ttft_long_s - ttft_short_s) / (n_long - n_short)
    return tpot_s / slope if slope > 0 else float("inf")


def ratios_agree(parts: float, interval: tuple[float, float, float]) -> Verdict:
    """Claim: the parts' ratio lies inside the fit's bootstrap 90% interval."""
    lo, _, hi = interval
    return claim(
        f"the fit's ratio and the parts' ratio agree: TPOT / TTFT slope lies in the fit's 90% interval "
        f"[{lo:.0f}, {hi:.0f}]",
        parts,
        at_least=lo,
        at_most=hi,
        why_not="the plane's c is not a lone request's TPOT (the fit spreads TTFT's curvature over a, b and c), "
        "or the two were measured under different loads",
    )


__all__ = [
    "binding_use",
    "bf16_theoretical",
    "bootstrap_fit_ratio",
    "busy_blind",
    "low_mfu_can_be_optimal",
    "mfu_good_theoretical",
    "mfu_near_measured",
    "mfu_two_peaks",
    "ordering",
    "parts_ratio",
    "ratios_agree",
    "roofline_orderings",
]
