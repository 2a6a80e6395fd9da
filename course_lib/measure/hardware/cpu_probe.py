"""Probes of the CPU: model name, logical and physical cores, clock, vector ISA, last-level cache, RAM.

Linux answers through /proc/cpuinfo and /sys, macOS through ``sysctl``, psutil fills the gaps; what no
source exposes is reported as unknown (None), never as a made-up 0. Every probe reads the machine
through one of the small readers below, so tests replace them (monkeypatch) with a hyperthreaded Linux
box, a Mac, or a machine that exposes nothing. ``device.detect_device`` turns the answers into a
``DeviceInfo``. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import torch

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


def probe_cpu() -> dict[str, object]:
    """The CPU's fields of a ``DeviceInfo`` (all but ``kind``), probed through the readers above (uncached;
    ``detect_device`` caches)."""
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
    return dict(
        name=name,
        memory_gb=(ram or 0) / 1e9,
        cores=logical,
        threads=torch.get_num_threads(),
        isa=tuple(f for f in ISA_FLAGS if f in flags),
        torch_cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
        mhz=mhz,
        cache_bytes=_llc_bytes(use_sysctl),
        physical_cores=physical,
        freq_source=source,
        vendor=info.get("vendor_id", ""),
        cpu_family=_to_int(info.get("cpu family")),
        cpu_model=_to_int(info.get("model")),
    )


def physical_cores() -> int:
    """Physical cores of this machine (psutil), else the logical count ``os.cpu_count()``; at least 1.
    Hyperthreads share one core's vector units, so they add no FLOP/s to a matmul."""
    logical, physical = _cpu_counts()
    return max(1, min(physical, logical) if physical and logical else physical or logical or 1)
