"""The course corpus: Python source from the running interpreter's standard library.

Every machine that runs the course has it, so nothing is downloaded and nothing is committed.
Code suits an inference course: it is repetitive and structured, which is exactly where
speculative and prompt-lookup decoding shine (their draft tokens are accepted more often on
structured text).

Deterministic: a fixed list of top-level modules, files in sorted order, ``test``/``tests``
folders skipped, and the train/validation split decided per *file* by a hash of its relative
path (about 1 file in 20 goes to validation). Interpreters of different versions ship slightly
different files, so figures measured on the validation split differ a little between versions.
Introduced in 03 (the models issue); used by every chapter that runs a model.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

#: Top-level stdlib modules and packages in the corpus (present in CPython 3.10-3.13 unless noted;
#: a name missing from the running interpreter is skipped).
MODULES: tuple[str, ...] = (
    "abc",
    "argparse",
    "ast",
    "asyncio",
    "base64",
    "bdb",
    "bisect",
    "calendar",
    "cmd",
    "code",
    "codecs",
    "codeop",
    "collections",
    "colorsys",
    "compileall",
    "concurrent",
    "configparser",
    "contextlib",
    "copy",
    "copyreg",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "dis",
    "doctest",
    "email",
    "enum",
    "filecmp",
    "fileinput",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "genericpath",
    "getopt",
    "getpass",
    "gettext",
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "http",
    "imaplib",
    "importlib",
    "inspect",
    "io",
    "ipaddress",
    "json",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "mailbox",
    "mimetypes",
    "modulefinder",
    "multiprocessing",
    "netrc",
    "ntpath",
    "numbers",
    "opcode",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pdb",
    "pickle",
    "pickletools",
    "pkgutil",
    "platform",
    "plistlib",
    "poplib",
    "posixpath",
    "pprint",
    "profile",
    "pstats",
    "py_compile",
    "pyclbr",
    "pydoc",
    "queue",
    "quopri",
    "random",
    "re",
    "reprlib",
    "rlcompleter",
    "runpy",
    "sched",
    "secrets",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "site",
    "smtplib",
    "socket",
    "socketserver",
    "sqlite3",
    "ssl",
    "stat",
    "statistics",
    "string",
    "stringprep",
    "struct",
    "subprocess",
    "symtable",
    "tabnanny",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "token",
    "tokenize",
    "tomllib",
    "trace",
    "traceback",
    "tracemalloc",
    "tty",
    "turtle",
    "types",
    "typing",
    "unittest",
    "urllib",
    "uuid",
    "venv",
    "warnings",
    "wave",
    "weakref",
    "webbrowser",
    "wsgiref",
    "xml",
    "xmlrpc",
    "zipapp",
    "zipfile",
    "zipimport",
    "zoneinfo",
    # larger packages and pure-Python twins of C modules
    "_collections_abc",
    "_pydecimal",
    "_pyio",
    "_strptime",
    "ctypes",
    "curses",
    "dbm",
    "idlelib",
    "lib2to3",
    "sysconfig",
    "tkinter",  # lib2to3: gone in 3.13
)
SKIP_DIRS = {"test", "tests", "__pycache__", "idle_test"}
#: Files above this size are skipped (generated tables, not code a person wrote).
MAX_FILE_BYTES = 200_000
VALIDATION_EVERY = 20
EOS = "<|endoftext|>"


@dataclass(frozen=True)
class CorpusFile:
    relpath: str  # relative to the stdlib folder, '/'-separated
    split: str  # "train" or "val"
    text: str


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relpath: str) -> str:
    """'val' for about one file in VALIDATION_EVERY, decided by the path alone (stable across runs)."""
    digest = hashlib.sha1(relpath.encode()).digest()
    return "val" if int.from_bytes(digest[:4], "big") % VALIDATION_EVERY == 0 else "train"


def iter_files(root: Path | None = None) -> list[CorpusFile]:
    """Every corpus file, sorted by relative path."""
    root = root or stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"stdlib folder {root} does not exist")
    paths: list[Path] = []
    for name in MODULES:
        single = root / f"{name}.py"
        package = root / name
        if single.is_file():
            paths.append(single)
        elif package.is_dir():
            for dirpath, dirnames, filenames in os.walk(package):
                dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
                paths += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    out = []
    for path in sorted(paths, key=lambda p: p.relative_to(root).as_posix()):
        if path.stat().st_size > MAX_FILE_BYTES:
            continue
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        out.append(CorpusFile(rel, split_of(rel), text))
    return out


def cache_dir() -> Path:
    """``$COURSE_CACHE`` or ``~/.cache/course_lib``."""
    return Path(os.environ.get("COURSE_CACHE", Path.home() / ".cache" / "course_lib")).expanduser()


def corpus_text(split: str = "train", root: Path | None = None, use_cache: bool = True) -> str:
    """The concatenated text of one split, files separated by the EOS marker; cached on disk."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    version = f"py{sys.version_info.major}{sys.version_info.minor}"
    path = cache_dir() / f"stdlib-corpus-{version}-{split}.txt"
    if use_cache and root is None and path.exists():
        return path.read_text(encoding="utf-8")
    text = f"\n{EOS}\n".join(f.text for f in iter_files(root) if f.split == split)
    if use_cache and root is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return text


def corpus_stats(root: Path | None = None) -> dict[str, int]:
    files = iter_files(root)
    return {
        "files_train": sum(f.split == "train" for f in files),
        "files_val": sum(f.split == "val" for f in files),
        "chars_train": sum(len(f.text) for f in files if f.split == "train"),
        "chars_val": sum(len(f.text) for f in files if f.split == "val"),
    }
