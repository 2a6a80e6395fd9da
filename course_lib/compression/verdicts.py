"""Chapter 03's verdicts, each a function of the measurements, so that a test can feed it a counter-example.

A verdict's threshold is the claim's, not the run's: the committed benchmark's goals
(``benchmarks/quant_decode.py``: GEMV int8 ≥ 3×, int4 ≥ 5.5×; whole-model decode int8 ≥ 2.5×, int4 ≥ 4×
over fp32), the byte ratio (a speed-up "follows the bytes" when it reaches 80% of it), Amdahl's law for a
step that is not only weights (``amdahl_speedup``), a paired statistical test for quality differences on
the same held tokens (``requant.paired_z`` ≥ 2), and the papers' claims (GPTQ cuts RTN's loss; smoothing
cuts a large outlier's error). Timings pass their run-to-run spread, so a threshold inside the noise says
so (``measure.claims.claim(spread=)``). Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

from course_lib.measure.claims import claim

GEMV_GOALS = {"int8": 3.0, "int4": 5.5}  # benchmarks/quant_decode.py, one large product at batch 1
DECODE_GOALS = {"int8": 2.5, "int4": 4.0}  # benchmarks/quant_decode.py, end-to-end decode at batch 1
FOLLOWS_BYTES = 0.8  # a speed-up "follows the bytes" when it reaches this share of the byte ratio
AMDAHL_TOLERANCE = 0.25


def middle_spread(samples) -> float:
    """Half the interquartile range of repeated measurements over their median (0.1 = ±10%): the spread of
    the middle half, for ``claim(spread=)`` where a shared machine throws a few far outliers."""
    import statistics

    values = sorted(float(x) for x in samples)
    if len(values) < 4:
        raise ValueError(f"samples needs at least 4 repeats for quartiles, got {len(values)}")
    q1, _, q3 = statistics.quantiles(values, n=4)
    med = statistics.median(values)
    if med == 0:
        raise ValueError("samples have a median of 0: a relative spread is undefined")
    return (q3 - q1) / (2 * abs(med))


def ratio_spread(a, b) -> float:
    """The relative spread of a / b when a and b were timed in separate loops: their middle spreads add."""
    return middle_spread(a) + middle_spread(b)


def amdahl_speedup(t0_s: float, bytes_before: float, bytes_after: float, bandwidth: float) -> float:
    """The whole step's predicted speed-up when only its weight bytes shrink: the step is
    t = t₀ + bytes/bandwidth with t₀ the *measured* fixed part (``step_model``: the same step with
    zero-byte layers), held fixed. A prediction: no time of either format enters it."""
    from course_lib.compression.step_model import predicted_speedup

    return predicted_speedup(t0_s, bytes_before, bytes_after, bandwidth)


def gemv_goal(fmt: str, speedup: float, spread: float | None = None):
    """The benchmark's GEMV goal for ``fmt`` ("int8" or "int4") against fp32, every format read from DRAM."""
    if fmt not in GEMV_GOALS:
        raise ValueError(f"fmt must be one of {list(GEMV_GOALS)}, got {fmt!r}")
    return claim(
        f"{fmt} runs this product at least {GEMV_GOALS[fmt]}x faster than fp32 (the benchmark's goal)",
        speedup,
        at_least=GEMV_GOALS[fmt],
        spread=spread,
        why_not="the packed kernel does not stream its bytes at the fp32 kernel's rate on this CPU",
    )


def int4_follows_bytes_over_int8(speedup: float, byte_ratio: float, hot_over_cold: float, spread=None):
    """int4's speed-up over int8 reaches 80% of their byte ratio. ``hot_over_cold`` (int4's time with its
    weight in the cache ÷ from DRAM) explains a miss: near 1, bytes are not what its time is made of."""
    if not byte_ratio > 0:
        raise ValueError(f"byte_ratio must be > 0, got {byte_ratio!r}")
    why = (
        f"int4's time with its weight in the cache is {hot_over_cold:.0%} of its time from DRAM: the kernel is "
        "bound by its own work (unpacking two nibbles per byte, a scale and a zero per group), not by bytes"
        if hot_over_cold >= 0.7
        else f"int4 runs {1 / hot_over_cold:.1f}x faster from the cache than from DRAM, so it waits for bytes, "
        "but streams them at a lower rate than int8's kernel"
    )
    return claim(
        f"int4's speed-up over int8 reaches {FOLLOWS_BYTES:.0%} of their byte ratio ({byte_ratio:.2f}x)",
        speedup / byte_ratio,
        at_least=FOLLOWS_BYTES,
        spread=spread,
        why_not=why,
    )


def decode_goal(fmt: str, speedup: float, amdahl_cap: float, spread: float | None = None):
    """The benchmark's end-to-end goal for ``fmt`` against fp32; ``amdahl_cap`` is what the measured fixed
    part t₀ allows if ``fmt``'s kernels streamed at the measured bandwidth (fp32's measured step ÷
    (t₀ + bytes/bandwidth)), printed as the reason of a miss."""
    if fmt not in DECODE_GOALS:
        raise ValueError(f"fmt must be one of {list(DECODE_GOALS)}, got {fmt!r}")
    goal = DECODE_GOALS[fmt]
    why = (
        f"Amdahl: with this step's measured non-weight time held fixed, {fmt}'s bytes allow at most "
        f"{amdahl_cap:.2f}x, below the goal"
        if amdahl_cap < goal
        else f"Amdahl allows {amdahl_cap:.2f}x: the {fmt} kernels stream below the measured bandwidth"
    )
    return claim(
        f"{fmt} decodes the whole model at least {goal}x faster than fp32 (the benchmark's goal)",
        speedup,
        at_least=goal,
        spread=spread,
        why_not=why,
    )


