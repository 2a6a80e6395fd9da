"""Exercises of 06_batching_serving.ipynb: decode steps of static vs continuous batching, goodput under
an SLO, a re-measured continuous-over-static throughput, and the bandwidth ceiling of a decode batch on
the learner's own machine."""

from __future__ import annotations

import math

from course_lib.exercises import check, check_measurement
from course_lib.measure.claims import Verdict


def _lengths(name: str, lengths) -> list[int]:
    if (
        not isinstance(lengths, (list, tuple))
        or not lengths
        or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in lengths)
    ):
        raise ValueError(f"{name} must be a non-empty list of ints ≥ 1, got {lengths!r}")
    return list(lengths)


def static_steps(lengths, batch: int) -> int:
    """Decode steps static batching needs: requests in arrival order, ``batch`` at a time, each batch
    running until its longest request ends."""
    lengths = _lengths("lengths", lengths)
    return sum(max(lengths[i : i + batch]) for i in range(0, len(lengths), batch))


def check_static_steps(answer, lengths=(12, 3, 40, 5, 8, 30, 2, 6), batch: int = 4) -> Verdict:
    """Exercise 1: decode steps of static batching (continuous batching needs about Σ lengths / batch)."""
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, int)):
        raise ValueError(f"answer must be an int (a number of steps), got {answer!r}")
    return check(
        f"decode steps, static batching of {list(lengths)} in batches of {batch}",
        answer,
        static_steps(list(lengths), batch),
        rtol=0.0,
        hint="each batch of 4 (in order) runs as long as its longest request: add those maxima.",
    )


def check_goodput(answer, ttft_s, tpot_s, duration_s: float, slo_ttft: float = 1.0, slo_tpot: float = 0.05) -> Verdict:
    """Exercise 2: requests per second that met both parts of the SLO."""
    if len(ttft_s) != len(tpot_s) or not ttft_s:
        raise ValueError("ttft_s and tpot_s must be equally long, non-empty lists of seconds")
    met = sum(a <= slo_ttft and b <= slo_tpot for a, b in zip(ttft_s, tpot_s))
    return check(
        f"goodput (TTFT ≤ {slo_ttft} s and TPOT ≤ {slo_tpot} s)",
        answer,
        met / duration_s,
        rtol=0.01,
        unit="req/s",
        hint="count the requests meeting BOTH bounds, divide by the duration; throughput counts them all.",
    )


def check_continuous_gain(answer, engine, trace, max_num_seqs: int = 16) -> Verdict:
    """Exercise 3 (re-measure): continuous ÷ static throughput on ``trace`` with the real engine."""
    from course_lib.engine import SchedulerConfig
    from course_lib.serving.simulator.wall_clock import run_real

    def measure() -> float:
        tput = {
            p: run_real(engine, trace, SchedulerConfig(policy=p, max_num_seqs=max_num_seqs)).throughput
            for p in ("continuous", "static")
        }
        return tput["continuous"] / tput["static"] - 1

    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (int, float))):
        raise ValueError(f"answer must be a number (a ratio of throughputs), got {answer!r}")
    return check_measurement(  # the gain above 1 within 35%: a ratio of 1.0 ("no gain") fails a real gain
        "continuous ÷ static throughput − 1 (the gain above none)",
        None if answer is None else answer - 1,
        measure,
        unit="x",
        hint="run_real(engine, trace, SchedulerConfig(policy=p, max_num_seqs=16)).throughput for both policies",
    )


def check_decode_ceiling(answer, bandwidth: float, weight_bytes: float, batch: int = 16) -> Verdict:
    """Exercise 4 (your peaks): the most tokens/s a decode batch can produce if every step must stream the
    weights once at ``bandwidth`` (the bandwidth roof of chapter 01)."""
    for name, v in (("bandwidth", bandwidth), ("weight_bytes", weight_bytes)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    return check(
        f"tokens/s ceiling of a batch of {batch} on your bandwidth",
        answer,
        batch * bandwidth / weight_bytes,
        rtol=0.02,
        unit="tok/s",
        hint="one step streams the weights once and yields one token per sequence: batch / (weight bytes / bandwidth).",
    )
