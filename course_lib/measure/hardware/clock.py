"""The clock a core really runs at, measured: a timed chain of dependent integer adds (``clock.c``).

The OS's figure is what the hypervisor or cpufreq reports: a VM often says "2.1 GHz" while its cores turbo
to 3.5, and then a "theoretical" FLOP ceiling computed from it is beaten by a measurement. Here n adds,
each waiting for the last (one cycle each on every x86-64 and arm64 core), are timed on every core at
once, since the clock of all cores busy is the one a matmul runs at. The C file is compiled once into the
course cache (``core.cbuild``); with no compiler, or on another architecture, ``measure_clock`` returns
None and the ceiling falls back to the OS's clock, saying so. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import ctypes
import platform
import threading
import time
from pathlib import Path

from course_lib.core import cbuild

SOURCE = Path(__file__).with_name("clock.c")
_state: dict = {"tried": False, "lib": None, "why": None}
_lock = threading.Lock()


def _library():
    """The compiled probe, or None (``_state['why']`` says why)."""
    with _lock:
        if _state["tried"]:
            return _state["lib"]
        _state["tried"] = True
        cc = cbuild.compiler()
        if platform.machine().lower() not in ("x86_64", "amd64", "arm64", "aarch64"):
            _state["why"] = f"the probe is written for x86-64 and arm64, this is {platform.machine()}"
        elif cc is None:
            _state["why"] = "no C compiler (set $CC, or install gcc)"
        else:
            try:
                path = cbuild.keyed_path("clock", SOURCE.read_bytes(), cc, platform.machine())
                if not path.exists():
                    cbuild.build_shared(cc, ["-O2", "-fPIC", "-shared"], SOURCE, path)
                lib = ctypes.CDLL(str(path))
                lib.dependent_adds.argtypes = [ctypes.c_int64]
                lib.dependent_adds.restype = ctypes.c_uint64
                _state["lib"] = lib
            except (OSError, RuntimeError) as err:
                _state["why"] = f"could not build {SOURCE.name}: {err}"
        return _state["lib"]


def unavailable_reason() -> str | None:
    """Why ``measure_clock`` returns None here (None when it can measure)."""
    _library()
    return _state["why"]


def measure_clock(threads: int = 1, adds: int = 100_000_000, repeats: int = 3) -> float | None:
    """GHz per core with ``threads`` cores running the chain at once: the median core of the best of
    ``repeats`` rounds (ctypes releases the GIL, so the threads run in parallel). None where the probe
    cannot be built."""
    for name, value in (("threads", threads), ("adds", adds), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    lib = _library()
    if lib is None:
        return None
    n = max(64, adds // 64 * 64)
    lib.dependent_adds(n // 10)  # wake the core up from an idle clock
    best = 0.0
    for _ in range(repeats):
        ghz: list[float] = []

        def run() -> None:
            t0 = time.perf_counter()
            lib.dependent_adds(n)
            ghz.append(n / (time.perf_counter() - t0) / 1e9)

        pool = [threading.Thread(target=run) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        ghz.sort()
        best = max(best, ghz[len(ghz) // 2])
    return best
