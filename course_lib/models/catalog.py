"""The course's models in one table: what each is, how big, whether it is here, and what it is used for.

Introduced in 00_setup_and_hardware.ipynb. Two kinds of model run in the course. The tiny ones (trained by
the course on the Python standard library, shipped in ``data/models/``) are fast enough to train, distil and
run hundreds of times on two cores, but their weights fit in a CPU's last-level cache, so decode on them is
bound by overhead, not by memory bandwidth. SmolLM2-135M-Instruct (a real pretrained chat model, read offline
from a pip package's GGUF file: ``models.gguf``) is 538 MB in fp32, far larger than any CPU cache, and it
talks and copies: the regime where bandwidth, quantization and speculation lessons are real. Sizes come from
the files' headers (safetensors) or the model card (``data/models/<name>.json``); nothing is loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from course_lib.core.paths import data_dir
from course_lib.models import gguf

#: what each model is for, in the course's words (the chapters say the same beside each section)
ROLES = {
    "tiny-target": "training, Medusa heads, distillation, CI speed",
    "tiny-draft": "tiny-target's draft (04)",
    "tiny-draft-distilled": "tiny-draft distilled from tiny-target (03, 04)",
    "tiny-target-mqa": "one KV head: multi-query attention (05, 07)",
    "smollm2-135m-instruct": "a real chat model: bandwidth, quantization, speculation, serving",
}


@dataclass(frozen=True)
class ModelEntry:
    name: str
    kind: str  # "embedded" (in data/models) or "installed" (a pip package's GGUF, converted once)
    params: int
    fp32_bytes: int
    available: bool  # loads offline now (installed: the package is present)
    cached: bool  # installed: already converted (later loads take about a second)
    role: str

    def cache_ratio(self, cache_bytes: int | None) -> float | None:
        """fp32 weights ÷ the last-level cache: below 1 they can stay in cache across decode steps."""
        return None if not cache_bytes else self.fp32_bytes / cache_bytes


def _safetensors_params(path) -> int:
    """Parameter count from a safetensors header alone (8-byte length, then JSON): no tensor is read."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    total = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        count = 1
        for dim in info["shape"]:
            count *= dim
        total += count
    return total


def catalog() -> list[ModelEntry]:
    """Every model the course names: the embedded ones, then the installed ones."""
    from course_lib.models.load import EMBEDDED  # load imports gguf; imported here to keep this module light

    rows = []
    for name in EMBEDDED:
        params = _safetensors_params(data_dir() / "models" / name / "model.safetensors")
        rows.append(ModelEntry(name, "embedded", params, 4 * params, True, True, ROLES.get(name, "")))
    for name in gguf.SOURCES:
        card = data_dir() / "models" / f"{name}.json"
        params = int(json.loads(card.read_text())["params"]) if card.is_file() else 0
        try:
            gguf.gguf_file(name)
            available = True
        except (ModuleNotFoundError, FileNotFoundError):
            available = False
        cached = available and gguf.is_cached(name, gguf.model_cache_dir(name))
        rows.append(ModelEntry(name, "installed", params, 4 * params, available, cached, ROLES.get(name, "")))
    return rows


def print_catalog(cache_bytes: int | None) -> list[ModelEntry]:
    """The table, with each model's fp32 size against this machine's last-level cache."""
    rows = catalog()
    llc = f"{cache_bytes / 2**20:.0f} MiB" if cache_bytes else "unknown"
    print(f"last-level cache of this machine: {llc}")
    print(f"{'model':<24}{'kind':<11}{'params':>13}{'fp32 MB':>9}{'÷ LLC':>8}  here   role")
    for r in rows:
        ratio = r.cache_ratio(cache_bytes)
        ratio_s = f"{ratio:>7.1f}×" if ratio is not None else f"{'—':>8}"
        here = "yes" if r.available else "no"
        if r.kind == "installed" and r.available:
            here = "cached" if r.cached else "yes"
        print(f"{r.name:<24}{r.kind:<11}{r.params:>13,}{r.fp32_bytes / 1e6:>9.1f}{ratio_s}  {here:<6} {r.role}")
    return rows


__all__ = ["ROLES", "ModelEntry", "catalog", "print_catalog"]
