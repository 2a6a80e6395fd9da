"""What a GPU's datasheet promises: the table ``data/gpu_specs.json`` and its lookup by name or alias.

Each row holds dense peak TFLOP/s per dtype (None where the chip lacks the format: bf16 on a T4), the
memory bandwidth and the memory size, with the datasheet it was copied from. Peak ÷ bandwidth is the
ridge point, Xiao & Zhu's "hardware arithmetic intensity". Nothing here touches a device: a notebook
on a CPU can place an H100 on the roofline. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from course_lib.core.dtypes import canonical

SPEC_DTYPES = ("bf16", "fp16", "fp8", "fp32")
_SPEC_KEYS = (
    "name",
    "aliases",
    "bf16_tflops",
    "fp16_tflops",
    "fp8_tflops",
    "fp32_tflops",
    "hbm_tbps",
    "memory_gb",
    "unsupported",
    "source",
)


@dataclass(frozen=True)
class GpuSpec:
    """One row of ``data/gpu_specs.json``: dense datasheet peaks of a GPU."""

    name: str
    aliases: tuple[str, ...]
    tflops: dict[str, float | None]  # dtype -> dense TFLOP/s, None when unsupported
    hbm_tbps: float
    memory_gb: float
    source: str
    unsupported: tuple[str, ...] = field(default=())

    @property
    def supported_dtypes(self) -> tuple[str, ...]:
        """The dtypes of ``SPEC_DTYPES`` this chip has (a T4: fp16 and fp32)."""
        return tuple(d for d in SPEC_DTYPES if self.tflops.get(d) is not None)

    def supports(self, dtype: str) -> bool:
        """Whether the datasheet lists a peak for ``dtype`` (False for bf16 on a T4)."""
        return canonical(dtype) in self.supported_dtypes

    def best_dtype(self, preferred: str = "bf16") -> str:
        """``preferred`` if the chip has it, else the nearest it has: the other 16-bit float
        (bf16 <-> fp16), then fp32. ``gpu_spec("T4").best_dtype("bf16") == "fp16"``."""
        name = canonical(preferred)
        if name not in SPEC_DTYPES:
            raise ValueError(f"dtype must be one of {SPEC_DTYPES} for a GPU spec, got {preferred!r}")
        order = {"bf16": ("bf16", "fp16"), "fp16": ("fp16", "bf16"), "fp8": ("fp8", "bf16", "fp16")}
        for candidate in (*order.get(name, (name,)), "fp32"):
            if self.supports(candidate):
                return candidate
        return "fp32"  # every entry has fp32 (the table's tests check it)

    def peak_flops(self, dtype: str = "bf16", *, missing: str = "raise") -> float | None:
        """Datasheet FLOP/s for ``dtype``. A format the chip lacks (bf16 on a T4) raises ValueError, or
        with ``missing="none"`` returns None so a notebook can print "no bf16 on this GPU" and go on
        (``best_dtype()`` picks one it has). An unknown dtype name always raises."""
        if missing not in ("raise", "none"):
            raise ValueError(f"missing must be 'raise' or 'none', got {missing!r}")
        name = canonical(dtype)
        if name not in SPEC_DTYPES:
            raise ValueError(f"dtype must be one of {SPEC_DTYPES} for a GPU spec, got {dtype!r}")
        value = self.tflops.get(name)
        if value is None:
            if missing == "none":
                return None
            raise ValueError(
                f"{self.name} has no {name} support (datasheet); supported: {list(self.supported_dtypes)} "
                f"(best_dtype({name!r}) -> {self.best_dtype(name)!r}; peak_flops(..., missing='none') returns None)"
            )
        return value * 1e12

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s."""
        return self.hbm_tbps * 1e12

    def ridge(self, dtype: str = "bf16", *, missing: str = "raise") -> float | None:
        """Ridge point (FLOP/byte) = peak FLOP/s ÷ bytes/s: Xiao & Zhu's hardware arithmetic intensity.
        ``missing`` as in ``peak_flops`` (None for a format the chip lacks with ``missing="none"``)."""
        flops = self.peak_flops(dtype, missing=missing)
        return None if flops is None else flops / self.bandwidth


def _normalise(name: str) -> str:
    key = name.strip().lower()
    key = re.sub(r"^(nvidia\s+)?(geforce\s+|tesla\s+)?", "", key)
    return re.sub(r"[\s_\-]+", " ", key).strip()


@lru_cache(maxsize=None)
def _load_specs(path: str) -> dict[str, GpuSpec]:
    raw = json.loads(Path(path).read_text())
    specs: dict[str, GpuSpec] = {}
    for entry in raw["gpus"]:
        missing = [k for k in _SPEC_KEYS if k not in entry]
        if missing:
            raise ValueError(f"{path}: entry {entry.get('name')!r} lacks {missing}")
        specs[entry["name"]] = GpuSpec(
            entry["name"],
            tuple(entry["aliases"]),
            {d: entry[f"{d}_tflops"] for d in SPEC_DTYPES},
            float(entry["hbm_tbps"]),
            float(entry["memory_gb"]),
            entry["source"],
            tuple(entry["unsupported"]),
        )
    return specs


def _spec_path() -> Path:
    from course_lib.core.paths import data_dir

    return data_dir() / "gpu_specs.json"


def gpu_specs() -> dict[str, GpuSpec]:
    """Every datasheet entry, by canonical name."""
    return dict(_load_specs(str(_spec_path())))


def gpu_names() -> tuple[str, ...]:
    return tuple(gpu_specs())


def find_spec(name: str) -> GpuSpec | None:
    """The entry whose name or alias matches ``name`` (case, "NVIDIA"/"Tesla" prefixes and separators
    ignored), or None."""
    key = _normalise(name)
    for spec in gpu_specs().values():
        if key in {_normalise(n) for n in (spec.name, *spec.aliases)}:
            return spec
    return None


def gpu_spec(name: str) -> GpuSpec:
    """Look a GPU up by name or alias ('NVIDIA H100 80GB HBM3' -> 'H100 SXM'); ValueError if unknown."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"gpu name must be a non-empty string such as 'H100 SXM', got {name!r}")
    spec = find_spec(name)
    if spec is None:
        raise ValueError(
            f"unknown GPU name {name!r}; valid names: {list(gpu_names())} "
            "(NVIDIA's device names such as 'NVIDIA H100 80GB HBM3' also work)"
        )
    return spec


def as_spec(gpu) -> GpuSpec:
    """``gpu`` itself if it is already a spec (anything with ``memory_gb``), else ``gpu_spec(gpu)``."""
    return gpu if hasattr(gpu, "memory_gb") else gpu_spec(gpu)
