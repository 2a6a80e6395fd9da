"""A GPU run's outputs → ``data/measurements/<gpu>.json``, the file the chapters quote as "measured on <GPU>".

``benchmarks/gpu_check.sh`` leaves one folder: ``env.log`` (GPU, driver, software), ``summary.txt`` (one
``== step: rc=… in N s`` line per step), ``tests.xml`` (JUnit), and the JSON each benchmark wrote
(``peaks.json``, ``flash_attention.json``, ``quant_kernels.json``, ``engine_vs_hf.json``). ``collect``
turns them into the measurement record: every section the run produced replaces the stored one, a section
the run did not produce keeps the stored one with the date it was measured (``sections_from``), and the
notebooks' full-mode results come from the summary as "ran (N s)" or "failed (rc …)", never edited by
hand. ``python benchmarks/gpu_collect.py OUT`` calls it. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

_STEP = re.compile(r"^== (\S+): (?:rc=(\d+) in (\d+) s|skipped, (-?\d+) s left)")
SECTIONS = {  # section name → the file gpu_check.sh writes for it
    "peaks": "peaks.json",
    "flash_attention": "flash_attention.json",
    "quant_kernels": "quant_kernels.json",
    "flash_decoding": "flash_decoding.json",
    "engine_vs_hf": "engine_vs_hf.json",
    "decode_mbu": "decode_mbu.json",
    "step_levers": "step_levers.json",
}


def parse_summary(text: str) -> dict[str, str]:
    """``{step: "ran (N s)" | "failed (rc R after N s)" | "timed out (N s)" | "skipped (device time)"}``."""
    out = {}
    for line in text.splitlines():
        m = _STEP.match(line.strip())
        if not m:
            continue
        name, rc, secs, _left = m.groups()
        if rc is None:
            out[name] = "skipped (device time)"
        elif rc == "0":
            out[name] = f"ran ({secs} s)"
        elif rc in ("124", "137"):
            out[name] = f"timed out ({secs} s)"
        else:
            out[name] = f"failed (rc {rc} after {secs} s; see {name}.log)"
    return out


def parse_junit(path: Path) -> dict:
    """Counts of a pytest JUnit file, and the failed tests' names."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError(f"{path} is not a JUnit file (no <testsuite>)")
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return dict(
        tests=int(suite.get("tests", 0)),
        failures=int(suite.get("failures", 0)) + int(suite.get("errors", 0)),
        skipped=int(suite.get("skipped", 0)),
        failed=failed,
    )


def gpu_slug(env_text: str) -> tuple[str, str]:
    """(the GPU's name, its file stem) from ``nvidia-smi -L`` in env.log: "NVIDIA H200" → "nvidia-h200"."""
    m = re.search(r"GPU 0: ([^(]+?)\s*\(", env_text)
    if not m:
        raise ValueError("env.log names no GPU (no 'GPU 0: <name> (UUID …)' line from nvidia-smi -L)")
    name = m.group(1).strip()
    return name, re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def collect(out_dir, data_dir, today: str | None = None) -> Path:
    """Write (or update) ``data_dir/<gpu>.json`` from the run in ``out_dir``; returns the file's path."""
    out_dir, data_dir = Path(out_dir), Path(data_dir)
    for need in ("env.log", "summary.txt"):
        if not (out_dir / need).is_file():
            raise ValueError(f"out_dir {str(out_dir)!r} has no {need}: is it the OUT of benchmarks/gpu_check.sh?")
    env = (out_dir / "env.log").read_text()
    name, slug = gpu_slug(env)
    path = data_dir / f"{slug}.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    previous = record.get("measured_on", "unknown")
    today = today or _dt.date.today().isoformat()
    sections_from = dict(record.get("sections_from", {}))
    for key in record:
        if key not in ("gpu", "measured_on", "machine", "software", "how", "sections_from"):
            sections_from.setdefault(key, previous)
    steps = parse_summary((out_dir / "summary.txt").read_text())
    for section, fname in SECTIONS.items():
        f = out_dir / fname
        if f.is_file():
            record[section] = json.loads(f.read_text())
            sections_from[section] = today
    if (out_dir / "tests.xml").is_file():
        record["gpu_tests"] = parse_junit(out_dir / "tests.xml")
        sections_from["gpu_tests"] = today
    notebooks = {k[3:]: v for k, v in steps.items() if k.startswith("nb_")}
    if notebooks:
        record["notebooks_full_mode"] = notebooks
        sections_from["notebooks_full_mode"] = today
    query = [line for line in env.splitlines() if line.startswith(name) and "MiB" in line]  # nvidia-smi --query-gpu
    if query:
        record["machine"] = f"{query[0]} (name, memory, max SM clock, max memory clock, driver)"
    record.update(
        gpu=name,
        measured_on=today,
        software=" | ".join(line for line in env.splitlines() if line.startswith(("torch", "3.", "Python"))),
        how="bash benchmarks/gpu_check.sh (each step's command is in that script); then python benchmarks/gpu_collect.py OUT",
        steps=steps,
        sections_from=sections_from,
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


__all__ = ["SECTIONS", "collect", "gpu_slug", "parse_junit", "parse_summary"]
