"""What machine are we on, what does its datasheet promise, and what does it really deliver?

Three things live here: device detection (GPU name, memory and compute capability, or CPU model,
physical cores, clock and vector ISA), the datasheet table ``data/gpu_specs.json`` with lookup by name
or alias, and *measured* peaks of the current device — STREAM-like memory bandwidth and matmul FLOP/s
per dtype. The peaks are measured once per machine: ``machine_peaks()`` keeps them for the session and
in ``peaks.json`` under ``$COURSE_CACHE_DIR`` (default ``~/.cache/course_lib``), keyed by a machine
fingerprint, so every chapter uses the same numbers (``refresh=True`` measures again). The ratio of the
two peaks is the ridge point, Xiao & Zhu's "hardware arithmetic intensity". Introduced in
00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from course_lib.core.dtypes import canonical, dtype_bytes, torch_dtype
from course_lib.core.mode import pick
from course_lib.measure.costs import check_positive_int, copy_cost, matmul_cost, triad_cost

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
# ISA flags from /proc/cpuinfo that change what a CPU core can do per cycle.
ISA_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


# ----------------------------------------------------------------------------- detection
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
        spec = _find(self.name)
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
        if not self.cache_bytes:
            return "unknown"
        mib = self.cache_bytes / 2**20
        return f"{mib:.0f} MiB" if mib >= 1 else f"{self.cache_bytes / 2**10:.0f} KiB"


# Readers of the machine: every probe goes through one of these, so tests can replace them
# (monkeypatch) with a hyperthreaded Linux box, a Mac, or a machine that exposes nothing.
def _read_text(path: str) -> str | None:
    """Contents of a /proc or /sys file, None where it does not exist (macOS, containers)."""
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _sysctl(name: str) -> str | None:
    """``sysctl -n name`` (macOS/BSD), None where sysctl or the key is absent."""
    import shutil
    import subprocess

    exe = shutil.which("sysctl") or ("/usr/sbin/sysctl" if Path("/usr/sbin/sysctl").exists() else None)
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    value = out.stdout.strip()
    return value if out.returncode == 0 and value else None


def _cpu_counts() -> tuple[int | None, int | None]:
    """(logical, physical) core counts; physical from psutil, None where it cannot tell."""
    logical = os.cpu_count()
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except Exception:
        physical = None
    return logical, physical


def _psutil_max_mhz() -> float | None:
    """psutil's max clock in MHz (0 or missing on most VMs and on Apple silicon), None if unknown."""
    try:
        import psutil

        freq = psutil.cpu_freq()
    except Exception:
        return None
    return float(freq.max) if freq is not None and freq.max and freq.max > 0 else None


def _ram_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total) or None
    except Exception:
        return None


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    for line in (_read_text("/proc/cpuinfo") or "").splitlines():
        if ":" in line:
            key, value = (s.strip() for s in line.split(":", 1))
            info.setdefault(key, value)
    return info


def _to_int(text: str | None) -> int | None:
    try:
        value = int(str(text).strip())
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def _llc_bytes(use_sysctl: bool = False) -> int | None:
    """Largest cache of cpu0 in /sys (the L3 on most x86 machines); on macOS ``hw.l3cachesize``, else the
    performance cores' L2 (Apple silicon exposes no L3). None when nothing says: never a made-up 0."""
    sizes = []
    for i in range(16):
        text = _read_text(f"/sys/devices/system/cpu/cpu0/cache/index{i}/size")
        match = re.fullmatch(r"(\d+)([KMG]?)", (text or "").strip())
        if match:
            sizes.append(int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)])
    if sizes:
        return max(sizes)
    if use_sysctl:
        for key in ("hw.l3cachesize", "hw.perflevel0.l2cachesize", "hw.l2cachesize"):
            value = _to_int(_sysctl(key))
            if value:
                return value
    return None


