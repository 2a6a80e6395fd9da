"""The non-negative least-squares helper shared by the simulator's cost fit and the α–β fit."""

import numpy as np
import pytest

from course_lib.measure.fitting import nonneg_lstsq


def test_unconstrained_optimum_when_it_is_non_negative():
    rng = np.random.default_rng(0)
    design = rng.uniform(0.1, 1.0, (20, 3)) * np.array([1.0, 1e-4, 1e3])  # columns of very different scales
    x_true = np.array([2.0, 3e4, 5e-3])
    x, sse = nonneg_lstsq(design, design @ x_true)
    np.testing.assert_allclose(x, x_true, rtol=1e-9)
    assert sse == pytest.approx(0.0, abs=1e-12)


def test_negative_coefficient_clamped_to_the_constrained_optimum():
    rng = np.random.default_rng(1)
    design = rng.uniform(0.0, 1.0, (30, 3))
    target = design @ np.array([1.0, -2.0, 0.5]) + 0.01 * rng.standard_normal(30)
    x, sse = nonneg_lstsq(design, target)
    assert (x >= 0).all()
    assert sse == pytest.approx(float(np.sum((design @ x - target) ** 2)), rel=1e-9)
    free, *_ = np.linalg.lstsq(design, target, rcond=None)
    assert (free < 0).any()  # the plain fit would go negative
    # no non-negative point nearby does better (the KKT conditions of the constrained optimum)
    grad = design.T @ (design @ x - target)
    assert np.all(grad >= -1e-9) and np.allclose(grad[x > 0], 0, atol=1e-9)


def test_bad_shapes_and_values():
    with pytest.raises(ValueError, match="design must be"):
        nonneg_lstsq(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="design must be"):
        nonneg_lstsq(np.ones((3, 2)), np.ones(4))
    with pytest.raises(ValueError, match="finite"):
        nonneg_lstsq(np.array([[1.0, np.nan]]), np.ones(1))
