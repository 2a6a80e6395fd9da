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


def cpu_theoretical_flops(
    info: DeviceInfo | None = None, threads: int | None = None, dtype: str = "fp32"
) -> float | None:
    """FLOP/s (fp32 by default; ``dtype="bf16"``: see ``bf16_flop_per_cycle``) a CPU could do if each core in use issued full-width FMAs every cycle:
    cores · Hz · FLOP/cycle (``vector_units``: 32 for AVX2+FMA and for AMD Zen 4's double-pumped AVX-512,
    64 for AVX-512 on two 512-bit FMA units). Cores are *physical* cores (two hyperthreads share one core's
    FMA units); the clock is the max clock where the OS exposes it, else the base, else the current one
    (``info.freq_source`` says which). ``threads`` (default: torch's current thread count, at most the
    physical cores) is how many cores work. None for a GPU or an unknown clock, and for bf16 on a CPU
    without native bf16 instructions. Turbo can push a real run above a base-clock figure; memory stalls,
    throttling and other jobs keep it below."""
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be 'fp32' or 'bf16' for a CPU ceiling, got {dtype!r}")
    info = info or detect_device("cpu")
    if info.kind != "cpu" or not info.mhz or not info.core_count:
        return None
    per_cycle = flop_per_cycle(info) if dtype == "fp32" else bf16_flop_per_cycle(info)[0]
    if per_cycle is None:
        return None
    cores = min(info.core_count, threads or torch.get_num_threads())
    return cores * info.mhz * 1e6 * per_cycle


def bf16_flop_per_cycle(info: DeviceInfo) -> tuple[int | None, str]:
    """(bf16 FLOP per cycle per core, why); None where the CPU has no native bf16 arithmetic.

    bf16 speeds a compute-bound matmul up by doing more FLOPs per instruction, not by halving bytes (a
    large matmul barely touches memory). ``VDPBF16PS`` (AVX512_BF16) multiplies *pairs* of bf16 values in
    each 32-bit lane and adds both products to an fp32 accumulator: 4 FLOPs per lane where an fp32 FMA
    does 2, so twice the fp32 figure of ``vector_units`` on the same pipes (Intel, *Intel 64 and IA-32
    Architectures Software Developer's Manual*, VDPBF16PS; Zen 4 double-pumps it like every 512-bit
    instruction). AMX (``amx_bf16``: Sapphire Rapids and later) adds a tile unit whose ``TDPBF16PS`` does
    1,024 bf16 FLOPs per cycle per core (Intel, *Optimization Reference Manual*, the AMX chapter)."""
    isa = set(info.isa)
    if "amx_bf16" in isa:
        return 1024, "AMX TDPBF16PS: 1,024 bf16 FLOP/cycle per core on the tile unit"
    if "avx512_bf16" in isa:
        fp32 = flop_per_cycle(info)
        return 2 * fp32, f"VDPBF16PS: 2 bf16 products per 32-bit lane, 2 x the fp32 {fp32} FLOP/cycle"
    return None, "no avx512_bf16 / amx_bf16: torch converts bf16 to fp32 and back, no bf16 ceiling"


def flop_per_cycle(info: DeviceInfo) -> int:
    """fp32 FLOP per cycle per core: FMA pipes × fp32 lanes per pipe × 2 (see ``vector_units``)."""
    return vector_units(info)[0]


def vector_units(info: DeviceInfo) -> tuple[int, str]:
    """(fp32 FLOP per cycle per core, why) from the microarchitecture, not the ISA flag alone.

    An AVX-512 flag says which instructions decode, not how wide the datapath is. AMD Zen 4 (family 25
    with AVX-512) executes a 512-bit instruction as two halves on 256-bit pipes ("double pumping"), so its
    two FMA pipes give 2 × 8 lanes × 2 = 32 FLOP/cycle, the same as AVX2 (AMD, *Software Optimization Guide
    for the AMD Zen4 Microarchitecture*, pub. 57647, the floating-point unit section). Intel Xeon Scalable
    parts with two 512-bit FMA units, and AMD Zen 5 (family 26) with full-width 512-bit pipes, give
    2 × 16 × 2 = 64 (Intel, *64 and IA-32 Architectures Optimization Reference Manual*; AMD pub. 58455 for
    Zen 5); Intel parts with one 512-bit FMA unit (some Xeon Silver/Bronze, client chips) reach only 32,
    which no flag tells apart, so 64 is an upper bound there. AVX2 + FMA: 2 × 8 × 2 = 32. Otherwise
    SSE: 2 × 4 lanes = 8 (no FMA)."""
    isa = set(info.isa)
    amd = info.vendor == "AuthenticAMD"
    if "avx512f" in isa:
        if amd and info.cpu_family == 25:
            return 32, "AMD Zen 4: AVX-512 double-pumped on two 256-bit FMA pipes, 2 x 8 lanes x 2"
        if amd and info.cpu_family is not None and info.cpu_family >= 26:
            return 64, "AMD Zen 5: two 512-bit FMA pipes, 2 x 16 lanes x 2"
        return 64, "AVX-512 with two 512-bit FMA units, 2 x 16 lanes x 2 (an upper bound: some parts have one)"
    if {"avx2", "fma"} <= isa:
        return 32, "AVX2 + FMA: two 256-bit FMA pipes, 2 x 8 lanes x 2"
    return 8, "SSE: 4 lanes, no FMA"


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
