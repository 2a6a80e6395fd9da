"""course_lib: the measuring instruments of the LLM inference optimization course.

Notebooks teach; this package computes. Importing it on a machine without CUDA turns on the
Triton interpreter (``TRITON_INTERPRET=1``) *before* any kernel module defines a ``@triton.jit``
function, so every kernel in the course also runs (slowly, for correctness) on a CPU.
"""

from __future__ import annotations

import os as _os

__version__ = "0.1.0"


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or broken: the caller will fail loudly on first use
        return False


if "TRITON_INTERPRET" not in _os.environ and not _cuda_available():
    _os.environ["TRITON_INTERPRET"] = "1"

from course_lib.core.mode import is_quick, mode, pick  # noqa: E402
from course_lib.core.paths import data_dir, repo_root  # noqa: E402

__all__ = ["__version__", "data_dir", "is_quick", "mode", "pick", "repo_root"]
