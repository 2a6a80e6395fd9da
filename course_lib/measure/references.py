"""Every figure the course quotes from outside the repository, with its source and date.

A learner has only the repository: a notebook that quotes a published number (gpt-fast's MBU, a
datasheet peak, Anyscale's input/output token ratio) cannot send them to a file they do not have.
So each such figure lives in ``data/references.json`` with what exactly was measured (model, batch,
dtype, hardware, and what a percentage is a percentage *of*), the source's title, URL and publication
date, and the date the course read it. The works the course follows (Huyen's *AI Engineering*,
NVIDIA's "Mastering LLM Techniques: Inference Optimization", Xiao & Zhu's *Foundations of Large
Language Models*) are entries too, so prose cites them the same way::

    from course_lib.measure import references
    references.cite("huyen")                    # a markdown citation of a work
    references.cite("gpt_fast_mbu_llama2_7b")   # "gpt-fast (PyTorch blog), Nov 2023: 72% MBU ..."
    references.reference("gpt_fast_llama2_7b_fp16_tok_s").value   # 104.9

Everything the course *measures* is measured; nothing here is a substitute for a measurement.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import json
import re
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from course_lib.core.paths import data_dir

KINDS = ("work", "figure", "datasheet")
REQUIRED = ("key", "kind", "what", "source", "short", "url", "date", "retrieved")
_DATE_FORMATS = {4: "%Y", 7: "%Y-%m", 10: "%Y-%m-%d"}
_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


class UnknownReference(KeyError):
    """A key that is not in ``data/references.json``; the message lists the closest keys."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Reference:
    """One entry of ``data/references.json``.

    ``value`` is a number, ``[low, high]`` for a range, a ``{label: number}`` table, or None (works,
    datasheets, formulas); ``unit`` applies to every number in it ("fraction": 0.72 means 72%).
    ``date`` is the source's publication date, ``retrieved`` the day the course read it. ``checked``
    is True where the figure was compared with the source's own text on that day. ``via`` names the
    key of a secondary source through which the course met the figure; ``gpu`` ties a datasheet to
    its row of ``data/gpu_specs.json``.
    """

    key: str
    kind: str
    what: str
    source: str
    short: str
    url: str
    date: str
    retrieved: str
    value: Any = None
    unit: str = ""
    quote: str = ""
    note: str = ""
    chapter: str = ""
    via: str = ""
    gpu: str = ""
    checked: bool = False

    @property
    def published(self) -> _dt.date:
        """The publication date (first day of the month or year when only those are known)."""
        return parse_date(self.date)

    @property
    def date_text(self) -> str:
        """The publication date as a reader would write it: "30 Nov 2023", "Nov 2023" or "2023"."""
        day = parse_date(self.date)
        return {4: f"{day:%Y}", 7: f"{day:%b %Y}", 10: f"{day.day} {day:%b %Y}"}[len(self.date)]

    @property
    def value_text(self) -> str:
        """``value`` with its unit, for tables and printouts (the ``quote`` is the prose version)."""
        return format_value(self.value, self.unit)


def parse_date(text: str) -> _dt.date:
    """Parse ``YYYY``, ``YYYY-MM`` or ``YYYY-MM-DD``; anything else is a ValueError."""
    fmt = _DATE_FORMATS.get(len(text)) if isinstance(text, str) else None
    if fmt is None:
        raise ValueError(f"date {text!r} is not YYYY, YYYY-MM or YYYY-MM-DD")
    return _dt.datetime.strptime(text, fmt).date()


