"""Verdicts that travel: read every ``claims.claim`` line out of executed notebooks, store them, compare runs.

A chapter's verdict is true on one machine and may be false on the next. To see which claims a machine
changes, ``python -m course_lib.course`` writes ``build/verdicts.json`` (notebook, cell, statement,
thresholds, measured value, spread, held / missed / noise, and the id of the machine profile the chapter
printed), and ``python -m course_lib.course --compare A B`` lists every verdict whose outcome differs
between two runs (a *flip*) and every verdict present in only one of them. A run is a folder of executed
notebooks (``notebooks/`` is the committed run; ``build/notebooks`` a fresh one), its parent folder, or a
``verdicts.json``.

Verdicts are matched by notebook and statement with its numbers blanked (a statement may quote a figure
of its run), and by order among equal statements.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(
    r"^\s*(?P<mark>✅ holds|✗ does not hold|≈ inside the noise) (?P<where>on this machine|in .+?): (?P<rest>.*)$"
)
_HEAD = re.compile(
    r"\(measured (?P<measured>[-+\d.eE]+|inf|nan)(?P<unit>[^,()]*), claim needs (?P<needs>.*?)"
    r"(?:; run-to-run spread ±(?P<spread>[\d.]+)%, so the threshold is within it; this run (?P<way>held|missed))?\)$"
)
_BOUND = re.compile(r"(>=|<=) ([-+\d.eE]+|inf)")
_PROFILE = re.compile(r"\bprofile ([0-9a-f]{10}) ·")
_NUM = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")
STATUSES = ("held", "missed", "noise")


def parse_line(line: str) -> dict | None:
    """One verdict line as printed by ``claims.claim``, or None if ``line`` is not one."""
    m = _LINE.match(line)
    if not m:
        return None
    rest = m.group("rest")
    cut = rest.rfind(" (measured ")
    head = _HEAD.match(rest[cut + 1 :]) if cut >= 0 else None
    if head is None:
        return None
    status = {"✅ holds": "held", "✗ does not hold": "missed", "≈ inside the noise": "noise"}[m.group("mark")]
    bounds = {op: float(v) for op, v in _BOUND.findall(head.group("needs"))}
    return {
        "status": status,
        "held": status == "held" or head.group("way") == "held",
        "where": m.group("where"),
        "statement": rest[:cut],
        "measured": float(head.group("measured")),
        "unit": head.group("unit").strip(),
        "at_least": bounds.get(">="),
        "at_most": bounds.get("<="),
        "spread": float(head.group("spread")) / 100 if head.group("spread") else None,
    }


def _cell_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append("".join(out.get("text", "")))
        else:
            parts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def notebook_verdicts(path: Path) -> tuple[list[dict], str | None]:
    """(verdicts, profile id) of one executed notebook: every verdict line with its cell index and the
    likely reason printed under a miss; the id of the first ``profile <id> ·`` line the notebook printed."""
    nb = json.loads(Path(path).read_text())
    found, profile = [], None
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        lines = _cell_text(cell).splitlines()
        for i, line in enumerate(lines):
            if profile is None and (p := _PROFILE.search(line)):
                profile = p.group(1)
            v = parse_line(line)
            if v is None:
                continue
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            v["why_not"] = nxt.removeprefix("likely reason:").strip() if nxt.startswith("likely reason:") else ""
            v.update(notebook=Path(path).name, cell=index)
            found.append(v)
    return found, profile


def collect(run: Path) -> dict:
    """The verdicts of a run: a ``verdicts.json``, or a folder of executed notebooks (or one holding
    ``notebooks/``). Returns {"profiles": {notebook: id}, "verdicts": [...]}."""
    run = Path(run)
    if run.is_file():
        data = json.loads(run.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("verdicts"), list):
            raise ValueError(f"{run} is not a verdicts.json (a dict with a 'verdicts' list)")
        return data
    if not run.is_dir():
        raise ValueError(f"run must be a folder of executed notebooks or a verdicts.json, got {str(run)!r}")
    if (run / "verdicts.json").is_file() and not list(run.glob("[0-9][0-9]_*.ipynb")):
        return collect(run / "verdicts.json")
    folder = run if list(run.glob("[0-9][0-9]_*.ipynb")) else run / "notebooks"
    books = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not books:
        raise ValueError(f"{run} holds no executed chapter (NN_*.ipynb) and no verdicts.json")
    verdicts, profiles = [], {}
    for book in books:
        found, prof = notebook_verdicts(book)
        verdicts += found
        profiles[book.name] = prof
    return {"profiles": profiles, "verdicts": verdicts}


def write(run: Path, out: Path) -> dict:
    """``collect(run)`` written to ``out`` (JSON); returns it."""
    data = collect(run)
    Path(out).write_text(json.dumps(data, indent=1, ensure_ascii=False))
    return data


def _key(v: dict) -> tuple[str, str]:
    return v["notebook"], _NUM.sub("#", v["statement"])


def _keyed(verdicts: list[dict]) -> dict:
    seen: Counter = Counter()
    out = {}
    for v in verdicts:
        k = _key(v)
        out[(*k, seen[k])] = v
        seen[k] += 1
    return out


def compare(a: dict, b: dict) -> dict:
    """{"flips": [(key, va, vb)], "only_a": [v], "only_b": [v], "same": n, "moved": n}: a flip is a verdict
    whose status (held / missed / inside the noise) differs between the runs. A verdict that moved to another
    notebook (a section moved between chapters) is matched by its statement alone and counted in "moved"."""
    ka, kb = _keyed(a["verdicts"]), _keyed(b["verdicts"])
    pairs = [(k, ka[k], kb[k]) for k in ka if k in kb]
    rest_a = [v for k, v in ka.items() if k not in kb]
    rest_b = [v for k, v in kb.items() if k not in ka]
    by_statement: dict[str, list[dict]] = {}
    for v in rest_b:
        by_statement.setdefault(_key(v)[1], []).append(v)
    only_a, moved = [], 0
    for v in rest_a:
        twins = by_statement.get(_key(v)[1])
        if twins:
            w = twins.pop(0)
            rest_b.remove(w)
            pairs.append(((v["notebook"], _key(v)[1], 0), v, w))
            moved += 1
        else:
            only_a.append(v)
    flips = [(k, va, vb) for k, va, vb in pairs if va["status"] != vb["status"]]
    return {"flips": flips, "only_a": only_a, "only_b": rest_b, "same": len(pairs) - len(flips), "moved": moved}


def tally(data: dict) -> dict[str, Counter]:
    """Per notebook, how many verdicts held, missed, or fell inside the noise."""
    out: dict[str, Counter] = {}
    for v in data["verdicts"]:
        out.setdefault(v["notebook"], Counter())[v["status"]] += 1
    return out


def format_tally(data: dict) -> str:
    rows = ["| notebook | held | missed | inside the noise |", "|---|---|---|---|"]
    for book, c in tally(data).items():
        rows.append(f"| {book} | {c['held']} | {c['missed']} | {c['noise']} |")
    return "\n".join(rows)


def _short(v: dict) -> str:
    unit = v.get("unit", "")
    return f"{v['status']} at {v['measured']:.4g}{unit}"


def format_compare(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> str:
    """The comparison as text: one line per flip, then the verdicts present in one run only."""
    c = compare(a, b)
    pa = sorted({p for p in a.get("profiles", {}).values() if p})
    pb = sorted({p for p in b.get("profiles", {}).values() if p})
    lines = [
        f"{names[0]}: {len(a['verdicts'])} verdicts (profiles {', '.join(pa) or 'not printed'}); "
        f"{names[1]}: {len(b['verdicts'])} verdicts (profiles {', '.join(pb) or 'not printed'})",
        f"{c['same']} agree, {len(c['flips'])} flip, {len(c['only_a'])} only in {names[0]}, "
        f"{len(c['only_b'])} only in {names[1]} ({c['moved']} matched across notebooks: a section moved)",
    ]
    if c["flips"]:
        lines.append("\nflips:")
        for _, va, vb in c["flips"]:
            book = va["notebook"] if va["notebook"] == vb["notebook"] else f"{va['notebook']}→{vb['notebook']}"
            bounds = " and ".join(
                f"{op} {vb[k]:.4g}" for op, k in ((">=", "at_least"), ("<=", "at_most")) if vb.get(k) is not None
            )
            lines.append(
                f"  {book}[{va['cell']}→{vb['cell']}] {va['statement'][:110]} (needs {bounds}): "
                f"{names[0]} {_short(va)}, {names[1]} {_short(vb)}"
            )
    for label, only in ((names[0], c["only_a"]), (names[1], c["only_b"])):
        if only:
            lines.append(f"\nonly in {label}:")
            lines += [f"  {v['notebook']}[{v['cell']}] {v['statement'][:110]} ({_short(v)})" for v in only]
    return "\n".join(lines)


__all__ = ["collect", "compare", "format_compare", "format_tally", "notebook_verdicts", "parse_line", "tally", "write"]
