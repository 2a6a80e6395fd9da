"""SmolLM2-135M-Instruct's speculative decoding over a prompt set, input-grounded vs free: measured here in
full mode, recorded once for the quick mode that cannot afford it.

One prompt shows one number; a prompt set separates the case prompt lookup is made for (an answer that
copies its input: an edit, an extraction) from free generation (nothing to copy, where only a draft model
can guess). ``measure_prompt_set`` runs plain greedy, prompt lookup and the course's distilled layer draft
(``smollm2-135m-draft``) on every chat task of ``decoding.prompts`` at each γ, with the run-to-run spread
of every speed-up (``SpecRow.spread``). ``python -m course_lib.decoding.smol_record`` writes it to
``data/measurements/smollm2-speculative-cpu.json`` with the machine, the load average before and after,
the threads, the software and the command; ``load_record`` reads it back. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from course_lib.core.paths import data_dir
from course_lib.decoding.prompts import CHAT_FREE, CHAT_GROUNDED, chat_ids
from course_lib.decoding.speedup import baseline, gamma_sweep

COMMAND = "python -m course_lib.decoding.smol_record"
FIELDS = ("task", "kind", "method", "gamma", "alpha", "tokens_per_forward", "c", "verify_over_plain")
FIELDS += ("speedup", "spread", "identical", "tokens", "round_speedups")


def default_path() -> Path:
    return data_dir() / "measurements" / "smollm2-speculative-cpu.json"


def smol_engine(device: str = "cpu"):
    """SmolLM2 as chapter 04 runs it: one sequence, 512 KV slots, oneDNN's packed weights only on a CPU."""
    from course_lib.engine import Engine, SchedulerConfig

    cfg = SchedulerConfig(max_model_len=512, max_num_seqs=1)
    return Engine("smollm2-135m-instruct", device=device, config=cfg, linear="packed" if device == "cpu" else "auto")


def tasks() -> list[tuple[str, str, str]]:
    """(name, kind, user text) for every chat task, kind "grounded" or "free", the two kinds interleaved."""
    g = [(f"grounded {i}", "grounded", t) for i, t in enumerate(CHAT_GROUNDED)]
    f = [(f"free {i}", "free", t) for i, t in enumerate(CHAT_FREE)]
    out = []
    for i in range(max(len(g), len(f))):
        out += g[i : i + 1] + f[i : i + 1]
    return out


def measure_prompt_set(
    smol, draft, task_list, lookup_gammas, draft_gammas, new_tokens: int, repeats: int, on_task=None
) -> list:
    """Plain greedy, prompt lookup at ``lookup_gammas`` and ``draft`` (a layer draft Engine, or None to skip
    it) at ``draft_gammas`` on each (name, kind, text) task: one dict per (task, method, γ) with ``FIELDS``.
    ``on_task(rows)``, if given, is called with the rows so far after each task (a recorder saves them)."""
    from course_lib.engine.speculative import DraftProposer, PromptLookupProposer

    if not task_list:
        raise ValueError("task_list must be a non-empty list of (name, kind, text)")
    rows = []
    for name, kind, text in task_list:
        if kind not in ("grounded", "free"):
            raise ValueError(f"kind must be 'grounded' or 'free', got {kind!r} for task {name!r}")
        b = baseline(smol, [chat_ids(smol.tokenizer, text)], new_tokens, repeats, ignore_eos=False)
        runs = gamma_sweep(smol, lambda: PromptLookupProposer(2, 4), b, list(lookup_gammas), "prompt lookup", repeats)
        if draft is not None:
            runs += gamma_sweep(smol, lambda: DraftProposer(draft), b, list(draft_gammas), "layer draft", repeats)
        for r in runs:
            d = r.as_dict()
            rows.append(
                {"task": name, "kind": kind, **{k: d[k] for k in FIELDS[2:] if k in d}, "tokens": len(b.outputs[0])}
            )
        if on_task is not None:
            on_task(rows)
    return rows