def _cpu_clock(info: dict[str, str], use_sysctl: bool = False) -> tuple[float | None, str]:
    """(MHz, source) for the FLOP ceiling: the max clock where the OS exposes it (cpufreq, psutil,
    macOS ``hw.cpufrequency_max``), else the base clock (Intel's ``base_frequency``, or the "@ 2.20GHz" of
    the model name), and only then the instantaneous "cpu MHz" of /proc/cpuinfo."""
    cpufreq = "/sys/devices/system/cpu/cpu0/cpufreq"
    khz = _to_int(_read_text(f"{cpufreq}/cpuinfo_max_freq"))
    if khz:
        return khz / 1e3, "max"
    mhz = _psutil_max_mhz()
    if mhz:
        return mhz, "max"
    if use_sysctl:
        hz = _to_int(_sysctl("hw.cpufrequency_max"))
        if hz:
            return hz / 1e6, "max"
    khz = _to_int(_read_text(f"{cpufreq}/base_frequency"))
    if khz:
        return khz / 1e3, "base"
    match = re.search(r"@\s*([\d.]+)\s*GHz", info.get("model name", ""))
    if match:
        return float(match.group(1)) * 1e3, "base"
    try:
        current = float(info["cpu MHz"])
    except (KeyError, ValueError):
        return None, ""
    return (current, "current") if current > 0 else (None, "")


def _cpu_flags(info: dict[str, str], use_sysctl: bool = False) -> set[str]:
    flags = set(info.get("flags", "").lower().split())
    if not flags and use_sysctl:  # Intel Macs: 'FMA AVX1.0 ...' and 'AVX2 AVX512F ...'
        text = " ".join(filter(None, (_sysctl("machdep.cpu.features"), _sysctl("machdep.cpu.leaf7_features"))))
        flags = {f.replace("avx1.0", "avx") for f in text.lower().split()}
    return flags


def _detect_cpu() -> DeviceInfo:
    """Probe the CPU through the readers above (uncached; ``detect_device`` caches)."""
    info = _cpuinfo()
    use_sysctl = not info  # no /proc/cpuinfo: a Mac (or BSD) — ask sysctl, else report unknown
    name = info.get("model name") or (use_sysctl and _sysctl("machdep.cpu.brand_string")) or ""
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    logical, physical = _cpu_counts()
    if physical is None and use_sysctl:
        physical = _to_int(_sysctl("hw.physicalcpu"))
    if physical and logical:
        physical = min(physical, logical)
    mhz, source = _cpu_clock(info, use_sysctl)
    flags = _cpu_flags(info, use_sysctl)
    ram = _ram_bytes() or (_to_int(_sysctl("hw.memsize")) if use_sysctl else None)
    return DeviceInfo(
        "cpu",
        name,
        (ram or 0) / 1e9,
        cores=logical,
        threads=torch.get_num_threads(),
        isa=tuple(f for f in ISA_FLAGS if f in flags),
        torch_cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
        mhz=mhz,
        cache_bytes=_llc_bytes(use_sysctl),
        physical_cores=physical,
        freq_source=source,
    )


@lru_cache(maxsize=None)
def detect_device(device: str | None = None) -> DeviceInfo:
    """Describe ``device`` (default: CUDA if present, else the CPU). Cached for the process."""
    kind = _resolve_kind(device)
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


def _resolve_kind(device) -> str:
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


def physical_cores() -> int:
    """Physical cores of this machine (psutil), else the logical count ``os.cpu_count()``; at least 1.
    Hyperthreads share one core's vector units, so they add no FLOP/s to a matmul."""
    logical, physical = _cpu_counts()
    return max(1, min(physical, logical) if physical and logical else physical or logical or 1)


def cpu_theoretical_flops(info: DeviceInfo | None = None, threads: int | None = None) -> float | None:
    """fp32 FLOP/s a CPU could do if each core in use issued full-width FMAs every cycle:
    cores · Hz · FLOP/cycle, with 32 FLOP/cycle/core for AVX2+FMA and 64 for AVX-512 with two FMA units
    (AMD and Intel optimisation manuals). Cores are *physical* cores (two hyperthreads share one core's
    FMA units); the clock is the max clock where the OS exposes it, else the base, else the current one
    (``info.freq_source`` says which). ``threads`` (default: torch's current thread count, at most the
    physical cores) is how many cores work. None for a GPU or an unknown clock. Turbo can push a real
    run above a base-clock figure; memory stalls, throttling and other jobs keep it below."""
    info = info or detect_device("cpu")
    if info.kind != "cpu" or not info.mhz or not info.core_count:
        return None
    cores = min(info.core_count, threads or torch.get_num_threads())
    return cores * info.mhz * 1e6 * flop_per_cycle(info)


