"""Exercises of 07_parallelism.ipynb: the pipeline bubble, a ring all-reduce on NVLink, a re-measured
all-reduce between two local processes, and bytes moved between processes vs read from memory on the
learner's own machine."""

from __future__ import annotations

import math

from course_lib.exercises import check, check_measurement
from course_lib.measure.claims import Verdict


def check_bubble(answer, p: int = 4, m: int = 12) -> Verdict:
    """Exercise 1: the GPipe bubble fraction with p stages and m micro-batches."""
    from course_lib.parallel.pp_schedule import bubble_fraction

    return check(
        f"bubble fraction, p={p} stages, m={m} micro-batches",
        answer,
        bubble_fraction(p, m),
        rtol=0.01,
        hint="each stage idles p − 1 slots of the m + p − 1 the schedule takes: (p − 1)/(m + p − 1).",
    )


def check_allreduce_us(answer, nbytes: float = 16e6, p: int = 8, link: str = "nvlink4") -> Verdict:
    """Exercise 2: a ring all-reduce of ``nbytes`` over ``p`` GPUs on ``link``, in µs (the α–β model)."""
    from course_lib.parallel.interconnects import collective_time
    from course_lib.parallel.interconnects import link as get_link

    lk = get_link(link)
    return check(
        f"ring all-reduce of {nbytes / 1e6:.0f} MB over {p} GPUs on {link}",
        answer,
        collective_time("all_reduce", nbytes, p, link) * 1e6,
        rtol=0.02,
        unit="µs",
        hint=f"base + 2(p−1)·α + 2(p−1)/p · n · β with base = {lk.base * 1e6:.1f} µs per call, α = {lk.alpha * 1e6:.1f} µs "
        f"per ring step and β = 1/({1 / lk.beta / 1e9:.0f} GB/s).",
    )


def check_allreduce_ms(answer, nbytes: int = 4 * 2**20) -> Verdict:
    """Exercise 3 (re-measure): an all-reduce of ``nbytes`` between 2 local gloo processes, in ms."""
    from course_lib.parallel.collectives import measure_collectives

    def measure() -> float:
        return measure_collectives(2, [nbytes], ["all_reduce"], repeats=5)[0].seconds * 1e3

    return check_measurement(
        f"gloo all-reduce of {nbytes / 2**20:.0f} MiB between 2 processes",
        answer,
        measure,
        unit="ms",
        hint=f"collectives.measure_collectives(2, [{nbytes}], ['all_reduce'])[0].seconds * 1e3",
    )


def check_link_vs_memory(answer, beta: float, bandwidth: float) -> Verdict:
    """Exercise 4 (your machine): how many times longer moving a byte between two processes (β of your
    all-reduce fit) takes than reading it from memory at your measured bandwidth."""
    for name, v in (("beta", beta), ("bandwidth", bandwidth)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    return check(
        "seconds per byte between processes ÷ seconds per byte from memory",
        answer,
        beta * bandwidth,
        rtol=0.02,
        unit="x",
        hint="β is seconds per byte on the link; 1/bandwidth is seconds per byte from memory: divide them.",
    )
