"""Chapter 02-1's verdicts on latency, each a computation a counter-example can fail.

A sentence about a measurement is a prediction or a computed verdict (STYLE 14, 19): where a decode step's
growth with the batch goes (the matmuls or the rest; the kernel a linear layer hands the rows to), how much of
a step is the dispatch of empty ops, per-request latency predicted from each request's own prompt and answer
length (so what the prediction misses is measured, not called "noise"), how stable a p99 is over resamples of
n requests, and the bootstrap spread of a ratio of percentiles. Bandwidth-bound decode and compute-bound
prefill are the regimes these check; the thresholds are the claims', not the run's. Introduced in
02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from course_lib.measure.claims import Verdict, claim
from course_lib.measure.costs import check_positive_int


# ----------------------------------------------------------------------------- where a step's growth goes
def growth_split(tpot_lo: float, tpot_hi: float, mm_lo: float, mm_hi: float) -> tuple[float, float]:
    """(matmuls' share, the rest's share) of a step's growth from one batch to a bigger one (seconds in)."""
    total = tpot_hi - tpot_lo
    if not total > 0:
        return (float("nan"), float("nan"))
    return (mm_hi - mm_lo) / total, ((tpot_hi - mm_hi) - (tpot_lo - mm_lo)) / total


def growth_in_matmuls(b_lo: int, b_hi: int, tpot_lo, tpot_hi, mm_lo, mm_hi, spread=None) -> Verdict:
    """Claim: most (≥ half) of the step's growth from ``b_lo`` to ``b_hi`` rows is in the matmuls."""
    mm_share, _ = growth_split(tpot_lo, tpot_hi, mm_lo, mm_hi)
    return claim(
        f"the step's growth from batch {b_lo} to {b_hi} is mostly in the matmuls (>= half of it)",
        0.0 if not np.isfinite(mm_share) else mm_share,
        at_least=0.5,
        spread=spread,
        why_not="the per-sequence work outside the matmuls (attention, KV writes, sampling) grew more",
    )


def time_packed_matmuls(engine, batch: int, repeats: int | None = None):
    """The step's matmuls for ``batch`` rows through oneDNN's packed kernel (``layers.PackedLinear``, packed
    for ``batch`` rows), beside ``profiling.time_matmuls`` for whatever kernel the engine's seam picks. Copies
    of the weights (fine for a small model). CPU and fp32/bf16 only."""
    from course_lib.engine.layers import PackedLinear
    from course_lib.measure.bench import benchmark

    check_positive_int("batch", batch)
    lins = [lin for _, lin in engine.model.linears()]
    if not all(PackedLinear.available(lin.weight) for lin in lins):
        raise ValueError("time_packed_matmuls needs fp32 or bf16 weights on a CPU with oneDNN")
    packed = [PackedLinear(lin.weight.detach().clone(), rows_hint=batch) for lin in lins]
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(batch, p.in_features, generator=gen) for p in packed]  # (B, in)

    def run() -> None:
        for x, p in zip(xs, packed):
            p(x)  # (B, out)

    flops = sum(2.0 * batch * p.in_features * p.out_features for p in packed)
    moved = sum(p.in_features * p.out_features * 4 for p in packed)
    with torch.inference_mode():
        return benchmark(run, flops=flops, bytes=moved, device="cpu", repeats=repeats, label=f"packed, batch {batch}")


def kernel_switch(batch: int, routed_s: float, packed_s: float, spread=None) -> Verdict:
    """Claim: at ``batch`` rows the kernel the seam hands them to is >= 1.5x slower than the packed kernel."""
    return claim(
        f"at batch {batch} the kernel SkinnyLinear hands the rows to (F.linear, MKL) is at least 1.5x slower "
        "than the packed oneDNN kernel it uses up to 16 rows",
        routed_s / packed_s,
        at_least=1.5,
        spread=spread,
        why_not="on this machine MKL's path is as fast as oneDNN's at this many rows: the jump is elsewhere",
    )