def flop_per_cycle(info: DeviceInfo) -> int:
    """fp32 FLOP per cycle per core from the ISA flags (AMD and Intel optimisation manuals): 64 AVX-512, 32 AVX2+FMA, else 8 (SSE)."""
    return 64 if "avx512f" in info.isa else 32 if {"avx2", "fma"} <= set(info.isa) else 8


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs from /proc/stat, or None where it does not exist."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return idle, sum(fields[:8])


def idle_cores(interval: float = 0.25) -> float | None:
    """How many logical cores sat idle over the last ``interval`` seconds (None where /proc/stat is missing)."""
    import time

    if not interval > 0:
        raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
    before = _cpu_times()
    time.sleep(interval)
    after = _cpu_times()
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)


def timing_threads(idle: float | None = None) -> int:
    """Threads to time CPU work with: all physical cores on an idle machine, only the idle ones on a
    shared one. Hyperthreads are not counted: two threads on one core share its FMA units and only
    fight for them. Asking OpenMP for more threads than there are free cores makes every parallel op
    wait, at its closing barrier, for a thread the OS has descheduled — small ops then run 10x slower."""
    cores = physical_cores()
    idle = idle_cores() if idle is None else idle
    if idle is None:
        return max(1, min(cores, torch.get_num_threads()))
    return max(1, min(cores, int(idle + 0.5)))


# ----------------------------------------------------------------------------- datasheet table
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


def _find(name: str) -> GpuSpec | None:
    key = _normalise(name)
    for spec in gpu_specs().values():
        if key in {_normalise(n) for n in (spec.name, *spec.aliases)}:
            return spec
    return None


