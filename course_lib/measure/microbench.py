"""This machine's measured peaks: STREAM-like memory bandwidth and matmul FLOP/s per dtype.

The datasheet says what a chip promises; these microbenchmarks say what it delivers here. ``copy`` and
``triad`` stream arrays at least 4× the last-level cache (bandwidth-bound: the answer is DRAM/HBM
bytes/s); an n×n×n matmul is compute-bound (the answer is FLOP/s). A peak is the best rate over the
repeats (STREAM's convention). ``machine_peaks()`` measures once per machine and keeps the result
(``hardware.peaks_cache``), so every chapter uses the same roof; the ratio of the two peaks is the
ridge point. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.core.dtypes import canonical, dtype_bytes, torch_dtype
from course_lib.core.mode import pick
from course_lib.measure.bench import Timing, benchmark
from course_lib.measure.costs import Cost, check_positive_int, copy_cost, matmul_cost, triad_cost
from course_lib.measure.hardware.device import DeviceInfo, detect_device, resolve_kind
from course_lib.measure.hardware.peaks_cache import MeasuredPeaks, cached_peaks, remember_peaks


def matmul_dtypes(device: str | None = None, *, info: DeviceInfo | None = None) -> tuple[str, ...]:
    """The dtypes whose matmul we measure: fp32 and bf16 on CPU; fp16, bf16, fp32 on a GPU, without
    bf16 on one that lacks it (compute capability < 8.0, e.g. a T4). ``info`` describes the device
    instead of detecting it (a simulated T4 in the tests)."""
    kind = info.kind if info is not None else resolve_kind(device)
    if kind != "cuda":
        return ("fp32", "bf16")
    info = info or detect_device("cuda")
    return ("fp16", "bf16", "fp32") if info.supports_bf16 else ("fp16", "fp32")


def available_bytes() -> float:
    """Memory available now (psutil), in bytes; 0.0 where it cannot be read."""
    try:
        import psutil

        return float(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001  (no psutil, or no /proc): unknown
        return 0.0


def _memory_cap(share: float) -> int | None:
    """``share`` of the memory available now, or None where it cannot be read."""
    avail = available_bytes()
    return int(avail * share) if avail else None


def stream_array_bytes(llc: int | None, cap: int | None, llc_multiple: int = 4, floor: int = 64 * 2**20) -> int:
    """One STREAM array: ``llc_multiple`` x the last-level cache (32 MiB assumed where unknown), at least
    ``floor``, and within ``cap`` bytes (an eighth of the available memory; None: no cap) but never below
    16 MiB. STREAM's own rule is 4x; a 300 MiB LLC (a Sapphire Rapids VM) asked for 1.2 GB arrays, a 4 GB
    peak in chapter 00 (Binder has 1-2 GB), hence the cap. The machine profile and ``default_array_bytes``
    both size their arrays here."""
    for name, v in (("llc", llc), ("cap", cap)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{name} must be an int of bytes >= 0 or None (unknown), got {v!r}")
    check_positive_int("llc_multiple", llc_multiple)
    want = max(llc_multiple * (llc or 32 * 2**20), floor)
    return want if cap is None else max(16 * 2**20, min(want, cap))


def default_array_bytes(device: str | None = None) -> int:
    """STREAM array size, so that a pass cannot be served from the last-level cache: in full mode STREAM's
    own rule, each array at least 4x the LLC; in quick mode 1x (a triad's three arrays then span 3x the
    LLC, and a cache keeps none of a cyclic read bigger than itself); ``stream_array_bytes`` sizes it."""
    info = detect_device(resolve_kind(device))
    if info.kind != "cpu":
        return max(pick(1, 4) * (info.cache_bytes or 32 * 2**20), pick(256 * 2**20, 2**30))
    return stream_array_bytes(info.cache_bytes, _memory_cap(1 / 8), pick(1, 4), pick(64 * 2**20, 256 * 2**20))


def working_set_bytes(device: str | None = None) -> int:
    """Bytes a timing that cycles through copies of a weight should read per pass so that no copy is
    still in the last-level cache when its turn comes back: 2x the LLC in quick mode, 4x in full mode,
    at least 128 MiB, and on a CPU at most a quarter of the memory available."""
    info = detect_device(resolve_kind(device))
    want = max(pick(2, 4) * (info.cache_bytes or 32 * 2**20), 128 * 2**20)
    cap = _memory_cap(1 / 4) if info.kind == "cpu" else None
    return want if cap is None else max(64 * 2**20, min(want, cap))


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
    if kind not in ("copy", "triad"):
        raise ValueError(f"kind must be 'copy' or 'triad', got {kind!r}")
    name = canonical(dtype)
    if name not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"dtype must be one of ('fp32', 'fp16', 'bf16') for a bandwidth test, got {dtype!r}")
    dev = resolve_kind(device)
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
    return _time_peak(fn, cost, dev, f"STREAM {kind} {name}", repeats or pick(8, 20), name)


def dram_working_set_bytes() -> int:
    """max(256 MiB, 4 × the LLC): what a CPU benchmark reads per pass so that DRAM, not the cache, serves it
    (``benchmarks/gemv_roof.py``'s default working set)."""
    return max(256 * 2**20, 4 * (detect_device("cpu").cache_bytes or 0))


def dram_triad_gbps(repeats: int = 8, n_bytes: int | None = None) -> float:
    """A CPU's STREAM triad, best of ``repeats``, at torch's current thread count, on arrays of ``n_bytes``
    each (default: half ``dram_working_set_bytes``): the DRAM roof a benchmark records beside its own rates,
    so that a stored GB/s is read against the machine it was measured on."""
    n_bytes = dram_working_set_bytes() // 2 if n_bytes is None else n_bytes
    t = measure_bandwidth("triad", n_bytes=n_bytes, device="cpu", repeats=repeats)
    return t.rate(t.bytes, best=True) / 1e9


def measure_matmul(dtype: str = "fp32", *, n: int | None = None, device: str | None = None, repeats: int | None = None):
    """Time an n×n×n matmul in ``dtype``; 2·n³ FLOPs. Returns a ``bench.Timing`` (``tflops``)."""
    name = canonical(dtype)
    dev = resolve_kind(device)
    if name not in matmul_dtypes(dev) and name != "fp16":
        why = " (this GPU has no native bf16: use hardware.preferred_dtype())" if name == "bf16" else ""
        raise ValueError(f"dtype must be one of {matmul_dtypes(dev)} for a matmul on {dev}{why}, got {dtype!r}")
    n = (pick(1024, 2048) if dev == "cpu" else pick(2048, 8192)) if n is None else check_positive_int("n", n)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(n, n, generator=gen, device=dev).to(torch_dtype(name))
    w = torch.randn(n, n, generator=gen, device=dev).to(torch_dtype(name))
    cost = matmul_cost(n, n, n, name)
    return _time_peak(lambda: x @ w, cost, dev, f"matmul {n}^3 {name}", repeats or pick(10, 20), name)


def _time_peak(fn, cost: Cost, dev: str, label: str, repeats: int, dtype: str) -> Timing:
    """One peak measurement: two warm-ups, and no %-of-peak columns (the peaks are what is measured)."""
    return benchmark(
        fn,
        flops=cost.flops or None,
        bytes=cost.bytes,
        device=dev,
        label=label,
        repeats=repeats,
        warmup=2,
        dtype=dtype,
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
    machine: from this process's cache, else from the peaks file (``hardware.peaks_cache_path()``) if an
    entry has this machine's fingerprint (``hardware.machine_fingerprint()``), else measured now and written there,
    so that every chapter works with the same ridge point. ``refresh=True`` measures again and
    replaces the stored entry. ``.provenance`` says which happened and when."""
    dev = resolve_kind(device)
    known = None if refresh else cached_peaks(dev, disk=True)
    return known if known is not None else remember_peaks(dev, _measure_peaks(dev))


def machine_peaks(device: str | None = None, *, refresh: bool = False) -> MeasuredPeaks:
    """This machine's measured peaks (see ``measured_peaks``), for library code that needs a roof. The
    chapters read the machine profile instead (``course_lib.machine.profile()``: the same peaks with their
    spreads, at 1 and all threads, and the rest of the machine); loading the profile makes its peaks the ones
    this function returns in that process."""
    return measured_peaks(device, refresh=refresh)
