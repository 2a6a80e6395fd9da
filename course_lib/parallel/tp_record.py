"""A recorded TP = 3 run of SmolLM2-135M-Instruct against one process, for quick mode (a 2-core CI budget).

Four processes (one reference, three ranks) take tens of seconds and over a GB on the course's 2-core
machine, more than quick mode can pay. ``python -m course_lib.parallel.tp_record`` runs
``tp_equality.tp_equality`` exactly as chapter 07's full mode does, once per rank memory layout
(``LAYOUTS``: the ranks importing ``transformers`` to load and replicating the embedding/head; loading
from safetensors alone, replicated; and vocabulary-parallel, the chapter's run), and writes what each
returned to ``data/measurements/smollm2-tp3-cpu.json`` with the date, the machine, the load average before
and the command; ``load_recorded`` rebuilds the ``TPEquality`` of the chapter's layout (``load_layouts``:
all of them), so the notebook prints and checks the same fields either way (and says which one it shows).
Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

MODEL = "smollm2-135m-instruct"
QUESTIONS = ["What is the capital of France?", "Name three primary colours.", "How many legs does a spider have?"]
COMMAND = "python -m course_lib.parallel.tp_record --max-new-tokens 8"
# rank memory layouts, in the order they were built: each one's tp_equality arguments
LAYOUTS = {
    "replicated vocab, transformers in each rank": dict(vocab_parallel=False, standalone=False),
    "replicated vocab, safetensors only": dict(vocab_parallel=False, standalone=True),
    "vocab-parallel, safetensors only": dict(vocab_parallel=True, standalone=True),
}
MAIN = "vocab-parallel, safetensors only"  # the chapter's run


def record_path() -> Path:
    from course_lib.core.paths import data_dir

    return data_dir() / "measurements" / "smollm2-tp3-cpu.json"


def _fields(res) -> dict:
    return {
        "model": res.model,
        "world_size": res.world_size,
        "prompt_tokens": res.prompt_tokens,
        "single": res.single,
        "ranks": res.ranks,
        "launch_s": res.launch_s,
        "max_abs_logit": res.max_abs_logit,
        "answers": res.answers,
    }


def run_layouts(max_new_tokens: int = 8) -> dict:
    """{layout: TPEquality}: TP = 3 against one process, once per ``LAYOUTS`` entry, one after another."""
    from course_lib.parallel.tp_equal import tp_equality

    return {
        name: tp_equality(MODEL, 3, QUESTIONS, chat=True, decode_steps=2, max_new_tokens=max_new_tokens, **kw)
        for name, kw in LAYOUTS.items()
    }


def record(max_new_tokens: int = 8, path: Path | None = None) -> Path:
    """Run TP = 3 against one process in every layout and write the results (``load_recorded`` reads them)."""
    import torch

    from course_lib.measure.hardware import detect_device

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    runs = run_layouts(max_new_tokens)
    out = {
        "_about": "SmolLM2-135M-Instruct at TP=3 (three gloo processes) against one process: the fields of "
        "course_lib.parallel.tp_equal.TPEquality, for the chapter's layout (result) and for every rank memory "
        "layout of course_lib.parallel.tp_record.LAYOUTS (layouts). Chapter 07 shows it in quick mode as recorded.",
        "command": COMMAND
        if max_new_tokens == 8
        else f"python -m course_lib.parallel.tp_record --max-new-tokens {max_new_tokens}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{detect_device().describe()}; {os.cpu_count()} logical CPUs, {platform.system()}",
        "software": {"python": sys.version.split()[0], "torch": torch.__version__},
        "load_average_before": load_before,
        "questions": QUESTIONS,
        "result": _fields(runs[MAIN]),
        "layouts": {name: _fields(r) for name, r in runs.items() if name != MAIN},
    }
    path = path or record_path()
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def load_recorded(path: Path | None = None):
    """(TPEquality, the file's metadata: date, machine, command, load average)."""
    from course_lib.parallel.tp_equal import TPEquality

    raw = json.loads((path or record_path()).read_text(encoding="utf-8"))
    meta = {k: raw[k] for k in ("date", "machine", "command", "load_average_before")}
    return TPEquality(**raw["result"]), meta


def load_layouts(path: Path | None = None) -> dict:
    """{layout: TPEquality} of every recorded layout (``LAYOUTS``' order; files made before had only one)."""
    from course_lib.parallel.tp_equal import TPEquality

    raw = json.loads((path or record_path()).read_text(encoding="utf-8"))
    got = {name: TPEquality(**r) for name, r in raw.get("layouts", {}).items()}
    got[MAIN] = TPEquality(**raw["result"])
    return {name: got[name] for name in LAYOUTS if name in got}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=8)
    args = ap.parse_args(argv)
    print(record(args.max_new_tokens))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