# ----------------------------------------------------------------------------- a step's parts
@dataclass(frozen=True)
class StepSplit:
    """One decode step split into its matmuls, the dispatch of its ops (as empty ops) and the remainder."""

    step_s: float
    matmul_s: float
    n_ops: int
    empty_op_s: float

    @property
    def dispatch_s(self) -> float:
        return self.n_ops * self.empty_op_s

    @property
    def other_s(self) -> float:
        """Neither matmul nor empty-op dispatch: the non-matmul ops' own work, Python, sampling."""
        return max(0.0, self.step_s - self.matmul_s - self.dispatch_s)

    @property
    def per_other_op_s(self) -> float:
        """What each non-matmul op costs on average (step minus matmuls over the op count)."""
        return (self.step_s - self.matmul_s) / self.n_ops

    def describe(self) -> str:
        s = self.step_s
        return (
            f"step {s * 1e3:.2f} ms = matmuls {self.matmul_s * 1e3:.2f} ms ({self.matmul_s / s:.0%}) + "
            f"{self.n_ops} ops x {self.empty_op_s * 1e6:.1f} us of empty-op dispatch {self.dispatch_s * 1e3:.2f} ms "
            f"({self.dispatch_s / s:.0%}) + the ops' own work {self.other_s * 1e3:.2f} ms ({self.other_s / s:.0%}); "
            f"a non-matmul op costs {self.per_other_op_s * 1e6:.1f} us on average, "
            f"{self.per_other_op_s / self.empty_op_s:.1f}x an empty op"
        )


def dispatch_is_most(split: StepSplit) -> Verdict:
    """Claim: the dispatch of the step's ops (counted as empty ops) is most (>= half) of the step."""
    return claim(
        "op dispatch (the step's ops x the cost of an empty op) is most of the step (>= half)",
        split.dispatch_s / split.step_s,
        at_least=0.5,
        why_not=(
            f"dispatch is {split.dispatch_s / split.step_s:.0%} of the step, the matmuls "
            f"{split.matmul_s / split.step_s:.0%} and the ops' own work {split.other_s / split.step_s:.0%}: "
            f"a non-matmul op costs {split.per_other_op_s / split.empty_op_s:.1f}x an empty op here"
        ),
    )


# ----------------------------------------------------------------------------- per-request latency
@dataclass(frozen=True)
class LatencyModel:
    """latency_i ≈ TTFT(prompt_i) + TPOT · (n_i − 1), TTFT linear in the prompt length."""

    ttft0_s: float  # TTFT intercept
    ttft_per_token_s: float  # TTFT slope per prompt token
    tpot_s: float

    def predict(self, prompt_lens, n_outputs) -> np.ndarray:
        p, n = np.asarray(prompt_lens, float), np.asarray(n_outputs, float)
        return self.ttft0_s + self.ttft_per_token_s * p + self.tpot_s * (n - 1)


def fit_latency_model(traces) -> LatencyModel:
    """TTFT vs prompt length by least squares over ``traces``; TPOT their median (requests with >= 2 tokens)."""
    traces = list(traces)
    if len(traces) < 3:
        raise ValueError(f"traces must hold at least 3 RequestTrace, got {len(traces)}")
    p = np.array([t.prompt_tokens for t in traces], float)
    y = np.array([t.ttft for t in traces], float)
    if np.ptp(p) == 0:
        slope, icpt = 0.0, float(np.median(y))
    else:
        slope, icpt = np.polyfit(p, y, 1)
    tpot = float(np.median([t.tpot for t in traces if t.n_output > 1]))
    return LatencyModel(float(icpt), float(slope), tpot)


def residual_share(traces, model: LatencyModel, q: float = 90) -> float:
    """The ``q``-th percentile of |measured − predicted| / measured latency over ``traces``."""
    lat = np.array([t.latency for t in traces])
    pred = model.predict([t.prompt_tokens for t in traces], [t.n_output for t in traces])
    return float(np.percentile(np.abs(lat - pred) / lat, q))


