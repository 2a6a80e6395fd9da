"""Give freed memory back to the operating system, so that a process's RSS says what it holds.

glibc keeps freed blocks in its heap for reuse: after the engine fuses q/k/v (a copy, then the originals
are freed) or packs its weights, the process can sit hundreds of MB above what it uses, which on Binder
(1-2 GB) is the difference between running and being killed. ``trim_heap`` runs the garbage collector and
glibc's ``malloc_trim(0)``; ``return_large_blocks`` makes glibc give every large block its own mapping, so
it goes back to the OS the moment it is freed (a chapter calls it once in its setup cell). Elsewhere (macOS,
musl, Windows) both only collect, or do nothing.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import gc

_LIBC: list = []
_FROZE: list = []
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _libc():
    if not _LIBC:
        name = ctypes.util.find_library("c")
        try:
            _LIBC.append(ctypes.CDLL(name) if name else None)
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]


def trim_heap() -> bool:
    """gc.collect(), then malloc_trim(0) where glibc has it; True when the heap was trimmed."""
    gc.collect()
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return False
    trim(0)
    return True


def return_large_blocks(threshold: int = 1 << 20) -> bool:
    """Make glibc serve every allocation of ``threshold`` bytes or more with its own mapping, returned to the
    OS when freed. (By default glibc raises that threshold after each large free, up to 32 MB, and keeps
    later temporaries of a few MB in its heap: quantizing 120 layers then leaves ~300 MB of freed
    temporaries counted in RSS.) Returns whether it applied."""
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold <= 0:
        raise ValueError(f"threshold must be a positive int (bytes), got {threshold!r}")
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) if mallopt is not None else False


#: what ``freeze_imports`` imports before it freezes: the libraries every course model is built from
HEAVY_IMPORTS = ("torch", "transformers.models.llama.modeling_llama", "transformers.models.auto.tokenization_auto")


def freeze_imports(modules=HEAVY_IMPORTS) -> int:
    """Import ``modules``, collect, then ``gc.freeze()``: every object alive now (the libraries' ~400k
    functions, classes and module dicts) moves to a permanent generation that later collections skip.

    A full collection walks every tracked object: after torch and transformers are imported, ~0.23 s on the
    course's CPU, paid by each ``trim_heap`` and each automatic generation-2 pass (39 of them, 8.9 s, in one
    quick run of chapter 03). Frozen, the same pass walks only what was made since. The price: a frozen
    object that later becomes cyclic garbage is never collected, so call this once, in a chapter's setup
    cell, before any model or engine exists. Returns the number of objects frozen."""
    import importlib

    if isinstance(modules, str) or not all(isinstance(m, str) for m in modules):
        raise ValueError(f"modules must be a sequence of module names, got {modules!r}")
    for name in modules:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()
    if not _FROZE:  # at exit, back in the collector: the interpreter's teardown frees them as usual
        atexit.register(gc.unfreeze)
        _FROZE.append(True)
    return gc.get_freeze_count()


__all__ = ["HEAVY_IMPORTS", "freeze_imports", "return_large_blocks", "trim_heap"]
