"""What a CPU's cores can do, and how many of them are free to time with.

``cpu_theoretical_flops`` is the CPU's compute ceiling from its datasheet-like facts (physical cores ×
clock × FLOP per cycle of its vector ISA), the CPU counterpart of a GPU datasheet's peak; ``idle_cores``
and ``timing_threads`` pick how many threads a timing may use on a shared machine, where asking for
busy cores makes every parallel op wait for a descheduled thread. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from course_lib.measure.hardware.cpu_probe import physical_cores
from course_lib.measure.hardware.device import DeviceInfo, detect_device


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
