"""The performance ledger: every speed goal of the engine (issue 21) with its latest measured ratio.

Each ``Goal`` names a benchmark's JSON output under ``data/measurements/`` and how to read one ratio
from it (engine ÷ llama.cpp per format, prefill, tiny-target ÷ HF ``generate``, GEMV GB/s ÷ STREAM per
format, server TPOT ÷ in-process step, the GPU goals). ``build_ledger`` reads what is there and gives,
per goal, the ratio, whether it met the goal, and the source file's machine and date; a goal whose file
is missing, or lacks the number, says "not measured" and the command that would measure it, so a
regression or a gap shows as a number or a line, never silently. ``write_ledger`` writes
``performance-ledger.json`` and keeps one row for it in ``data/measurements/README.md``.
``benchmarks/ledger.py`` is the command. Introduced in 02_metrics_2_throughput_utilization.ipynb.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Callable

LLAMA = "smollm2-vs-llamacpp-cpu.json"
TINY_LLAMA = "tiny-target-vs-llamacpp-cpu.json"
GEMV = "gemv-roof-cpu.json"
TINY_HF = "engine-vs-hf-tiny-cpu.json"
SERVER = "server-tpot-cpu.json"
GPU = "nvidia-h200.json"


@dataclass(frozen=True)
class Goal:
    """``name``: the goal in words; the ratio ``read(data)`` from ``source`` must be >= ``at_least``
    (or <= ``at_most``); ``command`` makes the source; ``gpu``: needs a lent GPU."""

    name: str
    source: str
    read: Callable[[object], float | None]
    command: str
    at_least: float | None = None
    at_most: float | None = None
    gpu: bool = False
    context: Callable[[object], dict | None] | None = None  # more from the source, beside the ratio


def _llama_row(fmt: str, key: str):
    def read(d):
        for r in d.get("rows", []):
            if r.get("format") == fmt:
                return r.get(key)
        return None

    return read


def _best_gemv_row(d, fmt: str) -> dict | None:
    """The format family's fastest 1-row product in ``benchmarks/gemv_roof.py``'s rows."""
    rows = [r for r in d.get("rows", []) if r.get("family") == fmt and r.get("rows") == 1]
    return max(rows, key=lambda r: r["fraction"], default=None)


def _gemv(fmt: str):
    def read(d):
        best = _best_gemv_row(d, fmt)
        return None if best is None else best["fraction"]

    return read


def _gemv_bound(fmt: str):
    """The in-cache rate of the format's best 1-row kernel (``benchmarks/gemv_roof.py``'s ``bounds``): which
    roof is the lower on that machine, memory or the kernel's arithmetic."""

    def read(d):
        best = _best_gemv_row(d, fmt)
        if best is None:
            return None
        for b in d.get("bounds", []):
            if b.get("format") == best.get("format") and b.get("path") == best.get("path"):
                if b.get("threads") == best.get("threads"):
                    return {k: b[k] for k in ("cache_fraction", "lower_roof", "of_lower_roof", "threads")}
        return None

    return read


def _tiny_hf(d):
    rows = d["rows"] if isinstance(d, dict) else d
    for r in rows:
        if r.get("batch") == 1:
            return r.get("ratio")
    return None


def _section_rows(d, section: str) -> list:
    """A GPU record section's rows: gpu_collect.py stores each benchmark's JSON as written, a list of rows
    (the 2026-11-30 record) or ``{"meta": ..., "rows": [...]}`` (the benchmarks since)."""
    sec = d.get(section) if isinstance(d, dict) else None
    rows = sec.get("rows", []) if isinstance(sec, dict) else sec
    return [r for r in rows or [] if isinstance(r, dict)]


def _gpu_step_ms(d):
    for r in _section_rows(d, "engine_vs_hf"):
        if r.get("batch") == 1 and "step_ms_engine" in r:
            return r["step_ms_engine"]
    return None


def _gpu_step_context(d):
    """The engine's decode mode in that run, and each lever's µs per step (``step_levers``) when it ran."""
    sec = d.get("engine_vs_hf") if isinstance(d, dict) else None
    out = {"decode": sec.get("meta", {}).get("decode")} if isinstance(sec, dict) else {}
    levers = {
        r["lever"]: round(r["step_us"]) for r in _section_rows(d, "step_levers") if "lever" in r and "step_us" in r
    }
    if levers:
        out["step_us_per_lever"] = levers
    return out or None


MBU_SHAPE, MBU_DTYPE = "llama-3.2-1b", "bf16"


def _mbu_rows(d) -> list:
    """``benchmarks/decode_mbu.py``'s rows of the goal's shape and dtype."""
    return [r for r in _section_rows(d, "decode_mbu") if r.get("shape") == MBU_SHAPE and r.get("dtype") == MBU_DTYPE]


def _gpu_mbu(d):
    return max((r["mbu"] for r in _mbu_rows(d) if "mbu" in r), default=None)