def miss_reason(traces, model: LatencyModel, tol: float = 0.1) -> str:
    """Which way the per-request model missed, computed: how many requests it missed by more than ``tol``,
    how many of those ran slower than predicted, and how many sit in the measured top 10% of latencies."""
    lat = np.array([t.latency for t in traces])
    pred = model.predict([t.prompt_tokens for t in traces], [t.n_output for t in traces])
    miss = np.abs(lat - pred) / lat > tol
    if not miss.any():
        return ""
    slower = int(np.sum(miss & (lat > pred)))
    top = int(np.sum(miss & (lat >= np.percentile(lat, 90))))
    way = (
        "mostly slower than predicted: time the lengths do not carry"
        if slower >= 0.7 * miss.sum()
        else "on both sides: the fitted TTFT and TPOT themselves are off for part of the mix"
    )
    return f"{int(miss.sum())} of {len(lat)} requests missed by more than {tol:.0%}, {slower} of them slower, {top} in the measured top 10%: {way}"


def per_request_prediction(share: float, q: float = 90, tol: float = 0.1, why_not: str = "") -> Verdict:
    """Claim: the per-request model predicts q% of latencies within ``tol``; ``why_not``: ``miss_reason``."""
    return claim(
        f"each request's latency is its own TTFT(prompt) + TPOT x (n - 1): {q:g}% of requests within {tol:.0%}",
        share,
        at_most=tol,
        why_not=why_not,
    )


# ----------------------------------------------------------------------------- percentile stability
def bootstrap_percentile_spread(values, n: int, q: float = 99, draws: int = 400, seed: int = 0) -> float:
    """Relative spread of the ``q``-th percentile over ``draws`` resamples of ``n`` values: half the 5–95%
    range of the resampled percentiles over their median (0.1 = ±10%)."""
    values = np.asarray(values, float)
    if values.ndim != 1 or len(values) < 2:
        raise ValueError("values must be a 1-D sequence of at least 2 numbers")
    check_positive_int("n", n)
    check_positive_int("draws", draws)
    rng = np.random.default_rng(seed)
    est = np.percentile(rng.choice(values, size=(draws, n), replace=True), q, axis=1)
    lo, mid, hi = np.percentile(est, [5, 50, 95])
    return float((hi - lo) / 2 / mid)


def bootstrap_ratio_spread(values, q_hi: float = 99, q_lo: float = 50, draws: int = 400, seed: int = 0) -> float:
    """Relative spread (half the 5–95% range over the median) of p``q_hi``/p``q_lo`` over resamples of ``values``."""
    values = np.asarray(values, float)
    if values.ndim != 1 or len(values) < 2:
        raise ValueError("values must be a 1-D sequence of at least 2 numbers")
    rng = np.random.default_rng(seed)
    samp = rng.choice(values, size=(draws, len(values)), replace=True)
    r = np.percentile(samp, q_hi, axis=1) / np.percentile(samp, q_lo, axis=1)
    lo, mid, hi = np.percentile(r, [5, 50, 95])
    return float((hi - lo) / 2 / mid)


def p99_spread_table(values, sizes: Sequence[int], q: float = 99, draws: int = 400, seed: int = 0) -> list:
    """[(n, relative spread of the p``q`` of n requests)] for each n in ``sizes``."""
    return [(int(n), bootstrap_percentile_spread(values, int(n), q, draws, seed)) for n in sizes]


__all__ = [
    "LatencyModel",
    "StepSplit",
    "bootstrap_percentile_spread",
    "bootstrap_ratio_spread",
    "dispatch_is_most",
    "fit_latency_model",
    "growth_in_matmuls",
    "growth_split",
    "kernel_switch",
    "p99_spread_table",
    "per_request_prediction",
    "residual_share",
    "time_packed_matmuls",
]
