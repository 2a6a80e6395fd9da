"""Headline figures of each chapter, collected into ``build/REPORT.md`` by ``make course``.

A notebook calls :func:`record` with a number it has just measured (and, where there is one, the
number theory predicted); the runner gathers every chapter's records into one page.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from course_lib.core.paths import build_dir


@dataclass(frozen=True)
class Record:
    chapter: str
    key: str
    value: float
    unit: str
    theory: float | None = None
    note: str = ""
    machine: str = ""


def machine_name() -> str:
    """One line naming the machine a number was measured on (GPU name, else CPU model and threads used)."""
    from course_lib.measure.hardware.device import detect_device

    info = detect_device()
    if info.kind == "cuda":
        return f"GPU {info.name}"
    return f"CPU {info.name} ({info.threads} of {info.cores} logical cores used)"


def _results_dir() -> Path | None:
    try:
        return build_dir() / "results"
    except FileNotFoundError:
        return None


def record(chapter: str, key: str, value: float, unit: str, *, theory: float | None = None, note: str = "") -> Record:
    """Store one measured figure for the report (no-op outside a course checkout)."""
    if not chapter or not key:
        raise ValueError("chapter and key must be non-empty strings")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"value for {chapter}/{key} must be finite, got {value}")
    rec = Record(chapter, key, value, unit, None if theory is None else float(theory), note, machine_name())
    out = _results_dir()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{chapter}.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = asdict(rec)
        path.write_text(json.dumps(data, indent=1))
    return rec


def _fmt(x: float | None) -> str:
    if x is None:
        return "—"
    if x == 0 or 1e-3 <= abs(x) < 1e6:
        return f"{x:.4g}"
    return f"{x:.3e}"


def write_report(
    results: Path,
    out: Path,
    timings: dict[str, float] | None = None,
    peaks: dict[str, float] | None = None,
    speeds: dict[str, dict[str, float]] | None = None,
) -> Path:
    """Render every ``results/*.json`` into a one-page markdown report. ``timings``, ``peaks`` and ``speeds``
    (``course.machine_speed`` before each notebook) by notebook name add the run-time table."""
    lines = [
        "# Course report",
        "",
        "Every figure below was measured while the notebooks ran (theory column: what first principles predicted).",
        "",
    ]
    machines = set()
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        lines += [f"## {path.stem}", "", "| figure | measured | unit | theory | note |", "|---|---|---|---|---|"]
        for rec in data.values():
            machines.add(rec.get("machine", ""))
            lines.append(
                f"| {rec['key']} | {_fmt(rec['value'])} | {rec['unit']} | {_fmt(rec.get('theory'))} "
                f"| {rec.get('note', '')} |"
            )
        lines.append("")
    if timings:
        peaks, speeds = peaks or {}, speeds or {}
        lines += [
            "## Notebook run times and peak memory",
            "",
            "The machine columns are two fixed probes taken just before each notebook (a pure-Python loop, "
            "a 32 MiB copy): on a shared VM a slow notebook beside a slow probe is a slow minute, not slower code.",
            "",
            "| notebook | seconds | peak RSS (MiB) | machine: Python (M loops/s) | machine: copy (GB/s) |",
            "|---|---|---|---|---|",
        ]
        for name, sec in timings.items():
            peak = f"{peaks[name]:.0f}" if name in peaks else "—"
            sp = speeds.get(name)
            probe = f"{sp['python_mloops']:.1f} | {sp['copy_gbs']:.1f}" if sp else "— | —"
            lines.append(f"| {name} | {sec:.1f} | {peak} | {probe} |")
        lines.append("")
    lines.insert(3, "Measured on: " + "; ".join(sorted(m for m in machines if m)) + "\n")
    out.write_text("\n".join(lines))
    return out