def format_value(value: Any, unit: str = "") -> str:
    """A value as text: fractions as percentages, ranges as "2–4×", tables as "label: value; …"."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return "; ".join(f"{label}: {format_value(v, unit)}" for label, v in value.items())
    if isinstance(value, (list, tuple)):
        low, high = value
        if unit == "fraction":
            return f"{low * 100:g}–{high * 100:g}%"
        return f"{low:g}–{format_value(high, unit)}"
    if unit == "fraction":
        return f"{value * 100:g}%"
    if unit == "x":
        return f"{value:g}×"
    return f"{value:g} {unit}".strip() if isinstance(value, (int, float)) else f"{value} {unit}".strip()


def references_path() -> Path:
    return data_dir() / "references.json"


def _check_value(key: str, value: Any) -> None:
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def scalar_or_range(v: Any) -> bool:
        return number(v) or (isinstance(v, list) and len(v) == 2 and all(map(number, v)) and v[0] <= v[1])

    ok = value is None or scalar_or_range(value)
    if isinstance(value, dict):
        ok = bool(value) and all(isinstance(k, str) and scalar_or_range(v) for k, v in value.items())
    if not ok:
        raise ValueError(f"reference {key!r}: value must be a number, [low, high], a {{label: number}} table or null")


def _parse(entry: dict, index: int) -> Reference:
    key = entry.get("key", f"#{index}")
    missing = [name for name in REQUIRED if not str(entry.get(name, "")).strip()]
    if missing:
        raise ValueError(f"reference {key!r} lacks {', '.join(missing)}")
    known = {f.name for f in fields(Reference)}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ValueError(f"reference {key!r} has unknown field(s) {unknown}; known: {sorted(known)}")
    if not _KEY.match(key):
        raise ValueError(f"reference key {key!r} must be lower_snake_case")
    if entry["kind"] not in KINDS:
        raise ValueError(f"reference {key!r}: kind {entry['kind']!r} is not one of {KINDS}")
    for name in ("date", "retrieved"):
        try:
            parse_date(entry[name])
        except ValueError as err:
            raise ValueError(f"reference {key!r}: {name}: {err}") from None
    _check_value(key, entry.get("value"))
    return Reference(**entry)


@lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Reference]:
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    out: dict[str, Reference] = {}
    for i, entry in enumerate(raw["references"]):
        ref = _parse(entry, i)
        if ref.key in out:
            raise ValueError(f"reference key {ref.key!r} appears twice in {path}")
        out[ref.key] = ref
    for ref in out.values():
        if ref.via and ref.via not in out:
            raise ValueError(f"reference {ref.key!r}: via {ref.via!r} is not a key")
    return out


def references(path: str | Path | None = None) -> dict[str, Reference]:
    """Every entry of ``data/references.json`` (or ``path``), by key, in file order."""
    return dict(_load(str(Path(path) if path else references_path())))


def reference(key: str, path: str | Path | None = None) -> Reference:
    """The entry ``key``; an unknown key raises :class:`UnknownReference` naming the closest ones."""
    table = _load(str(Path(path) if path else references_path()))
    try:
        return table[key]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(key), table, n=5, cutoff=0.4)
        close += [k for k in table if str(key) in k and k not in close][: 5 - len(close)]
        hint = f"close keys: {', '.join(close)}" if close else f"known keys: {', '.join(table)}"
        raise UnknownReference(f"unknown reference {key!r} (data/references.json); {hint}") from None


def cite(key: str, link: bool = True) -> str:
    """A short markdown citation for prose.

    A work: ``Chip Huyen, *AI Engineering* (O'Reilly, 2025), ch. 9, "Inference Optimization"``.
    A figure: ``gpt-fast (PyTorch blog), 30 Nov 2023: 72% MBU for Llama-2-7B fp16 …``, plus
    "(via …)" when the course met it second-hand and "(not re-checked)" when it was not compared
    with the source's text. ``link`` appends the URL as a markdown link.
    """
    ref = reference(key)
    url = f" ([link]({ref.url}))" if link else ""
    if ref.kind == "work":
        chapter = f", {ref.chapter}" if ref.chapter else ""
        when = "" if ref.date[:4] in ref.source else f" ({ref.date_text})"
        return f"{ref.source}{when}{chapter}{url}"
    if ref.kind == "datasheet":
        where = f": peaks in `data/gpu_specs.json` ({ref.gpu!r})" if ref.gpu else ""
        return f"{ref.source} ({ref.date_text}){where}{url}"
    text = ref.quote or f"{ref.value_text} — {ref.what}"
    via = f" (via {reference(ref.via).short})" if ref.via else ""
    unchecked = "" if ref.checked else " (not re-checked against the source)"
    return f"{ref.short}, {ref.date_text}: {text}{via}{unchecked}{url}"


__all__ = [
    "KINDS",
    "Reference",
    "UnknownReference",
    "cite",
    "format_value",
    "parse_date",
    "reference",
    "references",
    "references_path",
]