def gpu_spec(name: str) -> GpuSpec:
    """Look a GPU up by name or alias ('NVIDIA H100 80GB HBM3' -> 'H100 SXM'); ValueError if unknown."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"gpu name must be a non-empty string such as 'H100 SXM', got {name!r}")
    spec = _find(name)
    if spec is None:
        raise ValueError(
            f"unknown GPU name {name!r}; valid names: {list(gpu_names())} "
            "(NVIDIA's device names such as 'NVIDIA H100 80GB HBM3' also work)"
        )
    return spec


def spec_for_device(info: DeviceInfo | None = None, *, quiet: bool = False) -> GpuSpec | None:
    """The datasheet entry of the current device, or None (with a printed 'no datasheet entry'
    message unless ``quiet``) for a GPU not in the table or for any CPU."""
    info = info or detect_device()
    spec = _find(info.name) if info.kind == "cuda" else None
    if spec is None and not quiet:
        print(f"no datasheet entry for {info.kind.upper()} {info.name!r}: only measured peaks are available")
    return spec


# ----------------------------------------------------------------------------- measured peaks
@dataclass(frozen=True)
class MeasuredPeaks:
    """Peaks measured on this device. Bandwidth in GB/s, matmul in TFLOP/s.
    A peak is the best rate over the repeats (STREAM's convention): noise can only slow a run down.
    ``measured_at`` (local ISO time, "" when built by hand) and ``from_cache`` (read back from the
    peaks file rather than measured by this process) say where the numbers come from."""

    device: str
    copy_gbs: float
    triad_gbs: float
    matmul_tflops: dict[str, float]
    array_bytes: int  # bytes of one STREAM array
    matmul_n: int
    measured_at: str = ""
    from_cache: bool = False

    @property
    def bandwidth(self) -> float:
        """Best measured bandwidth in bytes/s (the roof's slope)."""
        return max(self.copy_gbs, self.triad_gbs) * 1e9

    def peak_flops(self, dtype: str | None = None) -> float:
        """Measured matmul FLOP/s for ``dtype`` (default: the fastest dtype measured)."""
        if dtype is None:
            return max(self.matmul_tflops.values()) * 1e12
        name = canonical(dtype)
        if name not in self.matmul_tflops:
            raise ValueError(f"dtype {name!r} was not measured on {self.device}; measured: {list(self.matmul_tflops)}")
        return self.matmul_tflops[name] * 1e12

    def ridge(self, dtype: str | None = None) -> float:
        """Measured ridge point in FLOP/byte."""
        return self.peak_flops(dtype) / self.bandwidth

    @property
    def measured_on(self) -> str:
        """``measured_at`` as 'YYYY-MM-DD HH:MM' (local time of the measurement), '' if unknown."""
        return self.measured_at[:16].replace("T", " ")

    @property
    def provenance(self) -> str:
        """One line for a notebook: when the peaks were measured and whether they came from the cache."""
        if not self.measured_at:
            return "peaks given by hand (not measured)"
        if self.from_cache:
            return f"peaks measured on {self.measured_on} (cached; pass refresh=True to re-measure)"
        return f"peaks measured on {self.measured_on} (just now; later chapters reuse them)"


_CACHE_VERSION = 1  # bump when the measurement itself changes: older entries are then re-measured
_PEAKS: dict[str, MeasuredPeaks] = {}  # in-process, by fingerprint key
_DISK_WARNED: list[bool] = []


def peaks_cache_path() -> Path:
    """Where measured peaks are kept across chapters: ``$COURSE_CACHE_DIR/peaks.json`` (else
    ``$COURSE_CACHE``, the corpus cache's variable, else ``~/.cache/course_lib``)."""
    root = os.environ.get("COURSE_CACHE_DIR") or os.environ.get("COURSE_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "course_lib"
    return base / "peaks.json"


def machine_fingerprint(device: str | None = None) -> dict[str, object]:
    """What must match for stored peaks to be reused: the device (CPU model and physical cores, or GPU
    name and compute capability), torch's thread count on a CPU (a change of thread count is a different
    machine), the torch version and the course mode (it sets the sizes measured)."""
    from course_lib.core.mode import mode

    kind = _resolve_kind(device)
    info = detect_device(kind)
    fp: dict[str, object] = {"version": _CACHE_VERSION, "kind": kind, "device": info.name}
    if kind == "cpu":
        fp.update(physical_cores=info.core_count, threads=torch.get_num_threads())
    else:
        fp.update(compute_capability=".".join(map(str, info.compute_capability or ())), sm_count=info.sm_count)
    fp.update(torch=torch.__version__, mode=mode())
    return fp


def _fingerprint_key(fp: dict[str, object]) -> str:
    return "|".join(f"{k}={v}" for k, v in fp.items())


def _warn_disk_once(message: str) -> None:
    if not _DISK_WARNED:
        import warnings

        _DISK_WARNED.append(True)
        warnings.warn(f"{message}; peaks are kept for this session only", RuntimeWarning, stacklevel=3)


def _read_cache_file() -> dict:
    """The peaks file's ``entries``; {} when it is missing, unreadable or corrupted (never raises)."""
    try:
        raw = json.loads(peaks_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    entries = raw.get("entries") if isinstance(raw, dict) else None
    return entries if isinstance(entries, dict) else {}


def _peaks_from_entry(entry) -> MeasuredPeaks | None:
    import math

    try:
        tflops = {canonical(k): float(v) for k, v in entry["matmul_tflops"].items()}
        peaks = MeasuredPeaks(
            str(entry["device"]),
            float(entry["copy_gbs"]),
            float(entry["triad_gbs"]),
            tflops,
            int(entry["array_bytes"]),
            int(entry["matmul_n"]),
            str(entry["measured_at"]),
            from_cache=True,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    rates = (peaks.copy_gbs, peaks.triad_gbs, *tflops.values())
    if not tflops or not all(math.isfinite(r) and r > 0 for r in rates):
        return None
    return peaks


def _load_peaks(key: str) -> MeasuredPeaks | None:
    return _peaks_from_entry(_read_cache_file().get(key))


def _save_peaks(key: str, fp: dict[str, object], peaks: MeasuredPeaks) -> bool:
    """Add this machine's entry to the peaks file (atomically); False, with one warning, if unwritable."""
    path = peaks_cache_path()
    entries = _read_cache_file()  # a corrupted file is replaced
    entries[key] = {
        "fingerprint": fp,
        "measured_at": peaks.measured_at,
        "device": peaks.device,
        "copy_gbs": peaks.copy_gbs,
        "triad_gbs": peaks.triad_gbs,
        "matmul_tflops": peaks.matmul_tflops,
        "array_bytes": peaks.array_bytes,
        "matmul_n": peaks.matmul_n,
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"version": _CACHE_VERSION, "entries": entries}, indent=1))
        os.replace(tmp, path)
    except OSError as err:
        try:
            tmp.unlink()
        except OSError:
            pass
        _warn_disk_once(f"cannot write the peaks cache {path} ({err.strerror or err})")
        return False
    return True


def reset(disk: bool = False) -> None:
    """Forget the peaks measured in this process; the next ``machine_peaks()`` reads the peaks file
    again (so it does not re-measure). ``disk=True`` also deletes the peaks file, so the next call
    measures. To re-measure once without forgetting anything: ``machine_peaks(refresh=True)``."""
    _PEAKS.clear()
    if disk:
        try:
            peaks_cache_path().unlink()
        except FileNotFoundError:
            pass
        except OSError as err:
            _warn_disk_once(f"cannot delete the peaks cache {peaks_cache_path()} ({err.strerror or err})")


def cached_peaks(device: str | None = None, *, disk: bool = False) -> MeasuredPeaks | None:
    """Peaks already known for ``device``, or None — never measures. By default only those this process
    measured or loaded (what ``bench.benchmark`` compares with); ``disk=True`` also looks in the peaks file."""
    key = _fingerprint_key(machine_fingerprint(device))
    if key not in _PEAKS and disk:
        loaded = _load_peaks(key)
        if loaded is not None:
            _PEAKS[key] = loaded
    return _PEAKS.get(key)


def matmul_dtypes(device: str | None = None, *, info: DeviceInfo | None = None) -> tuple[str, ...]:
    """The dtypes whose matmul we measure: fp32 and bf16 on CPU; fp16, bf16, fp32 on a GPU, without
    bf16 on one that lacks it (compute capability < 8.0, e.g. a T4). ``info`` describes the device
    instead of detecting it (a simulated T4 in the tests)."""
    kind = info.kind if info is not None else _resolve_kind(device)
    if kind != "cuda":
        return ("fp32", "bf16")
    info = info or detect_device("cuda")
    return ("fp16", "bf16", "fp32") if info.supports_bf16 else ("fp16", "fp32")


def default_array_bytes(device: str | None = None) -> int:
    """STREAM array size: at least 4x the last-level cache so every pass goes to DRAM/HBM."""
    info = detect_device(_resolve_kind(device))
    llc = info.cache_bytes or 32 * 2**20
    floor = pick(64 * 2**20, 256 * 2**20) if info.kind == "cpu" else pick(256 * 2**20, 2**30)
    return max(4 * llc, floor)


def measure_bandwidth(
    kind: str = "triad",
    *,
    n_bytes: int | None = None,
    dtype: str = "fp32",
    device: str | None = None,
    repeats: int | None = None,
):
    """Time a STREAM-like ``copy`` (b = a) or ``triad`` (a = b + s·c) over arrays of ``n_bytes``
    each; bytes counted as reads + writes. Returns a ``bench.Timing`` whose ``gbps`` is the answer."""
    from course_lib.measure.bench import benchmark

    if kind not in ("copy", "triad"):
        raise ValueError(f"kind must be 'copy' or 'triad', got {kind!r}")
    name = canonical(dtype)
    if name not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"dtype must be one of ('fp32', 'fp16', 'bf16') for a bandwidth test, got {dtype!r}")
    dev = _resolve_kind(device)
    n_bytes = default_array_bytes(dev) if n_bytes is None else check_positive_int("n_bytes", n_bytes)
    n = max(1, int(n_bytes // dtype_bytes(name)))
    tdt = torch_dtype(name)
    # Filled, not just allocated, so the pages exist before the clock starts.
    a = torch.full((n,), 1.0, dtype=tdt, device=dev)
    b = torch.full((n,), 2.0, dtype=tdt, device=dev)
    if kind == "copy":
        cost = copy_cost(n, name)
        fn = lambda: b.copy_(a)  # noqa: E731  reads a, writes b
    else:
        c = torch.full((n,), 0.5, dtype=tdt, device=dev)
        cost = triad_cost(n, name)
        fn = lambda: torch.add(b, c, alpha=3.0, out=a)  # noqa: E731  reads b, c; writes a
    return benchmark(
        fn,
        flops=cost.flops or None,
        bytes=cost.bytes,
        device=dev,
        label=f"STREAM {kind} {name}",
        repeats=repeats or pick(8, 20),
        warmup=2,
        dtype=name,
        peaks=False,
    )


def measure_matmul(dtype: str = "fp32", *, n: int | None = None, device: str | None = None, repeats: int | None = None):
    """Time an n×n×n matmul in ``dtype``; 2·n³ FLOPs. Returns a ``bench.Timing`` (``tflops``)."""
    from course_lib.measure.bench import benchmark

    name = canonical(dtype)
    dev = _resolve_kind(device)
    if name not in matmul_dtypes(dev) and name != "fp16":
        why = " (this GPU has no native bf16: use hardware.preferred_dtype())" if name == "bf16" else ""
        raise ValueError(f"dtype must be one of {matmul_dtypes(dev)} for a matmul on {dev}{why}, got {dtype!r}")
    n = (pick(1024, 2048) if dev == "cpu" else pick(2048, 8192)) if n is None else check_positive_int("n", n)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(n, n, generator=gen, device=dev).to(torch_dtype(name))
    w = torch.randn(n, n, generator=gen, device=dev).to(torch_dtype(name))
    cost = matmul_cost(n, n, n, name)
    return benchmark(
        lambda: x @ w,
        flops=cost.flops,
        bytes=cost.bytes,
        device=dev,
        label=f"matmul {n}^3 {name}",
        repeats=repeats or pick(10, 20),
        warmup=2,
        dtype=name,
        peaks=False,
    )


def _measure_peaks(dev: str) -> MeasuredPeaks:
    """Run STREAM copy and triad and one matmul per dtype of ``matmul_dtypes(dev)``."""
    from datetime import datetime

    n_bytes = default_array_bytes(dev)
    copy = measure_bandwidth("copy", n_bytes=n_bytes, device=dev)
    triad = measure_bandwidth("triad", n_bytes=n_bytes, device=dev)
    sizes = {}
    tflops = {}
    for dt in matmul_dtypes(dev):
        # bf16 on a CPU without native bf16 FMA is ~10x slower: a smaller size keeps quick mode quick.
        slow = dev == "cpu" and dt != "fp32" and "avx512_bf16" not in detect_device("cpu").isa
        n = (pick(256, 1024) if slow else pick(1024, 2048)) if dev == "cpu" else pick(2048, 8192)
        t = measure_matmul(dt, n=n, device=dev)
        sizes[dt] = n
        tflops[dt] = t.rate(t.flops, best=True) / 1e12  # best of the repeats, as STREAM reports
    return MeasuredPeaks(
        detect_device(dev).name,
        copy.rate(copy.bytes, best=True) / 1e9,
        triad.rate(triad.bytes, best=True) / 1e9,
        tflops,
        n_bytes,
        max(sizes.values()),
        datetime.now().astimezone().isoformat(timespec="seconds"),
    )


def measured_peaks(device: str | None = None, *, refresh: bool = False) -> MeasuredPeaks:
    """The copy and triad bandwidth and the matmul FLOP/s per dtype of ``device``, measured once per
    machine: from this process's cache, else from the peaks file (``peaks_cache_path()``) if an entry
    has this machine's fingerprint (``machine_fingerprint()``), else measured now and written there,
    so that every chapter works with the same ridge point. ``refresh=True`` measures again and
    replaces the stored entry. ``.provenance`` says which happened and when."""
    dev = _resolve_kind(device)
    fp = machine_fingerprint(dev)
    key = _fingerprint_key(fp)
    if not refresh:
        if key in _PEAKS:
            return _PEAKS[key]
        loaded = _load_peaks(key)
        if loaded is not None:
            _PEAKS[key] = loaded
            return loaded
    peaks = _measure_peaks(dev)
    _PEAKS[key] = peaks
    _save_peaks(key, fp, peaks)
    return peaks


def machine_peaks(device: str | None = None, *, refresh: bool = False) -> MeasuredPeaks:
    """This machine's measured peaks, measured once and shared by every chapter (see ``measured_peaks``):
    ``peaks = hardware.machine_peaks(); print(peaks.provenance)``."""
    return measured_peaks(device, refresh=refresh)
