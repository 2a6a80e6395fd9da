"""Triton kernels of the course, each with a torch reference, a checked launcher and a torch fallback.

Importing ``course_lib`` first turns on the Triton interpreter when there is no CUDA GPU, so these
modules run (slowly, for correctness only) on a CPU.
"""

import course_lib  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit below)

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:  # Triton is optional: every kernel has a torch path
    HAS_TRITON = False


def interpreter_on() -> bool:
    """True when Triton kernels run through the CPU interpreter (TRITON_INTERPRET=1)."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"
