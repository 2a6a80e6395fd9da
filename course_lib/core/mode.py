"""Quick vs full mode: one environment variable, ``COURSE_MODE``, shrinks every notebook for CI/Binder.

``quick`` (default without a GPU) keeps sizes small enough for a 2-core CPU and 1-2 GB of RAM;
``full`` (default with a GPU) uses the real sizes. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")
_VALID = ("quick", "full")


def mode() -> str:
    """The current mode: ``$COURSE_MODE`` if set, else ``full`` with CUDA and ``quick`` without."""
    value = os.environ.get("COURSE_MODE", "").strip().lower()
    if value:
        if value not in _VALID:
            raise ValueError(f"COURSE_MODE must be one of {_VALID}, got {value!r}")
        return value
    try:
        import torch

        return "full" if torch.cuda.is_available() else "quick"
    except Exception:
        return "quick"


def is_quick() -> bool:
    return mode() == "quick"


def pick(quick: T, full: T) -> T:
    """Return ``quick`` in quick mode and ``full`` in full mode: ``n = pick(64, 4096)``."""
    return quick if is_quick() else full
