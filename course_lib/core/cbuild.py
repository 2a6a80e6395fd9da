"""Compile a small C file into a shared library under the course cache, once, and load it with ``ctypes``.

The course builds two kinds of C on the learner's machine: the CPU kernels (``kernels/cpu_gemv``) and the
clock probe of the machine profile (``measure/hardware/clock.c``). Both need the same three things: a
compiler (``$CC``, else ``cc``/``gcc`` on the PATH), a build into a temporary file renamed into place (a
concurrent process sees the whole library or none), and a path keyed by everything the binary depends on.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from course_lib.core.paths import cache_dir


def compiler() -> str | None:
    """The C compiler: ``$CC``, else ``cc`` or ``gcc`` on the PATH; None where there is none."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or cc
    return shutil.which("cc") or shutil.which("gcc")


def keyed_path(stem: str, *parts: bytes | str) -> Path:
    """``cache_dir()/kernels/{stem}-{hash}.so``, the hash over ``parts`` (sources, compiler, flags, CPU)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
    return cache_dir() / "kernels" / f"{stem}-{h.hexdigest()[:16]}.so"


def build_shared(cc: str, args: list[str] | tuple[str, ...], source: Path, out: Path, timeout: int = 120) -> None:
    """``cc args -o out source -lm``, atomically; RuntimeError with the compiler's last words on failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *args, "-o", tmp, str(source), "-lm"], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
