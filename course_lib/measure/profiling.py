"""Chapter 02's profiling helpers: where a decode step's time goes, and how busy the hardware looked.

A decode step is bandwidth-bound (``course_lib.bottlenecks.time_floors.decode_time``) — and, for a model as small
as ours, sits on a floor the roofline does not see: every one of the few hundred torch ops in a step
pays a fixed dispatch cost (``count_ops``, ``per_op_overhead_s``). ``time_matmuls`` times the step's
matmuls alone (with ``course_lib.measure.bench.benchmark``), and ``cpu_busy`` / ``gpu_utilization_reader`` /
``sample_while`` show what "utilization" measures — and what it does not. Introduced in 02_metrics_1_latency.ipynb
(``op_size_sweep``: 01_bottlenecks_1_roofline_overhead.ipynb).
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from course_lib.measure.costs import check_positive_int


# ----------------------------------------------------------------------------- the per-op floor
def count_ops(fn: Callable[[], object]) -> int:
    """How many aten ops ``fn()`` dispatches (each pays a fixed CPU cost, however small its tensors)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Counter(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            _Counter.n += 1
            return func(*args, **(kwargs or {}))

    with torch.inference_mode(), _Counter():
        fn()
    return _Counter.n


def per_op_overhead_s(device: str | torch.device = "cpu", n: int = 2000) -> float:
    """Seconds per tiny op (a one-element add) issued back to back: the fixed cost of dispatching
    (and on a GPU, launching) one op. Median of 5 loops of ``n`` ops, synchronised at both ends."""
    check_positive_int("n", n)
    dev = torch.device(device)
    x = torch.ones(1, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    samples = []
    with torch.inference_mode():
        for _ in range(6):
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                torch.add(x, 1.0)
            sync()
            samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples[1:])  # the first loop is a warm-up


def op_size_sweep(sizes, *, device: str | torch.device = "cpu", dtype: str = "fp32", repeats: int = 20) -> list:
    """Time one elementwise op (``c = a + b``) for each element count in ``sizes``; returns
    ``[bench.Timing]`` with 3·n·bytes counted. Small ops sit on a flat floor (dispatch:
    *overhead-bound*), large ones on a slope (bytes / bandwidth): the third regime, beside compute- and
    bandwidth-bound (Horace He, *Making Deep Learning Go Brrrr From First Principles*). Introduced in
    01_bottlenecks_1_roofline_overhead.ipynb."""
    from course_lib.core.dtypes import canonical, dtype_bytes, torch_dtype
    from course_lib.measure.bench import benchmark

    sizes = [check_positive_int("sizes", n) for n in sizes]
    if not sizes:
        raise ValueError("sizes must hold at least one element count")
    check_positive_int("repeats", repeats)
    name = canonical(dtype)
    dev = torch.device(device)
    out = []
    for n in sizes:
        a = torch.full((n,), 1.0, dtype=torch_dtype(name), device=dev)
        b, c = a.clone(), torch.empty_like(a)
        # enough back-to-back calls per sample that the clock's resolution does not matter
        inner = max(1, min(1000, int(2e6 // (3 * n * dtype_bytes(name)))))

        def run(a=a, b=b, c=c, inner=inner):
            for _ in range(inner):
                torch.add(a, b, out=c)  # reads a and b, writes c

        t = benchmark(
            run,
            bytes=3 * n * dtype_bytes(name) * inner,
            device=dev.type,
            label=f"add n={n:,}",
            repeats=repeats,
            warmup=2,
            dtype=name,
            peaks=False,
        )
        # one call's timing: samples and bytes divided by the calls per sample
        out.append(dataclasses.replace(t, samples_s=tuple(x / inner for x in t.samples_s), bytes=t.bytes / inner))
    return out


def matmul_weights(engine) -> list[torch.Tensor]:
    """Every weight matrix a decode step multiplies by: the ``.weight`` of each linear layer that
    ``engine.model.linears()`` yields, in order (q/k/v, o and the MLP of each layer, fused or not,
    whatever the engine's layout), the LM head last. Norm vectors and biases are left out."""
    return [lin.weight for _, lin in engine.model.linears()]  # each (out_features, in_features); the LM head (V, D)


def time_matmuls(engine, batch: int = 1, repeats: int | None = None):
    """Time only the matmuls of one decode step — ``batch`` rows through every linear layer of
    ``engine.model.linears()``, one ``lin(x)`` call each — with ``bench.benchmark``; bytes = the weights
    read once. Compared with the whole step, it splits TPOT into "streaming the weights" and "everything else"."""
    from course_lib.measure.bench import benchmark

    check_positive_int("batch", batch)
    lins = [lin for _, lin in engine.model.linears()]
    mats = [lin.weight for lin in lins]  # each (out_features, in_features)
    gen = torch.Generator(device=engine.device).manual_seed(0)
    xs = [torch.randn(batch, m.shape[1], generator=gen, device=engine.device).to(m.dtype) for m in mats]  # (B, in)

    def run() -> None:
        for x, lin in zip(xs, lins):
            lin(x)  # (B, out)

    flops = sum(2.0 * batch * m.numel() for m in mats)
    moved = sum(m.numel() * m.element_size() for m in mats)
    with torch.inference_mode():
        return benchmark(
            run,
            flops=flops,
            bytes=moved,
            device=engine.device.type,
            repeats=repeats,
            label=f"{len(mats)} decode matmuls, batch {batch}",
        )


# ----------------------------------------------------------------------------- "utilization"
@dataclass(frozen=True)
class Busy:
    """How busy the CPU looked while ``fn`` ran: CPU seconds of this process ÷ (wall × threads)."""

    wall_s: float
    cpu_s: float
    threads: int
    result: object = None

    @property
    def fraction(self) -> float:
        return self.cpu_s / (self.wall_s * self.threads)


def cpu_busy(fn: Callable[[], object], threads: int | None = None) -> Busy:
    """Run ``fn()`` once; ``time.process_time`` sums the CPU time of all this process's threads."""
    threads = threads or torch.get_num_threads()
    check_positive_int("threads", threads)
    c0, t0 = time.process_time(), time.perf_counter()
    result = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Busy(wall, cpu, threads, result)


def gpu_utilization_reader(index: int = 0) -> tuple[Callable[[], float] | None, str]:
    """(read, source): ``read()`` returns NVML's "GPU utilization" in percent — the share of the last
    sample period in which *any* kernel ran, what ``nvidia-smi`` shows — via pynvml, else by calling
    ``nvidia-smi``; (None, reason) where neither exists."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return (lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)), "pynvml"
    except Exception:  # not installed, or no driver
        pass
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "no NVML: neither pynvml nor nvidia-smi is available on this machine"

    def read() -> float:
        out = subprocess.run(
            [exe, f"--id={index}", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return float(out.stdout.strip().splitlines()[0])

    try:
        read()
    except Exception as exc:  # nvidia-smi present but no GPU/driver
        return None, f"nvidia-smi failed: {exc}"
    return read, "nvidia-smi"


def sample_while(
    fn: Callable[[], object], read: Callable[[], float], *, min_seconds: float = 1.0, interval_s: float = 0.05
) -> tuple[list[float], float, int]:
    """Call ``fn()`` repeatedly for at least ``min_seconds`` while a thread calls ``read()`` every
    ``interval_s``; returns (readings, wall seconds, calls of fn)."""
    if not min_seconds > 0 or not interval_s > 0:
        raise ValueError("min_seconds and interval_s must be > 0")
    readings: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                readings.append(read())
            except Exception:
                pass
            stop.wait(interval_s)

    thread = threading.Thread(target=poll, daemon=True)
    t0 = time.perf_counter()
    thread.start()
    calls = 0
    try:
        while calls == 0 or time.perf_counter() - t0 < min_seconds:
            fn()
            calls += 1
    finally:
        stop.set()
        thread.join()
    return readings, time.perf_counter() - t0, calls


__all__ = [
    "Busy",
    "count_ops",
    "cpu_busy",
    "gpu_utilization_reader",
    "matmul_weights",
    "per_op_overhead_s",
    "sample_while",
    "time_matmuls",
]
