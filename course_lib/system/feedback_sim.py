"""Simulated users with a known ground truth, to show what feedback can and cannot tell.

Each variant of the system has a true quality: the probability that a response is good. A simulated user
sees a response, and if it is good rarely regenerates, edits or abandons, if it is bad often does (``USER``);
a few users rate it, and more of them when it is bad (people complain more readily than they praise). The
log (``feedback``) gets only what a real log gets: the signals, never whether the response was good. Two
known limits follow. *Sparse*: with a few percent of responses rated, the thumbs-up rate's confidence
interval is wide, and two variants a few points apart cannot be told apart; implicit signals come with every
response and narrow it, at the price of being proxies. *Position bias*: in a side-by-side comparison, some
users pick the first answer shown whatever it says (Zheng et al. 2023 measure it in LLM judges; Joachims et
al. 2005 in search clicks); if one variant is always shown first, its win rate is inflated, and randomising
the order removes the bias from the mean. ``wilson`` is the interval to report with a rate.
Introduced in 08_system_2_agents_observability_feedback.ipynb.
"""

from __future__ import annotations

import math
import random

from course_lib.system import feedback

#: the simulated user's probability of each signal, given a good or a bad response
USER = {
    "good": {"regenerate": 0.05, "edit": 0.05, "abandon": 0.03, "rate": 1.0, "flip": 0.1},
    "bad": {"regenerate": 0.35, "edit": 0.20, "abandon": 0.15, "rate": 2.0, "flip": 0.1},
}  # "rate": a multiple of rate_share; "flip": a rating that says the opposite of the truth


def _quality(quality) -> dict[str, float]:
    if not isinstance(quality, dict) or len(quality) < 2:
        raise ValueError(f"quality must be a dict of at least 2 variant -> P(good), got {quality!r}")
    for k, v in quality.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise ValueError(f"quality must map variant names to probabilities in [0, 1], got {k!r}: {v!r}")
    return dict(quality)


def _share(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")
    return float(v)


def _n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    return n


def simulate_sessions(conn, n: int, quality: dict, rate_share: float = 0.04, seed: int = 0) -> dict[str, float]:
    """``n`` responses, each of a uniformly chosen variant, with the signals ``USER`` gives; returns the
    share of good responses per variant in this sample (the ground truth the log does not see)."""
    quality, n, rate_share = _quality(quality), _n(n), _share("rate_share", rate_share)
    rng = random.Random(seed)
    variants = sorted(quality)
    good_counts = dict.fromkeys(variants, 0)
    totals = dict.fromkeys(variants, 0)
    conn.execute("BEGIN")
    for i in range(n):
        v = rng.choice(variants)
        good = rng.random() < quality[v]
        totals[v] += 1
        good_counts[v] += good
        user = USER["good" if good else "bad"]
        rid = feedback.log_response(conn, i, v)
        if rng.random() < min(1.0, rate_share * user["rate"]):
            feedback.log_event(conn, rid, "rating", int(good) if rng.random() >= user["flip"] else 1 - int(good))
        for kind in ("regenerate", "edit", "abandon"):
            if rng.random() < user[kind]:
                feedback.log_event(conn, rid, kind)
    conn.execute("COMMIT")
    return {v: good_counts[v] / totals[v] if totals[v] else math.nan for v in variants}


def true_win_rate(quality: dict, variant: str, other: str) -> float:
    """P(a user without position bias picks ``variant`` over ``other``): it is good and the other bad, or
    both alike and a coin flip."""
    quality = _quality(quality)
    if variant not in quality or other not in quality or variant == other:
        raise ValueError(f"variant and other must be two different keys of quality, got {variant!r}, {other!r}")
    p, q = quality[variant], quality[other]
    return p * (1 - q) + 0.5 * (p * q + (1 - p) * (1 - q))


def simulate_comparisons(
    conn, n: int, quality: dict, position_bias: float, first: str | None = None, seed: int = 0
) -> None:
    """``n`` side-by-side comparisons of two variants. ``first``: that variant always shown first (a fixed
    order); None: the order is random per comparison. A share ``position_bias`` of users picks the first
    answer whatever it is; the others pick the good one (a coin flip if both are good or both bad)."""
    quality, n, bias = _quality(quality), _n(n), _share("position_bias", position_bias)
    if len(quality) != 2:
        raise ValueError(f"quality must name exactly 2 variants for a comparison, got {sorted(quality)}")
    a, b = sorted(quality)
    if first is not None and first not in quality:
        raise ValueError(f"first must be one of {sorted(quality)} or None, got {first!r}")
    rng = random.Random(seed)
    conn.execute("BEGIN")
    for _ in range(n):
        shown = (a, b) if (first == a or (first is None and rng.random() < 0.5)) else (b, a)
        good = [rng.random() < quality[v] for v in shown]
        if rng.random() < bias:
            picked = 0
        elif good[0] != good[1]:
            picked = 0 if good[0] else 1
        else:
            picked = int(rng.random() < 0.5)
        feedback.log_comparison(conn, shown[0], shown[1], picked)
    conn.execute("COMMIT")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval for a proportion k/n (95 % at z = 1.96); (nan, nan) for n = 0."""
    if isinstance(k, bool) or isinstance(n, bool) or not isinstance(k, int) or not isinstance(n, int):
        raise ValueError(f"k and n must be ints, got {k!r}, {n!r}")
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


__all__ = ["USER", "simulate_comparisons", "simulate_sessions", "true_win_rate", "wilson"]
