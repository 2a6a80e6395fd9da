"""``python -m course_lib.course``: execute every chapter headlessly and write ``build/REPORT.md``.

A chapter's source of truth is its jupytext percent file ``notebooks/NN_name.py``; the committed
``notebooks/NN_name.ipynb`` is that source, executed (see CONTRIBUTING.md). ``--inplace`` writes the
executed notebook back next to its source, which is how a chapter is re-executed before a commit::

    python -m course_lib.course --mode quick --only 01 --inplace
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from course_lib.core.paths import repo_root
from course_lib.measure import verdicts
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


class PeakRSS:
    """A notebook kernel's peak resident memory (Linux ``VmHWM``, MiB): Binder gives 1-2 GB, so every chapter
    is held to a budget (issue: the real model). Read from ``/proc`` after each cell; 0 where it is unreadable."""

    def __init__(self, km=None) -> None:
        self.km, self.mib = km, 0.0

    def update(self, **_) -> None:
        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (OSError, TypeError):
            return
        match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
        if match:
            self.mib = max(self.mib, int(match.group(1)) / 1024)


def machine_speed(copies: int = 5) -> dict[str, float]:
    """Two fixed probes of the machine, taken just before a chapter runs, so that a slow chapter on a slow
    minute of a shared VM shows as one: a pure-Python loop (million iterations per second: the interpreter's
    pace, which per-op overhead follows; the best of ``copies`` loops) and the best of ``copies`` copies of 32 MiB (GB/s read + written:
    the memory bandwidth decode follows). About 0.1 s."""
    import numpy as np

    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be an int >= 1, got {copies!r}")
    loop_s = float("inf")
    for _ in range(copies):  # the best of a few: a probe must not be the noisiest number in the table
        start = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i
        loop_s = min(loop_s, time.perf_counter() - start)
    src = np.ones(32 << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(copies):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return {"python_mloops": 0.3 / loop_s, "copy_gbs": 2 * src.nbytes / best / 1e9}


def run(mode: str, out: Path, only: list[str] | None = None, timeout: int = 1800, inplace: bool = False) -> int:
    import nbformat
    from jupyter_client.manager import KernelManager
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
    peaks: dict[str, float] = {}
    speeds: dict[str, dict[str, float]] = {}
    failed = []
    for path in sources:
        name = path.with_suffix(".ipynb").name
        nb = read_chapter(path)
        speeds[name] = machine_speed()  # before the kernel starts: nothing of the course runs meanwhile
        start = time.perf_counter()
        peak = PeakRSS()
        print(f"[course] {path.name} ({mode}) ...", flush=True)
        try:
            with tempfile.TemporaryDirectory(prefix="course-kernel-") as sockets:
                # IPC sockets in a private folder, not TCP on localhost: nothing else on the machine can
                # reach the kernel, and it does not warn about unencrypted TCP at every start.
                km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel"))
                peak.km = km
                client = NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(path.parent)}})
                client.on_cell_executed = peak.update  # the kernel's high-water mark, read after every cell
                try:
                    client.execute()
                finally:
                    # nbclient shuts down only a kernel it created itself; this one is ours. Left running, every
                    # finished chapter's kernel kept its memory (up to ~1.4 GB each) until the whole course ended.
                    if km.has_kernel:
                        km.shutdown_kernel(now=True)
        except Exception as exc:  # keep going: the report says which chapter broke
            failed.append(name)
            print(f"[course] {name} FAILED: {str(exc)[-2000:]}", file=sys.stderr)
        timings[name] = time.perf_counter() - start
        if peak.mib:
            peaks[name] = peak.mib
        nbformat.write(nb, out / "notebooks" / name)
        if inplace and name not in failed:
            nbformat.write(nb, path.with_suffix(".ipynb"))
            print(f"[course] wrote {path.with_suffix('.ipynb').relative_to(root)}", flush=True)
        sp = speeds[name]
        print(
            f"[course] {name} done in {timings[name]:.1f} s, peak RSS {peak.mib:.0f} MiB "
            f"(machine before it: Python {sp['python_mloops']:.1f} M loops/s, copy {sp['copy_gbs']:.1f} GB/s)",
            flush=True,
        )
    results.mkdir(parents=True, exist_ok=True)
    report = write_report(results, out / "REPORT.md", timings, peaks, speeds)
    found = verdicts.write(out / "notebooks", out / "verdicts.json")
    with open(report, "a") as f:
        f.write(f"\n## Verdicts per chapter ({len(found['verdicts'])} in all; build/verdicts.json)\n\n")
        f.write(verdicts.format_tally(found) + "\n")
    print(f"[course] wrote {report} and {out / 'verdicts.json'} ({len(found['verdicts'])} verdicts)")
    if failed:
        print(f"[course] failed notebooks: {failed}", file=sys.stderr)
        return 1
    return 0


# The repository the Colab badges open and the install cells clone. It is written in one place, pyproject.toml's
# [project.urls] Repository; a fork runs `python -m course_lib.course --set-repository URL` once.
_REPO_LINE = re.compile(r'^Repository = "https://github\.com/([\w.-]+/[\w.-]+)"$', re.M)
_REPO_LINKS = re.compile(
    r"(?:colab\.research\.google\.com/github|//github\.com)/([\w.-]+/[\w.-]+?)(?:\.git)?(?=[/\"'\s)]|$)"
)


def repository(root: Path | None = None) -> str:
    """'owner/name' of the course's repository, from pyproject.toml's ``[project.urls] Repository``."""
    text = ((root or repo_root()) / "pyproject.toml").read_text()
    match = _REPO_LINE.search(text)
    if not match:
        raise ValueError('pyproject.toml has no line Repository = "https://github.com/OWNER/NAME" under [project.urls]')
    return match.group(1)


def repository_files(root: Path | None = None) -> list[Path]:
    """The files that name the repository: the README (badges) and every chapter, source and notebook."""
    root = root or repo_root()
    return [root / "README.md", *chapter_sources(root), *(p.with_suffix(".ipynb") for p in chapter_sources(root))]


def repository_links(text: str) -> set[str]:
    """Every 'owner/name' a Colab badge or a github.com link in ``text`` points at."""
    return set(_REPO_LINKS.findall(text))


def set_repository(url: str, root: Path | None = None) -> list[Path]:
    """Point the badges, the install cells and pyproject.toml at ``url`` (https://github.com/OWNER/NAME):
    what a fork changes once. Returns the files rewritten. Executed notebooks keep their outputs."""
    match = (
        re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?", url.strip())
        if isinstance(url, str)
        else None
    )
    if not match:
        raise ValueError(f"url must look like https://github.com/OWNER/NAME, got {url!r}")
    root = root or repo_root()
    old, new = repository(root), match.group(1)
    changed = []
    for path in [root / "pyproject.toml", *repository_files(root)]:
        text = path.read_text()
        updated = text.replace(f"github.com/{old}", f"github.com/{new}").replace(f"/github/{old}/", f"/github/{new}/")
        if updated != text:
            path.write_text(updated)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("quick", "full"), default=os.environ.get("COURSE_MODE", "quick"))
    parser.add_argument("--out", type=Path, default=Path("build"))
    parser.add_argument("--only", nargs="*", help="substrings of chapter names to run, e.g. 01")
    parser.add_argument(
        "--inplace", action="store_true", help="write each executed notebook to notebooks/ beside its .py source"
    )
    parser.add_argument(
        "--set-repository", metavar="URL", help="a fork: point badges and install cells at URL, then stop"
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        type=Path,
        help="two runs (folders of executed notebooks, e.g. notebooks/ and build/, or verdicts.json files): "
        "list every verdict that flips and every verdict present in only one run, then stop",
    )
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (verdicts.collect(p) for p in args.compare)
        print(verdicts.format_compare(a, b, names=tuple(str(p) for p in args.compare)))
        return 0
    if args.set_repository:
        for path in set_repository(args.set_repository):
            print(f"[course] {path.relative_to(repo_root())} now points at {repository()}")
        return 0
    return run(args.mode, args.out, args.only, inplace=args.inplace)


if __name__ == "__main__":
    raise SystemExit(main())
