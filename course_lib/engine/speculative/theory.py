"""The speculative-decoding formulas: tokens per target forward, speed-up, and the best γ.

With acceptance rate α per draft token (i.i.d.), γ drafts give E[tokens per target forward] =
1 + α + … + α^γ = (1 − α^(γ+1)) / (1 − α); if one draft token costs c target forwards, a step costs
γ·c + 1 target forwards, so the speed-up over plain decoding is E / (γ·c + 1) (Leviathan et al. 2023).
Pure arithmetic: the measured α and c come from ``SpecStats``. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import math


def _check_alpha(alpha) -> float:
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha (acceptance rate) must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def _check_gamma(gamma) -> int:
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per step) must be an int ≥ 1, got {gamma!r}")
    return gamma


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per target forward with γ drafts, each accepted with probability α (i.i.d.):
    1 + α + α² + … + α^γ = (1 − α^(γ+1)) / (1 − α); γ + 1 when α = 1."""
    alpha, gamma = _check_alpha(alpha), _check_gamma(gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, gamma: int, c: float) -> float:
    """Wall-clock speedup over plain decoding when one draft token costs ``c`` target forwards:
    expected_tokens / (γ·c + 1) (one step = γ draft forwards + one target forward)."""
    if not isinstance(c, (int, float)) or isinstance(c, bool) or not math.isfinite(c) or c < 0:
        raise ValueError(f"c (cost of a draft token / cost of a target forward) must be a finite number ≥ 0, got {c!r}")
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def best_gamma(alpha: float, c: float, max_gamma: int = 16) -> int:
    """The γ in 1..max_gamma with the highest expected speedup (the smallest on ties)."""
    max_gamma = _check_gamma(max_gamma)
    return max(range(1, max_gamma + 1), key=lambda g: (expected_speedup(alpha, g, c), -g))


def alpha_from_tokens(tokens_per_forward: float, gamma: int) -> float:
    """The α for which E(α, γ) equals a measured ``tokens_per_forward`` (bisection); nan for nan."""
    e = tokens_per_forward
    if not e == e:
        return math.nan
    if e <= 1.0:
        return 0.0
    if e >= gamma + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, gamma) < e:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