def _gpu_mbu_context(d):
    rows = _mbu_rows(d)
    if not rows:
        return None
    b = max(rows, key=lambda r: r.get("mbu", 0))
    return {
        "best_lever": b.get("lever"),
        "gbps": round(b.get("gbps", 0)),
        "bandwidth_gbps": round(b.get("bandwidth_gbps", 0)),
        "mbu_per_lever": {r.get("lever"): round(r.get("mbu", 0), 3) for r in rows},
    }


LLAMA_CMD = (
    "python benchmarks/vs_llamacpp.py --formats fp32 int8 int8-dyn int4 int4-q8 --tokens 32 --repeats 3 --json data/measurements/"
    + LLAMA
)
GOALS = (
    Goal("SmolLM2 fp32 decode, engine ÷ llama.cpp f32", LLAMA, _llama_row("fp32", "ratio"), LLAMA_CMD, 0.9),
    Goal("SmolLM2 int8 decode, engine ÷ llama.cpp q8_0", LLAMA, _llama_row("int8", "ratio"), LLAMA_CMD, 0.8),
    Goal(
        "SmolLM2 int8 decode, int8 activations (fbgemm dynamic) ÷ llama.cpp q8_0",
        LLAMA,
        _llama_row("int8-dyn", "ratio"),
        LLAMA_CMD,
        0.8,
    ),
    Goal("SmolLM2 int4 decode, engine ÷ llama.cpp Q4_1", LLAMA, _llama_row("int4", "ratio"), LLAMA_CMD, 0.8),
    Goal(
        "SmolLM2 int4 decode, int8 activations per 32 (gemv-q8) ÷ llama.cpp Q4_1",
        LLAMA,
        _llama_row("int4-q8", "ratio"),
        LLAMA_CMD,
        0.8,
    ),
    Goal("SmolLM2 fp32 prefill, engine ÷ llama.cpp", LLAMA, _llama_row("fp32", "prefill_ratio"), LLAMA_CMD, 1.0),
    Goal(
        "tiny-target batch-1 decode, engine ÷ HF generate",
        TINY_HF,
        _tiny_hf,
        "python benchmarks/engine_vs_hf.py --model tiny-target --batches 1 --json data/measurements/" + TINY_HF,
        3.0,
    ),
    Goal(
        "tiny-target batch-1 decode, engine ÷ llama.cpp",
        TINY_LLAMA,
        _llama_row("fp32", "ratio"),
        "python benchmarks/vs_llamacpp.py --model tiny-target --tokens 64 --repeats 3 --json data/measurements/"
        + TINY_LLAMA,
        0.4,
    ),
    *(
        Goal(
            f"{fmt} GEMV (1 row, weight ≫ LLC), GB/s ÷ STREAM triad",
            GEMV,
            _gemv(fmt),
            "python benchmarks/gemv_roof.py --json data/measurements/" + GEMV,
            0.75,
            context=_gemv_bound(fmt),
        )
        for fmt in ("fp32", "int8", "int4")
    ),
    Goal(
        "int4-q8 GEMV (1 row, weight ≫ LLC; activations rounded to int8 per 32, llama.cpp's trade), GB/s ÷ STREAM",
        GEMV,
        _gemv("int4-q8"),
        "python benchmarks/gemv_roof.py --json data/measurements/" + GEMV,
        0.75,
        context=_gemv_bound("int4-q8"),
    ),
    Goal(
        "server p50 TPOT at 8 req/s ÷ in-process step at the same batch",
        SERVER,
        lambda d: d.get("ratio"),  # serving.server_tpot_record: the default (process) server's median over rounds
        "python benchmarks/server_overhead.py --json data/measurements/" + SERVER,
        at_most=1.3,
    ),
    Goal(
        "tiny-target decode step on the H200, ms (not a ratio)",
        GPU,
        _gpu_step_ms,
        "bash benchmarks/gpu_check.sh (on a lent GPU: benchmarks/engine_vs_hf.py --device cuda, decode auto = cudagraph)",
        at_most=0.5,
        gpu=True,
        context=_gpu_step_context,
    ),
    Goal(
        "Llama-3.2-1B-shape bf16 batch-1 decode, GB/s ÷ measured HBM",
        GPU,
        _gpu_mbu,
        "bash benchmarks/gpu_check.sh (on a lent GPU: benchmarks/decode_mbu.py --device cuda)",
        0.6,
        gpu=True,
        context=_gpu_mbu_context,
    ),
)


def _meta(data) -> dict:
    if not isinstance(data, dict):
        return {}
    m = dict(data.get("meta", {}))
    if "measured_on" in data:  # the GPU records keep these at the top level
        m.setdefault("date", data["measured_on"])
    for k in ("machine", "gpu"):
        if k in data and not isinstance(data[k], (dict, list)):
            m.setdefault(k, data[k])
    return {k: m[k] for k in ("machine", "date", "command", "load_average_before", "gpu") if k in m}


