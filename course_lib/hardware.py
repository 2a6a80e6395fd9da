"""What machine are we on, what does its datasheet promise, and what does it really deliver?

Three things live here: device detection (GPU name and memory, or CPU model, cores and vector ISA),
the datasheet table ``data/gpu_specs.json`` with lookup by name or alias, and *measured* peaks of
the current device — STREAM-like memory bandwidth and matmul FLOP/s per dtype — cached for the
session (``reset()`` forgets them). The ratio of the two peaks is the ridge point, Xiao & Zhu's
"hardware arithmetic intensity". Introduced in 00_setup_and_hardware.ipynb.
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

from course_lib.costs import check_positive_int, copy_cost, matmul_cost, triad_cost
from course_lib.dtypes import canonical, dtype_bytes, torch_dtype
from course_lib.mode import pick

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
@dataclass(frozen=True)
class DeviceInfo:
    """The device the course runs on: ``kind`` is ``"cuda"`` or ``"cpu"``."""

    kind: str
    name: str
    memory_gb: float
    compute_capability: tuple[int, int] | None = None  # CUDA only
    sm_count: int | None = None  # CUDA only
    cores: int | None = None  # CPU: logical cores the OS reports
    threads: int | None = None  # CPU: threads torch will use
    isa: tuple[str, ...] = ()  # CPU: flags from ISA_FLAGS present on this machine
    torch_cpu_capability: str = ""  # CPU: what torch's kernels dispatch to (DEFAULT, AVX2, AVX512)
    mhz: float | None = None  # CPU: current clock from /proc/cpuinfo (may differ from boost)
    cache_bytes: int | None = None  # last-level cache (CPU L3, GPU L2)

    def describe(self) -> str:
        if self.kind == "cuda":
            cc = ".".join(map(str, self.compute_capability or ()))
            return (
                f"GPU {self.name} (compute capability {cc}, {self.sm_count} SMs, "
                f"{self.memory_gb:.0f} GB, L2 {self._cache()})"
            )
        isa = ", ".join(self.isa) or "no AVX"
        return (
            f"CPU {self.name}: {self.cores} logical cores ({torch.get_num_threads()} torch threads now), "
            f"{self.mhz or 0:.0f} MHz, LLC {self._cache()}, {self.memory_gb:.0f} GB RAM; ISA: {isa}; "
            f"torch CPU kernels: {self.torch_cpu_capability}"
        )

    def _cache(self) -> str:
        return f"{self.cache_bytes / 2**20:.0f} MiB" if self.cache_bytes else "unknown"


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                key, value = (s.strip() for s in line.split(":", 1))
                info.setdefault(key, value)
    except OSError:
        pass
    return info


def _llc_bytes() -> int | None:
    """Largest cache size in /sys (the L3 on most x86 machines)."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        match = re.fullmatch(r"(\d+)([KMG]?)", path.read_text().strip())
        if match:
            sizes.append(int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)])
    return max(sizes) if sizes else None


def _ram_gb() -> float:
    try:
        import psutil

        return psutil.virtual_memory().total / 1e9
    except Exception:
        return 0.0


@lru_cache(maxsize=None)
def detect_device(device: str | None = None) -> DeviceInfo:
    """Describe ``device`` (default: CUDA if present, else the CPU)."""
    kind = _resolve_kind(device)
    if kind == "cuda":
        props = torch.cuda.get_device_properties(0)
        return DeviceInfo(
            "cuda",
            props.name,
            props.total_memory / 1e9,
            (props.major, props.minor),
            props.multi_processor_count,
            cache_bytes=getattr(props, "L2_cache_size", None),
        )
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    mhz = float(info["cpu MHz"]) if "cpu MHz" in info else None
    return DeviceInfo(
        "cpu",
        info.get("model name", platform.processor() or platform.machine()),
        _ram_gb(),
        cores=os.cpu_count(),
        threads=torch.get_num_threads(),
        isa=tuple(f for f in ISA_FLAGS if f in flags),
        torch_cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
        mhz=mhz,
        cache_bytes=_llc_bytes(),
    )


def _resolve_kind(device) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type if isinstance(device, (str, torch.device)) else None
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cpu', 'cuda' or None, got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA GPU")
    return kind


