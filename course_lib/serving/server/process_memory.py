"""How much memory a process holds, now and at its peak: Linux's ``VmRSS`` and ``VmHWM`` (the resident set's
high-water mark) from ``/proc/<pid>/status``, else psutil's current resident set (for the peak, a lower
bound) where ``/proc`` has none. A server whose engine runs in a child process holds its weights and KV cache
there, outside the notebook kernel's own figure; Binder's 1-2 GB are for all the processes together, so a
chapter prints both. Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def _status_mib(pid: int | None, field: str) -> float:
    if pid is None:
        pid = os.getpid()
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ValueError(f"pid must be None or a process id (an int > 0), got {pid!r}")
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        if Path("/proc/self/status").exists():
            raise ProcessLookupError(f"no running process with pid {pid}") from None
        status = ""
    except OSError:
        status = ""
    match = re.search(rf"^{field}:\s+(\d+) kB", status, re.M)
    if match:
        return int(match.group(1)) / 1024
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.NoSuchProcess:
        raise ProcessLookupError(f"no running process with pid {pid}") from None


def peak_rss_mib(pid: int | None = None) -> float:
    """Peak resident memory of process ``pid`` (default: this one), MiB. Raises ``ValueError`` for a pid that
    is not an int > 0 and ``ProcessLookupError`` for one that is not running."""
    return _status_mib(pid, "VmHWM")


def rss_mib(pid: int | None = None) -> float:
    """Resident memory of process ``pid`` (default: this one) now, MiB; the same checks as ``peak_rss_mib``."""
    return _status_mib(pid, "VmRSS")
