"""Which device the course runs on: a ``DeviceInfo`` for the CUDA GPU (name, memory, compute
capability, SMs, L2) or for the CPU (model, physical cores, clock, vector ISA, last-level cache), and
what follows from it: the dtype to compute in and the device's datasheet entry, if it has one.
Detection is cached for the process. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from course_lib.measure.hardware.cpu_probe import probe_cpu
from course_lib.measure.hardware.datasheet import GpuSpec, find_spec

_CLOCK_NOTES = {
    "max": "max clock",
    "base": "base clock",
    "current": "current clock; max not exposed",
    "": "clock unknown",
}


@dataclass(frozen=True)
class DeviceInfo:
    """The device the course runs on: ``kind`` is ``"cuda"`` or ``"cpu"``."""

    kind: str
    name: str
    memory_gb: float  # 0.0 when unknown
    compute_capability: tuple[int, int] | None = None  # CUDA only, e.g. (7, 5) for a T4
    sm_count: int | None = None  # CUDA only
    cores: int | None = None  # CPU: logical cores (hardware threads) the OS reports
    threads: int | None = None  # CPU: threads torch will use
    isa: tuple[str, ...] = ()  # CPU: flags from ISA_FLAGS present on this machine
    torch_cpu_capability: str = ""  # CPU: what torch's kernels dispatch to (DEFAULT, AVX2, AVX512)
    mhz: float | None = None  # CPU: the clock used for the FLOP ceiling; which one it is: freq_source
    cache_bytes: int | None = None  # last-level cache (CPU L3, GPU L2); None when unknown
    physical_cores: int | None = None  # CPU: physical cores (None: unknown, use ``cores``)
    freq_source: str = ""  # CPU: what ``mhz`` is: "max", "base", "current" (max not exposed) or "" (unknown)
    vendor: str = ""  # CPU: /proc/cpuinfo vendor_id ("AuthenticAMD", "GenuineIntel"); "" when unknown
    cpu_family: int | None = None  # CPU: x86 family (25 = AMD Zen 3/4, 26 = Zen 5, 6 = Intel Core/Xeon)
    cpu_model: int | None = None  # CPU: x86 model number within the family

    @property
    def supports_bf16(self) -> bool:
        """Whether bf16 runs natively: a CUDA GPU from compute capability 8.0 (Ampere) on, and any CPU
        (torch has bf16 CPU kernels, slow without AVX512_BF16/AMX). A T4 (7.5) has none: torch may
        emulate it, much slower than fp16 — which is why this looks at the capability, not at
        ``torch.cuda.is_bf16_supported()``. A GPU of unknown capability: what the datasheet says."""
        if self.kind != "cuda":
            return True
        if self.compute_capability is not None:
            return tuple(self.compute_capability) >= (8, 0)
        spec = find_spec(self.name)
        return spec is None or "bf16" not in spec.unsupported

    @property
    def core_count(self) -> int | None:
        """Physical cores if known, else the logical count: what a FLOP ceiling multiplies by."""
        return self.physical_cores or self.cores

    @property
    def clock_note(self) -> str:
        """Which clock ``mhz`` is, in words: 'max clock', 'base clock', 'current clock; max not exposed'."""
        return _CLOCK_NOTES.get(self.freq_source, self.freq_source)

    def describe(self) -> str:
        if self.kind == "cuda":
            cc = ".".join(map(str, self.compute_capability or ())) or "unknown"
            return (
                f"GPU {self.name} (compute capability {cc}, {self.sm_count} SMs, "
                f"{self.memory_gb:.0f} GB, L2 {self._cache()}, bf16 {'yes' if self.supports_bf16 else 'no'})"
            )
        isa = ", ".join(self.isa) or "no AVX"
        cores = f"{self.physical_cores} physical cores, " if self.physical_cores else ""
        clock = f"{self.mhz:.0f} MHz ({self.clock_note})" if self.mhz else "clock unknown"
        ram = f"{self.memory_gb:.0f} GB RAM" if self.memory_gb else "RAM unknown"
        return (
            f"CPU {self.name}: {cores}{self.cores or 'unknown'} logical cores "
            f"({torch.get_num_threads()} torch threads now), {clock}, LLC {self._cache()}, {ram}; "
            f"ISA: {isa}; torch CPU kernels: {self.torch_cpu_capability or 'unknown'}"
        )

    def _cache(self) -> str:
        return size_text(self.cache_bytes) if self.cache_bytes else "unknown"


def size_text(n: float) -> str:
    """Bytes as GiB, MiB or KiB, for a cache or an array."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _mb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def cache_regime(n_bytes: float, llc: int | None = None, what: str = "", *, l2: int | None = None) -> str:
    """The line a bandwidth or cache claim prints first: where ``n_bytes`` read once per pass (a decode
    step's weights, a STREAM triad's arrays) come from, against the last-level cache ``llc`` (None: this
    machine's; 0: unknown) and an ``l2`` when given. An LRU cache keeps none of a cyclic read larger than
    itself, so at 1x the LLC or more every pass streams from DRAM; at 4x no prefetch or partial reuse helps
    either. Below the LLC a pass may beat the DRAM roof. An LLC is 32 MiB on the course's AMD VM and 300 MiB
    on a Sapphire Rapids one, so the line is computed, never written."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, (int, float)) or not n_bytes >= 0:
        raise ValueError(f"n_bytes must be a number >= 0, got {n_bytes!r}")
    llc = detect_device("cpu").cache_bytes if llc is None else llc
    if llc is not None and (isinstance(llc, bool) or not isinstance(llc, int) or llc < 0):
        raise ValueError(f"llc must be an int of bytes >= 0 (0: unknown) or None (this machine's), got {llc!r}")
    head = f"{what + ': ' if what else ''}{_mb(n_bytes)}"
    if not llc:
        return f"{head}; the last-level cache size is unknown, so where the reads come from is not computed"
    ratio = n_bytes / llc
    base = f"{head} = {ratio:.1f}x" if ratio >= 0.1 else f"{head} = {ratio:.3f}x"
    base += f" this {size_text(llc)} LLC"
    if ratio >= 4:
        return f"{base}: streamed from DRAM on every pass"
    if ratio >= 1:
        return f"{base}: larger than the cache, so most of every pass comes from DRAM (a part may stay cached)"
    if l2 and n_bytes <= l2:
        return f"{base}, within the {size_text(l2)} L2: served from cache, so it can read far faster than DRAM"
    return f"{base}: fits the cache, so after the first pass it can read faster than DRAM"


def _detect_cpu() -> DeviceInfo:
    """Probe the CPU (uncached; ``detect_device`` caches)."""
    return DeviceInfo("cpu", **probe_cpu())


@lru_cache(maxsize=None)
def detect_device(device: str | None = None) -> DeviceInfo:
    """Describe ``device`` (default: CUDA if present, else the CPU). Cached for the process."""
    kind = resolve_kind(device)
    if kind == "cuda":
        props = torch.cuda.get_device_properties(0)
        return DeviceInfo(
            "cuda",
            props.name,
            props.total_memory / 1e9,
            (props.major, props.minor),
            props.multi_processor_count,
            cache_bytes=getattr(props, "L2_cache_size", None) or None,
        )
    return _detect_cpu()


def resolve_kind(device) -> str:
    """``"cuda"`` or ``"cpu"`` for ``device`` (None: CUDA if present); ValueError for anything else,
    or for CUDA on a machine without it."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type if isinstance(device, (str, torch.device)) else None
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cpu', 'cuda' or None, got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA GPU")
    return kind


def preferred_dtype(info: DeviceInfo | None = None) -> str:
    """The dtype the course computes in on this device: ``"bf16"`` on a GPU that has it (compute
    capability >= 8.0), ``"fp16"`` on an older GPU such as Colab's T4 (7.5), and ``"fp32"`` on a CPU —
    bf16 runs there too but is emulated on most CPUs (no AVX512_BF16/AMX), so it is not the fast path."""
    info = info or detect_device()
    if info.kind == "cuda":
        return "bf16" if info.supports_bf16 else "fp16"
    return "fp32"


def spec_for_device(info: DeviceInfo | None = None, *, quiet: bool = False) -> GpuSpec | None:
    """The datasheet entry of the current device, or None (with a printed 'no datasheet entry'
    message unless ``quiet``) for a GPU not in the table or for any CPU."""
    info = info or detect_device()
    spec = find_spec(info.name) if info.kind == "cuda" else None
    if spec is None and not quiet:
        print(f"no datasheet entry for {info.kind.upper()} {info.name!r}: only measured peaks are available")
    return spec
