"""Where the course's files live: the repository root, ``data/``, ``build/`` and the cache."""

from __future__ import annotations

import os
from pathlib import Path


def _looks_like_root(path: Path) -> bool:
    return (path / "data").is_dir() and (path / "course_lib").is_dir()


def repo_root() -> Path:
    """The course checkout: ``$COURSE_ROOT``, else the first parent of the cwd or of this package
    that holds ``data/`` and ``course_lib/``."""
    env = os.environ.get("COURSE_ROOT")
    if env:
        root = Path(env).expanduser().resolve()
        if not _looks_like_root(root):
            raise FileNotFoundError(f"COURSE_ROOT={env!r} does not contain data/ and course_lib/")
        return root
    for start in (Path.cwd().resolve(), Path(__file__).resolve().parent):
        for candidate in (start, *start.parents):
            if _looks_like_root(candidate):
                return candidate
    raise FileNotFoundError(
        "could not find the course checkout (a folder with data/ and course_lib/); "
        "run from inside the clone or set COURSE_ROOT"
    )


def data_dir() -> Path:
    return repo_root() / "data"


def build_dir() -> Path:
    """``$COURSE_BUILD_DIR`` if set, else ``<repo>/build``."""
    env = os.environ.get("COURSE_BUILD_DIR")
    return Path(env).expanduser().resolve() if env else repo_root() / "build"


def cache_dir() -> Path:
    """What the course computes once and keeps across chapters (measured peaks, converted models):
    ``$COURSE_CACHE_DIR``, else ``$COURSE_CACHE`` (the corpus cache's variable), else ``~/.cache/course_lib``."""
    root = os.environ.get("COURSE_CACHE_DIR") or os.environ.get("COURSE_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "course_lib"
