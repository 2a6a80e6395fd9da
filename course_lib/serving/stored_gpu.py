"""Every stored GPU serving result, the misses with the hits: ``data/measurements/nvidia-h200.json`` keeps
the printed report of each ``benchmarks/serving_policies.py`` run (one block per run) and the sharegpt_like
continuous-vs-static summary; ``stored_serving_lines`` returns each run's verdict lines (those naming a goal)
and its headline numbers, so a chapter quotes the whole record rather than the run that passed.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

_GOAL = re.compile(r"\(goal[^)]*\)\s*:\s*(PASS|MISS)")


@dataclass(frozen=True)
class StoredRun:
    """One stored run: its name (trace, slots), the machine, and its verdict lines in order."""

    name: str
    verdicts: tuple[str, ...]
    chunked_rows: tuple[str, ...] = ()  # its chunked-prefill table (header first): TTFT p50/p99 with and without

    @property
    def misses(self) -> int:
        return sum(line.endswith("MISS") for line in self.verdicts)


def load_stored(path: str | Path | None = None) -> dict:
    """The stored H200 measurements (``course_lib.data_dir()/measurements/nvidia-h200.json`` by default)."""
    if path is None:
        from course_lib import data_dir

        path = data_dir() / "measurements" / "nvidia-h200.json"
    return json.loads(Path(path).read_text())


def stored_runs(stored: dict) -> list[StoredRun]:
    """Each serving run's verdict lines (every line that names a goal and says PASS or MISS), in file order."""
    if not isinstance(stored, dict) or "serving" not in stored:
        raise ValueError("stored must be the parsed nvidia-h200.json (a dict with a 'serving' section)")
    out = []
    for name, lines in stored["serving"].items():
        verdicts = tuple(line.strip() for line in lines if _GOAL.search(line))
        extra = tuple(line.strip() for line in lines if line.strip().startswith("steps:"))
        start = next((i for i, line in enumerate(lines) if line.startswith("3. chunked prefill")), len(lines))
        chunk_rows = tuple(
            line.rstrip() for line in lines[start:] if line.startswith(("run ", "no chunking", "chunked"))
        )
        out.append(StoredRun(name, verdicts + extra, chunk_rows))
    return out


def describe_stored(stored: dict) -> str:
    """A block of text: the machine, then every stored run's verdict lines, misses included, and a count."""
    lines = [f"stored on an {stored.get('gpu', '?')} on {stored.get('measured_on', '?')} ({stored.get('how', '')})"]
    runs = stored_runs(stored)
    for run in runs:
        lines.append(f"  {run.name}:")
        lines += [f"    {v}" for v in run.verdicts]
        lines += [f"      {r}" for r in run.chunked_rows]
    total = sum(sum(v.endswith(("PASS", "MISS")) for v in r.verdicts) for r in runs)
    lines.append(f"  {sum(r.misses for r in runs)} of {total} stored goals missed")
    return "\n".join(lines)