def evaluate(goal: Goal, data, source_meta: dict | None = None) -> dict:
    """One ledger entry: the goal, its threshold, the ratio read from ``data`` (None: not measured)."""
    entry = {"goal": goal.name, "source": goal.source, "command": goal.command}
    entry.update({"at_least": goal.at_least} if goal.at_least is not None else {"at_most": goal.at_most})
    ratio = None
    if data is not None:
        try:
            ratio = goal.read(data)
        except (KeyError, TypeError, AttributeError):
            ratio = None
    if ratio is None:
        why = (
            "no GPU" if goal.gpu else ("no such number in " + goal.source if data is not None else "no " + goal.source)
        )
        entry.update(ratio=None, status=f"not measured: {why}")
        return entry
    ratio = float(ratio)
    met = (goal.at_least is None or ratio >= goal.at_least) and (goal.at_most is None or ratio <= goal.at_most)
    entry.update(ratio=ratio, status="met" if met else "missed", **(source_meta or {}))
    if goal.context is not None:
        try:
            more = goal.context(data)
        except (KeyError, TypeError, AttributeError):
            more = None
        if more:
            entry["context"] = more
    return entry


def build_ledger(data_dir, goals=GOALS, machine: str | None = None) -> dict:
    """Read every goal's source under ``data_dir``; the ledger as a dict (``meta`` + ``goals``)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise ValueError(f"data_dir must be a folder of benchmark JSON files, got {str(data_dir)!r}")
    cache: dict[str, object] = {}
    entries = []
    for g in goals:
        if g.source not in cache:
            p = data_dir / g.source
            try:
                cache[g.source] = json.loads(p.read_text()) if p.is_file() else None
            except json.JSONDecodeError as e:
                raise ValueError(f"{p} is not valid JSON ({e}); re-run: {g.command}") from None
        data = cache[g.source]
        meta = _meta(data)
        if data is not None and "date" not in meta:
            meta["date"] = date.fromtimestamp(os.path.getmtime(data_dir / g.source)).isoformat()
        entries.append(evaluate(g, data, meta))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "meta": {"written": date.today().isoformat(), "machine": machine, "load_average": load},
        "goals": entries,
    }


def summary(ledger: dict) -> str:
    """The ledger as a table: goal, threshold, ratio, status, source date."""
    lines = [f"{'goal':<66}{'target':>9}{'latest':>9}  status"]
    for e in ledger["goals"]:
        target = f">= {e['at_least']:g}" if "at_least" in e else f"<= {e['at_most']:g}"
        ratio = "-" if e["ratio"] is None else f"{e['ratio']:.2f}"
        when = f" ({e['date']})" if e.get("date") else ""
        lines.append(f"{e['goal']:<66}{target:>9}{ratio:>9}  {e['status']}{when}")
        c = e.get("context") or {}
        if "cache_fraction" in c:
            lines.append(
                f"    the same kernel in cache: {c['cache_fraction']:.2f} of STREAM ({c.get('threads')} threads): "
                f"the lower roof is {c['lower_roof']}, and the product reads at {c['of_lower_roof']:.0%} of it"
            )
        if "mbu_per_lever" in c:
            each = ", ".join(f"{k} {v:.0%}" for k, v in c["mbu_per_lever"].items())
            lines.append(
                f"    best lever {c['best_lever']}: {c['gbps']} of {c['bandwidth_gbps']} GB/s measured; per lever: {each}"
            )
        if "step_us_per_lever" in c or "decode" in c:
            each = ", ".join(f"{k} {v} µs" for k, v in c.get("step_us_per_lever", {}).items())
            lines.append(
                f"    the engine's decode mode: {c.get('decode', 'not recorded')}"
                + (f"; one step per lever: {each}" if each else "")
            )
    return "\n".join(lines)


README_ROW_KEY = "| `performance-ledger.json` |"


def readme_row(ledger: dict) -> str:
    met = sum(e["status"] == "met" for e in ledger["goals"])
    missed = sum(e["status"] == "missed" for e in ledger["goals"])
    rest = len(ledger["goals"]) - met - missed
    return (
        f"{README_ROW_KEY} none: the machine of each source file is in the ledger | {ledger['meta']['written']} | "
        f"issue 21's speed goals, each with its latest ratio read from the benchmark files here "
        f"({met} met, {missed} missed, {rest} not measured); made by `python benchmarks/ledger.py` |"
    )


def write_ledger(ledger: dict, out_json, readme=None) -> None:
    """Write the ledger JSON and replace (or append) its row in the ``readme`` table."""
    Path(out_json).write_text(json.dumps(ledger, indent=1, ensure_ascii=False) + "\n")
    if readme is None:
        return
    readme = Path(readme)
    lines = readme.read_text().splitlines() if readme.is_file() else []
    row = readme_row(ledger)
    idx = [i for i, line in enumerate(lines) if line.startswith(README_ROW_KEY)]
    if idx:
        lines[idx[0]] = row
    else:
        last = max((i for i, line in enumerate(lines) if line.startswith("| `")), default=len(lines) - 1)
        lines.insert(last + 1, row)
    readme.write_text("\n".join(lines) + "\n")


__all__ = ["GOALS", "Goal", "build_ledger", "evaluate", "readme_row", "summary", "write_ledger"]
