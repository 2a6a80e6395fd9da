"""Give freed memory back to the operating system, so that a process's RSS says what it holds.

glibc keeps freed blocks in its heap for reuse: after the engine fuses q/k/v (a copy, then the originals
are freed) or packs its weights, the process can sit hundreds of MB above what it uses, which on Binder
(1-2 GB) is the difference between running and being killed. ``trim_heap`` runs the garbage collector and
glibc's ``malloc_trim(0)``; elsewhere (macOS, musl, Windows) it only collects.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

_LIBC: list = []


def trim_heap() -> bool:
    """gc.collect(), then malloc_trim(0) where glibc has it; True when the heap was trimmed."""
    gc.collect()
    if not _LIBC:
        name = ctypes.util.find_library("c")
        try:
            _LIBC.append(ctypes.CDLL(name) if name else None)
        except OSError:
            _LIBC.append(None)
    libc = _LIBC[0]
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return False
    trim(0)
    return True


__all__ = ["trim_heap"]
