"""``python -m course_lib.course``: execute every notebook headlessly and write ``build/REPORT.md``."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from course_lib.paths import repo_root
from course_lib.report import write_report


def run(mode: str, out: Path, only: list[str] | None = None, timeout: int = 1800) -> int:
    import nbformat
    from nbclient import NotebookClient

    root = repo_root()
    notebooks = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if any(key in nb.name for key in only)]
        if not notebooks:
            raise SystemExit(f"--only {only} matched no notebook in {root / 'notebooks'}")
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
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        print(f"[course] {path.name} ({mode}) ...", flush=True)
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
        except Exception as exc:  # keep going: the report says which chapter broke
            failed.append(path.name)
            print(f"[course] {path.name} FAILED: {str(exc)[-2000:]}", file=sys.stderr)
        timings[path.name] = time.perf_counter() - start
        nbformat.write(nb, out / "notebooks" / path.name)
        print(f"[course] {path.name} done in {timings[path.name]:.1f} s", flush=True)
    results.mkdir(parents=True, exist_ok=True)
    report = write_report(results, out / "REPORT.md", timings)
    print(f"[course] wrote {report}")
    if failed:
        print(f"[course] failed notebooks: {failed}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("quick", "full"), default=os.environ.get("COURSE_MODE", "quick"))
    parser.add_argument("--out", type=Path, default=Path("build"))
    parser.add_argument("--only", nargs="*", help="substrings of notebook names to run")
    args = parser.parse_args(argv)
    return run(args.mode, args.out, args.only)


if __name__ == "__main__":
    raise SystemExit(main())
