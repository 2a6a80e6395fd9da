"""The memory hierarchy of a GPU, registers to host memory, and the non-GPU accelerators' datasheet rows.

A roofline draws one bandwidth roof, HBM's. Beneath it a GPU has faster and much smaller memories:
registers and SRAM (L1 / shared memory) in every SM, an L2 cache shared by all SMs, and behind HBM the
host's DRAM over PCIe. ``hierarchy("H100 SXM")`` reads them from ``data/gpu_specs.json`` (the
``hierarchy`` of three GPUs): each level's total capacity and its bandwidth, either NVIDIA's figure,
derived from NVIDIA's own figures (bytes per clock × SMs × boost clock, as the level's note says) or
None where NVIDIA publishes none. ``accelerators()`` are the TPU and LPU (Groq, SRAM only) rows of the
same file: peaks and memory, for the capacity-against-bandwidth trade a learner meets in Huyen's ch. 9.
Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from course_lib.measure.hardware.datasheet import _spec_path, gpu_spec


@dataclass(frozen=True)
class MemoryLevel:
    """One level of a GPU's memory: total bytes (None: not the GPU's, e.g. host DRAM) and bytes/s."""

    level: str
    bytes: float | None
    bandwidth: float | None  # bytes/s; None where no figure is published
    per_sm_bytes: float | None
    note: str
    derived: bool  # the bandwidth is computed from bytes/clock × SMs × clock, not printed by NVIDIA


@dataclass(frozen=True)
class Accelerator:
    """A non-GPU accelerator's datasheet row: a TPU or an SRAM-only LPU."""

    name: str
    kind: str
    bf16_tflops: float
    memory: str
    memory_gb: float
    tbps: float
    source: str
    checked: bool

    @property
    def ridge(self) -> float:
        """Peak FLOP/s ÷ memory bandwidth (FLOP/byte)."""
        return self.bf16_tflops / self.tbps

    def chips_to_hold(self, n_bytes: float) -> int:
        """How many chips a model of ``n_bytes`` needs just to be stored in their memory."""
        if not n_bytes > 0:
            raise ValueError(f"n_bytes must be > 0, got {n_bytes!r}")
        return -int(-n_bytes // (self.memory_gb * 1e9))


def _raw() -> dict:
    return json.loads(Path(_spec_path()).read_text(encoding="utf-8"))


def hierarchy(gpu: str) -> list[MemoryLevel]:
    """The memory levels of ``gpu`` (any name or alias ``gpu_spec`` knows), fastest first. ValueError
    for a GPU whose row has no hierarchy, naming those that have one."""
    name = gpu_spec(gpu).name
    rows = {g["name"]: g for g in _raw()["gpus"] if "hierarchy" in g}
    if name not in rows:
        raise ValueError(f"no memory hierarchy recorded for {name!r}; recorded: {sorted(rows)}")
    h = rows[name]["hierarchy"]
    sms, hz = h["sms"], h["clock_ghz"] * 1e9
    levels = []
    for lv in h["levels"]:
        per_sm = lv.get("bytes_per_sm")
        total = per_sm * sms if per_sm is not None else lv.get("bytes")
        if lv.get("bytes_per_clock_per_sm"):
            bw, derived = lv["bytes_per_clock_per_sm"] * sms * hz, True
        elif lv.get("bytes_per_clock"):
            bw, derived = lv["bytes_per_clock"] * hz, True
        else:
            bw, derived = (lv["tbps"] * 1e12 if lv.get("tbps") else None), False
        levels.append(MemoryLevel(lv["level"], total, bw, per_sm, lv["note"], derived))
    return levels


def hierarchy_source(gpu: str) -> str:
    """The documents a GPU's hierarchy comes from, and how its clock was read."""
    name = gpu_spec(gpu).name
    h = next(g["hierarchy"] for g in _raw()["gpus"] if g["name"] == name and "hierarchy" in g)
    return f"{h['source']}; clock: {h['clock_note']}"


def hierarchy_gpus() -> tuple[str, ...]:
    """The GPUs whose row records a hierarchy."""
    return tuple(g["name"] for g in _raw()["gpus"] if "hierarchy" in g)


def accelerators() -> list[Accelerator]:
    """The TPU and LPU rows of ``data/gpu_specs.json``."""
    keys = ("name", "kind", "bf16_tflops", "memory", "memory_gb", "tbps", "source", "checked")
    return [Accelerator(*(a[k] for k in keys)) for a in _raw()["accelerators"]]


def _size(n: float | None) -> str:
    if n is None:
        return "—"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:.0f} B"


def format_hierarchy(gpu: str) -> str:
    """A table of ``gpu``'s levels: capacity, bandwidth and how many times HBM's bandwidth it is."""
    levels = hierarchy(gpu)
    hbm = next(lv.bandwidth for lv in levels if lv.level.startswith("HBM"))
    lines = [f"{gpu_spec(gpu).name}: {'level':<30}{'capacity':>11}{'TB/s':>8}{'x HBM':>8}  how"]
    for lv in levels:
        bw = f"{lv.bandwidth / 1e12:8.3g}" if lv.bandwidth else f"{'—':>8}"
        ratio = f"{lv.bandwidth / hbm:8.2g}" if lv.bandwidth else f"{'—':>8}"
        how = "derived" if lv.derived else ("datasheet" if lv.bandwidth else "not published")
        lines.append(f"{'':<{len(gpu_spec(gpu).name) + 2}}{lv.level:<30}{_size(lv.bytes):>11}{bw}{ratio}  {how}")
    return "\n".join(lines)