def matches_amdahl(name: str, speedup: float, predicted: float, spread: float | None = None):
    """``name``'s measured whole-model speed-up is within ±25% of the Amdahl prediction from its bytes, the
    measured bandwidth and the measured t₀ (``amdahl_speedup``)."""
    if not predicted > 0:
        raise ValueError(f"predicted must be > 0, got {predicted!r}")
    return claim(
        f"{name}: the whole-model speed-up is within ±{AMDAHL_TOLERANCE:.0%} of Amdahl's prediction "
        f"from its bytes and the measured t0 ({predicted:.2f}x)",
        speedup / predicted,
        at_least=1 - AMDAHL_TOLERANCE,
        at_most=1 + AMDAHL_TOLERANCE,
        spread=spread,
        why_not="its kernels stream at a different share of the bandwidth than fp32's (above: they beat fp32's "
        "kernels on these shapes; below: they do extra work per byte)",
    )


def int8_nearly_free(ppl_rel: float):
    """int8 per channel costs under 1% perplexity (the reference is the model as shipped)."""
    return claim("int8 per channel costs under 1% perplexity", ppl_rel, at_most=0.01)


def smaller_groups_pay(z: float, coarse: str, fine: str):
    """``fine`` groups lose less than ``coarse`` ones, beyond the held text's sampling noise: the paired
    z of their per-token losses (``requant.paired_z(coarse, fine)``) is at least 2."""
    return claim(
        f"{fine} loses less than {coarse} on the held text, by at least 2 standard errors (paired per token)",
        z,
        at_least=2.0,
        why_not="on this much held text the difference is inside the sampling noise",
    )


def gptq_cuts_rtn_loss(rtn_rel: float, gptq_rel: float):
    """GPTQ (Frantar et al., 2022) cuts round-to-nearest's perplexity cost by at least a quarter at the
    same format: gptq_rel ≤ 0.75 · rtn_rel."""
    if not rtn_rel > 0:
        raise ValueError(f"rtn_rel must be > 0 (RTN's relative perplexity cost), got {rtn_rel!r}")
    return claim(
        "GPTQ cuts round-to-nearest's perplexity cost by at least a quarter at int4 g64 (recorded run)",
        gptq_rel / rtn_rel,
        at_most=0.75,
        why_not="too little calibration text to estimate the input correlations",
    )


def awq_cuts_rtn_loss(rtn_rel: float, awq_rel: float):
    """AWQ (Lin et al., 2023) cuts round-to-nearest's perplexity cost by at least a quarter at the same
    format, as GPTQ must: awq_rel ≤ 0.75 · rtn_rel."""
    if not rtn_rel > 0:
        raise ValueError(f"rtn_rel must be > 0 (RTN's relative perplexity cost), got {rtn_rel!r}")
    return claim(
        "AWQ cuts round-to-nearest's perplexity cost by at least a quarter at int4 g64 (recorded run)",
        awq_rel / rtn_rel,
        at_most=0.75,
        why_not="the salient channels are not where the mean |x| says, or one α per layer is too coarse",
    )


def awq_at_most_gptq(gptq_rel: float, awq_rel: float):
    """AWQ costs no more perplexity than GPTQ at the same format (Lin et al., 2023, report AWQ at or below
    GPTQ at int4 g128 on LLaMA and OPT): awq_rel ≤ gptq_rel."""
    if not gptq_rel > 0:
        raise ValueError(f"gptq_rel must be > 0 (GPTQ's relative perplexity cost), got {gptq_rel!r}")
    return claim(
        "AWQ costs no more perplexity than GPTQ at int4 g64 (recorded runs, the same held tokens)",
        awq_rel / gptq_rel,
        at_most=1.0,
        why_not="on this model GPTQ's error feedback buys more than AWQ's channel scaling",
    )


def smoothing_helps(plain: float, smoothed: float, outlier: float):
    """With an ``outlier``× channel, SmoothQuant cuts the other channels' int8 error at least 3×."""
    if not smoothed > 0:
        raise ValueError(f"smoothed must be > 0, got {smoothed!r}")
    return claim(
        f"with a {outlier:g}x outlier, smoothing cuts the other channels' int8 error at least 3x",
        plain / smoothed,
        at_least=3,
    )


__all__ = [
    "AMDAHL_TOLERANCE",
    "DECODE_GOALS",
    "FOLLOWS_BYTES",
    "GEMV_GOALS",
    "amdahl_speedup",
    "awq_at_most_gptq",
    "awq_cuts_rtn_loss",
    "middle_spread",
    "ratio_spread",
    "decode_goal",
    "gemv_goal",
    "gptq_cuts_rtn_loss",
    "int4_follows_bytes_over_int8",
    "int8_nearly_free",
    "matches_amdahl",
    "smaller_groups_pay",
    "smoothing_helps",
]
