"""A corpus every machine has: the docstrings of the Python standard library, built offline at run time.

Retrieval needs documents whose answers are known and that no download has to bring. ``build_corpus``
imports a list of standard-library modules and keeps one document per public function, class and method
that has a docstring: its dotted name and the docstring's first ``max_chars`` characters. The documents
differ from Python version to version (the docstrings do), so a question set over them is checked against
the corpus of the running interpreter (``tests/test_system_retrieval.py``). Introduced in
08_system_1_context_guardrails_gateway.ipynb.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

#: Modules the question set asks about (``data/system/stdlib_questions.json``) and their neighbours.
QUICK_MODULES = (
    "itertools", "functools", "collections", "json", "os.path", "shutil", "textwrap", "string", "re",
    "math", "statistics", "random", "bisect", "heapq", "datetime", "pathlib", "zipfile", "csv", "hashlib",
    "base64", "urllib.parse", "difflib", "fnmatch", "glob", "secrets", "operator", "copy", "pprint",
)  # fmt: skip
#: Full mode adds these: more distractors for the same questions.
FULL_EXTRA = (
    "asyncio", "subprocess", "threading", "logging", "argparse", "typing", "dataclasses", "enum",
    "inspect", "io", "tempfile", "socket", "email", "http.client", "sqlite3", "unittest", "contextlib",
    "decimal", "fractions", "struct", "array", "calendar", "time", "uuid", "gzip", "tarfile", "html",
    "xml.etree.ElementTree", "configparser", "locale", "codecs", "weakref", "queue", "sched", "select",
)  # fmt: skip


@dataclass(frozen=True)
class Doc:
    """One retrievable document: a dotted name and its docstring (cut to ``max_chars``)."""

    name: str  # e.g. "itertools.accumulate"
    text: str

    def render(self) -> str:
        return f"{self.name}: {self.text}"


#: where a module's public names are really defined, when it is not the module itself
_HOMES = {"os.path": ("posixpath", "ntpath", "genericpath"), "itertools": ("builtins",)}


def _defined_here(module_name: str, obj) -> bool:
    home = getattr(obj, "__module__", None) or ""
    # the module itself, a submodule, a C accelerator behind it (_functools → functools), a platform module
    return (
        home == module_name
        or home.startswith(module_name + ".")
        or home.lstrip("_") == module_name.split(".")[-1]
        or home in _HOMES.get(module_name, ())
    )


def _members(module_name: str, module):
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_") or not (inspect.isroutine(obj) or inspect.isclass(obj)):
            continue
        if not _defined_here(module_name, obj):
            continue
        yield f"{module_name}.{attr}", obj
        if inspect.isclass(obj):  # its methods, inherited ones too, except those of builtin bases (dict.keys…)
            seen = set()
            for klass in obj.__mro__:
                if klass.__module__ == "builtins" and module_name not in _HOMES:
                    continue
                for m_name, m in sorted(vars(klass).items()):
                    if m_name.startswith("_") or m_name in seen or not callable(getattr(obj, m_name, None)):
                        continue
                    seen.add(m_name)
                    yield f"{module_name}.{attr}.{m_name}", getattr(obj, m_name)


def build_corpus(modules=QUICK_MODULES, max_chars: int = 600) -> list[Doc]:
    """One ``Doc`` per public, documented function / class / method of ``modules`` (names sorted)."""
    if isinstance(modules, str) or not modules or not all(isinstance(m, str) and m for m in modules):
        raise ValueError(f"modules must be a non-empty list of module names, got {modules!r}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 40:
        raise ValueError(f"max_chars must be an int >= 40, got {max_chars!r}")
    docs: dict[str, Doc] = {}
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"modules: {module_name!r} does not import here ({err})") from err
        for name, obj in _members(module_name, module):
            doc = inspect.getdoc(obj)
            if doc and name not in docs:
                docs[name] = Doc(name, " ".join(doc.split())[:max_chars])
    return [docs[k] for k in sorted(docs)]


__all__ = ["Doc", "FULL_EXTRA", "QUICK_MODULES", "build_corpus"]