def cpu_theoretical_flops(info: DeviceInfo | None = None, threads: int | None = None) -> float | None:
    """fp32 FLOP/s a CPU could do if each core in use issued full-width FMAs every cycle at the
    nominal clock: cores · Hz · FLOP/cycle, with 32 FLOP/cycle/core for AVX2+FMA and 64 for AVX-512
    with two FMA units (AMD and Intel optimisation manuals). ``threads`` (default: torch's current thread count,
    at most the cores) is how many cores work. None for a GPU or an unknown clock. Turbo can push a
    real run above it; memory stalls, throttling and other jobs keep it below."""
    info = info or detect_device("cpu")
    if info.kind != "cpu" or not info.mhz or not info.cores:
        return None
    cores = min(info.cores, threads or torch.get_num_threads())
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
    """How many cores sat idle over the last ``interval`` seconds (None where /proc/stat is missing)."""
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
    """Threads to time CPU work with: all cores on an idle machine, only the idle ones on a shared one.
    Asking OpenMP for more threads than there are free cores makes every parallel op wait, at its
    closing barrier, for a thread the OS has descheduled — small ops then run 10x slower."""
    cores = os.cpu_count() or 1
    idle = idle_cores() if idle is None else idle
    if idle is None:
        return torch.get_num_threads()
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

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Datasheet FLOP/s for ``dtype``; ValueError if the chip has no such format."""
        name = canonical(dtype)
        if name not in SPEC_DTYPES:
            raise ValueError(f"dtype must be one of {SPEC_DTYPES} for a GPU spec, got {dtype!r}")
        value = self.tflops.get(name)
        if value is None:
            raise ValueError(
                f"{self.name} has no {name} support (datasheet); "
                f"supported: {[d for d in SPEC_DTYPES if self.tflops.get(d) is not None]}"
            )
        return value * 1e12

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s."""
        return self.hbm_tbps * 1e12

    def ridge(self, dtype: str = "bf16") -> float:
        """Ridge point (FLOP/byte) = peak FLOP/s ÷ bytes/s: Xiao & Zhu's hardware arithmetic intensity."""
        return self.peak_flops(dtype) / self.bandwidth


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
    from course_lib.paths import data_dir

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
    """Peaks measured on this device this session. Bandwidth in GB/s, matmul in TFLOP/s.
    A peak is the best rate over the repeats (STREAM's convention): noise can only slow a run down."""

    device: str
    copy_gbs: float
    triad_gbs: float
    matmul_tflops: dict[str, float]
    array_bytes: int  # bytes of one STREAM array
    matmul_n: int

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


_PEAKS: dict[tuple[str, str, int], MeasuredPeaks] = {}


def reset() -> None:
    """Forget the measured peaks (the next ``measured_peaks()`` measures again)."""
    _PEAKS.clear()


def cached_peaks(device: str | None = None) -> MeasuredPeaks | None:
    """Peaks already measured this session for ``device``, or None — never measures."""
    from course_lib.mode import mode

    return _PEAKS.get((_resolve_kind(device), mode(), torch.get_num_threads()))


def matmul_dtypes(device: str | None = None) -> tuple[str, ...]:
    """The dtypes whose matmul we measure: fp32 and bf16 on CPU; fp16, bf16, fp32 on GPU."""
    return ("fp16", "bf16", "fp32") if _resolve_kind(device) == "cuda" else ("fp32", "bf16")


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
    from course_lib.bench import benchmark

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
    from course_lib.bench import benchmark

    name = canonical(dtype)
    dev = _resolve_kind(device)
    if name not in matmul_dtypes(dev) and name != "fp16":
        raise ValueError(f"dtype must be one of {matmul_dtypes(dev)} for a matmul on {dev}, got {dtype!r}")
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


def measured_peaks(device: str | None = None, *, refresh: bool = False) -> MeasuredPeaks:
    """Measure (once per session and mode; ``refresh=True`` or ``reset()`` to redo) the copy and
    triad bandwidth and the matmul FLOP/s per dtype of ``device``."""
    from course_lib.mode import mode

    dev = _resolve_kind(device)
    key = (dev, mode(), torch.get_num_threads())  # a change of thread count is a different machine
    if refresh or key not in _PEAKS:
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
        _PEAKS[key] = MeasuredPeaks(
            detect_device(dev).name,
            copy.rate(copy.bytes, best=True) / 1e9,
            triad.rate(triad.bytes, best=True) / 1e9,
            tflops,
            n_bytes,
            max(sizes.values()),
        )
    return _PEAKS[key]
