"""Least squares with non-negative coefficients, for the course's cost models (time = Σ cᵢ·countᵢ, every
cᵢ ≥ 0: work never saves time). Used by the serving simulator's step-cost fit and the α–β fit of chapter 07."""

from __future__ import annotations

import itertools

import numpy as np


def nonneg_lstsq(design, target) -> tuple[np.ndarray, float]:
    """min ‖design·x − target‖² over x ≥ 0, and that minimum. The optimum is the plain least-squares solution
    on its own support, so for the few columns of a cost model, trying every support and keeping the best
    non-negative solution is exact (2^k − 1 small solves). Columns are rescaled first: a cost model's
    coefficients span many orders of magnitude (α ~ 1e-4 s, β ~ 1e-10 s/B)."""
    design = np.asarray(design, dtype=float)
    target = np.asarray(target, dtype=float)
    if design.ndim != 2 or target.shape != (design.shape[0],) or design.shape[1] > 12:
        raise ValueError(f"design must be (n, k) with k <= 12 and target (n,), got {design.shape} and {target.shape}")
    if not (np.isfinite(design).all() and np.isfinite(target).all()):
        raise ValueError("design and target must be finite")
    k = design.shape[1]
    scale = np.abs(design).max(axis=0)
    scale[scale == 0] = 1.0
    d = design / scale
    best_x, best_sse = np.zeros(k), float(target @ target)  # x = 0
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            x_s, *_ = np.linalg.lstsq(d[:, cols], target, rcond=None)
            if (x_s < 0).any():
                continue
            x = np.zeros(k)
            x[list(cols)] = x_s
            sse = float(np.sum((d @ x - target) ** 2))
            if sse < best_sse:
                best_x, best_sse = x, sse
    return best_x / scale, best_sse
