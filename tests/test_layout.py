"""The package's layout holds: small modules, a map that names every one, and callers that use real paths.

The import arrows (chapters → engine/kernels → models → instruments → core, no cycles) are checked by
``lint-imports`` in ``make lint`` (contracts in pyproject.toml); this file checks what it cannot see.
"""

from __future__ import annotations

import ast
import importlib
import re
import statistics
import types
from pathlib import Path

import pytest

from course_lib.core.paths import repo_root

ROOT = repo_root()
PACKAGE = ROOT / "course_lib"
MAX_LINES = 500
MAX_MEDIAN = 200


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _dotted(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_modules_are_small():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in _modules()}
    too_long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split by concept): {too_long}"
    # __init__ files that only list an API are not modules a reader opens for a concept
    median = statistics.median(n for name, n in sizes.items() if not name.endswith("__init__.py"))
    assert median <= MAX_MEDIAN, f"median module length {median} > {MAX_MEDIAN}"


def test_the_map_names_every_module_and_only_real_ones():
    text = (PACKAGE / "README.md").read_text()
    named = set(re.findall(r"`(course_lib(?:\.[a-z_0-9]+)+)`", text))
    real = {_dotted(p) for p in _modules() if p.name != "__init__.py"} | {
        _dotted(p) for p in _modules() if p.name == "__init__.py" and len(p.read_text().splitlines()) > 60
    }
    missing = sorted(real - named)
    assert not missing, f"course_lib/README.md does not name: {missing}"
    packages = {_dotted(p.parent) for p in _modules()}
    stale = sorted(n for n in named if n not in real and n not in packages)
    assert not stale, f"course_lib/README.md names modules that do not exist: {stale}"


def _callers() -> list[Path]:
    tests = [p for p in ROOT.glob("tests/*.py") if p.name != Path(__file__).name]  # this file names made-up paths
    files = [*ROOT.glob("notebooks/[0-9][0-9]_*.py"), *tests, *ROOT.glob("benchmarks/*.py")]
    return sorted(files + _modules())


def _resolve(dotted: str):
    """The object named by a dotted path, importing modules along the way; None if it does not exist."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                try:
                    obj = importlib.import_module(f"{obj.__name__}.{name}")
                except (ImportError, AttributeError):
                    return None
            else:
                obj = getattr(obj, name)
        return obj
    return None


def _problems(path: Path) -> list[str]:
    """Every course_lib import in the file resolves, every attribute read off an imported course_lib module
    exists, and every "course_lib.a.b" string (monkeypatch targets, ``python -m`` commands) names something."""
    tree = ast.parse(path.read_text())
    modules: dict[str, types.ModuleType] = {}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "course_lib":
            for alias in node.names:
                obj = _resolve(f"{node.module}.{alias.name}")
                if obj is None:
                    out.append(f"{path.name}:{node.lineno}: {node.module} has no {alias.name}")
                elif isinstance(obj, types.ModuleType):
                    modules[alias.asname or alias.name] = obj
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "course_lib":
                    if _resolve(alias.name) is None:
                        out.append(f"{path.name}:{node.lineno}: no module {alias.name}")
                    elif alias.asname:
                        modules[alias.asname] = _resolve(alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            module = modules[node.value.id]
            if _resolve(f"{module.__name__}.{node.attr}") is None:
                out.append(f"{path.name}:{node.lineno}: {node.value.id} ({module.__name__}) has no {node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for dotted in re.findall(r"\bcourse_lib(?:\.[A-Za-z_][A-Za-z_0-9]*)+", node.value):
                if _resolve(dotted) is None:
                    out.append(f"{path.name}:{node.lineno}: {dotted!r} names nothing")
    return out


@pytest.mark.parametrize("path", _callers(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_reference_resolves(path):
    problems = _problems(path)
    assert not problems, "\n".join(problems)


def test_the_reference_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from course_lib.measure import roofline\n"
        "from course_lib.measure.roofline import no_such_name\n"
        "roofline.no_such_function()\n"
        "CMD = 'python -m course_lib.no_such_module'\n"
    )
    problems = _problems(bad)
    assert len(problems) == 3, problems


def test_prose_and_data_name_real_modules():
    """Commands and paths quoted in the READMEs and data/ files (``python -m course_lib.x.y``) still exist."""
    texts = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *PACKAGE.rglob("README.md"), *ROOT.glob("data/**/*.md")]
    texts += [p for p in ROOT.glob("data/**/*.json") if p.stat().st_size < 2_000_000]
    stale = []
    for path in texts:
        for dotted in set(re.findall(r"\bcourse_lib(?:\.[A-Za-z_][A-Za-z_0-9]*)+", path.read_text())):
            if _resolve(dotted) is None:
                stale.append(f"{path.relative_to(ROOT)}: {dotted}")
    assert not stale, "\n".join(sorted(stale))
