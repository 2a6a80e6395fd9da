"""``python -m course_lib.course``: execute every chapter headlessly and write ``build/REPORT.md``.

A chapter's source of truth is its jupytext percent file ``notebooks/NN_name.py``; the committed
``notebooks/NN_name.ipynb`` is that source, executed (see CONTRIBUTING.md). ``--inplace`` writes the
executed notebook back next to its source, which is how a chapter is re-executed before a commit::

    python -m course_lib.course --mode quick --only 01 --inplace
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from course_lib.core.paths import repo_root
from course_lib.measure.report import write_report


def chapter_sources(root: Path | None = None) -> list[Path]:
    """The chapters in order: ``notebooks/NN_*.py`` (the jupytext sources), else ``NN_*.ipynb``."""
    notebooks = (root or repo_root()) / "notebooks"
    sources = sorted(notebooks.glob("[0-9][0-9]_*.py"))
    return sources or sorted(notebooks.glob("[0-9][0-9]_*.ipynb"))


def read_chapter(path: Path):
    """The notebook of a chapter source (``.py`` through jupytext, ``.ipynb`` as is), outputs cleared."""
    import nbformat

    if path.suffix == ".py":
        import jupytext

        nb = jupytext.read(path)
    else:
        nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def run(mode: str, out: Path, only: list[str] | None = None, timeout: int = 1800, inplace: bool = False) -> int:
    import nbformat
    from nbclient import NotebookClient

    root = repo_root()
    sources = chapter_sources(root)
    if only:
        sources = [nb for nb in sources if any(key in nb.name for key in only)]
        if not sources:
            raise SystemExit(f"--only {only} matched no chapter in {root / 'notebooks'}")
    out = out if out.is_absolute() else root / out
    results = out / "results"
    if results.exists():
        shutil.rmtree(results)
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_MODE"] = mode
    os.environ["COURSE_BUILD_DIR"] = str(out)
    os.environ.setdefault("MPLBACKEND", "Agg")
    timings: dict[str, float] = {}
    failed = []
    for path in sources:
        name = path.with_suffix(".ipynb").name
        nb = read_chapter(path)
        start = time.perf_counter()
        print(f"[course] {path.name} ({mode}) ...", flush=True)
        try:
            NotebookClient(
                nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
            ).execute()
        except Exception as exc:  # keep going: the report says which chapter broke
            failed.append(name)
            print(f"[course] {name} FAILED: {str(exc)[-2000:]}", file=sys.stderr)
        timings[name] = time.perf_counter() - start
        nbformat.write(nb, out / "notebooks" / name)
        if inplace and name not in failed:
            nbformat.write(nb, path.with_suffix(".ipynb"))
            print(f"[course] wrote {path.with_suffix('.ipynb').relative_to(root)}", flush=True)
        print(f"[course] {name} done in {timings[name]:.1f} s", flush=True)
    results.mkdir(parents=True, exist_ok=True)
    report = write_report(results, out / "REPORT.md", timings)
    print(f"[course] wrote {report}")
    if failed:
        print(f"[course] failed notebooks: {failed}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("quick", "full"), default=os.environ.get("COURSE_MODE", "quick"))
    parser.add_argument("--out", type=Path, default=Path("build"))
    parser.add_argument("--only", nargs="*", help="substrings of chapter names to run, e.g. 01")
    parser.add_argument(
        "--inplace", action="store_true", help="write each executed notebook to notebooks/ beside its .py source"
    )
    args = parser.parse_args(argv)
    return run(args.mode, args.out, args.only, inplace=args.inplace)


if __name__ == "__main__":
    raise SystemExit(main())