def summary(rows: list, method: str, kind: str) -> dict:
    """Over the tasks of one kind, each task at its best γ for ``method``: the median and the range of those
    speed-ups, and the median α."""
    best = {}
    for r in rows:
        if r["method"] == method and r["kind"] == kind:
            if r["task"] not in best or r["speedup"] > best[r["task"]]["speedup"]:
                best[r["task"]] = r
    if not best:
        raise ValueError(f"no rows for method {method!r} and kind {kind!r}")
    s = [r["speedup"] for r in best.values()]
    return {
        "tasks": len(s),
        "median": statistics.median(s),
        "min": min(s),
        "max": max(s),
        "alpha": statistics.median(r["alpha"] for r in best.values()),
    }


def table(rows: list) -> str:
    head = f"{'task':<12}{'kind':<10}{'method':<15}{'γ':>3}{'α':>6}{'tok/fwd':>8}{'c':>7}{'speed-up':>10}{'±':>6}"
    lines = [head + f"{'same':>6}{'tokens':>8}"]
    for r in rows:
        spread = f"{r['spread']:.0%}" if r["spread"] == r["spread"] else "–"
        lines.append(
            f"{r['task']:<12}{r['kind']:<10}{r['method']:<15}{r['gamma']:>3}{r['alpha']:>6.2f}"
            f"{r['tokens_per_forward']:>8.2f}{r['c']:>7.3f}{r['speedup']:>9.2f}x{spread:>6}"
            f"{('yes' if r['identical'] else 'NO'):>6}{r['tokens']:>8}"
        )
    return "\n".join(lines)


def record(
    lookup_gammas=(4, 8), draft_gammas=(2, 4), new_tokens: int = 128, repeats: int = 2, out: Path | None = None
) -> dict:
    """Measure the whole prompt set on this machine (``torch.set_num_threads`` as the chapter times); with
    ``out``, the file is rewritten after every task (``"complete": false`` until the last)."""
    from course_lib.engine.speculative import load_layer_draft
    from course_lib.measure.hardware import detect_device, timing_threads

    load_before = os.getloadavg()[0]
    torch.set_num_threads(timing_threads())
    smol = smol_engine()
    draft = load_layer_draft(smol, "smollm2-135m-draft", linear="packed") if draft_gammas else None
    import transformers

    def make(rows, complete):
        return {
            "model": "smollm2-135m-instruct",
            "draft": "smollm2-135m-draft",
            "machine": detect_device("cpu").describe(),
            "threads": torch.get_num_threads(),
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "load_before": load_before,
            "load_after": os.getloadavg()[0],
            "command": f"{COMMAND} --lookup-gammas {' '.join(map(str, lookup_gammas))} --draft-gammas "
            f"{' '.join(map(str, draft_gammas))} --new-tokens {new_tokens} --repeats {repeats}",
            "software": {
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
            "platform": platform.machine(),
            "tasks_measured": len({r["task"] for r in rows}),
            "complete": complete,
            "rows": rows,
        }

    def save(rows):
        if out is not None:
            Path(out).write_text(json.dumps(make(rows, False), indent=1) + "\n")

    rows = measure_prompt_set(smol, draft, tasks(), lookup_gammas, draft_gammas, new_tokens, repeats, save)
    rec = make(rows, True)
    if out is not None:
        Path(out).write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def load_record(path: Path | None = None) -> dict:
    """The recorded prompt set (``record``'s dict), with its fields checked."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise FileNotFoundError(f"no recorded run at {path}; make it with: {COMMAND}")
    rec = json.loads(path.read_text())
    missing = [k for k in ("machine", "command", "measured_at", "rows") if k not in rec]
    if missing or not rec["rows"] or any(k not in rec["rows"][0] for k in FIELDS):
        raise ValueError(f"{path} is not a recorded prompt set (missing {missing or 'row fields'})")
    return rec


def label(rec: dict) -> str:
    part = "" if rec.get("complete", True) else f" (partial: the first {rec.get('tasks_measured', '?')} tasks)"
    return (
        f"recorded {rec['measured_at'][:10]} on {rec['machine']}, {rec['threads']} thread(s), "
        f"load average {rec['load_before']:.1f} before / {rec['load_after']:.1f} after{part}: `{rec['command']}`"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lookup-gammas", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--draft-gammas", type=int, nargs="*", default=[2, 4], help="none: prompt lookup only")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    out = a.out or default_path()
    rec = record(a.lookup_gammas, a.draft_gammas, a.new_tokens, a.repeats, out)
    print(table(rec["rows"]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
