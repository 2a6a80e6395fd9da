"""Argument checks the compression modules share (pruning, distillation): a fraction in [0, 1), an int
with a minimum, a positive finite number. Each raises a ValueError that names the argument, before
anything is changed. Plain Python: neither bandwidth- nor compute-bound. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import math


def check_fraction(name: str, value) -> float:
    """``value`` as a float if it is a number in [0, 1) (a sparsity, a fraction of channels)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    if not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


def check_int(name: str, value, minimum: int) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_positive(name: str, value) -> float:
    """``value`` as a float if it is a finite number > 0 (a learning rate, a temperature)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)
