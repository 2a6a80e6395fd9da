"""Measure collectives between local processes: gloo all-reduce, all-gather and reduce-scatter by message size.

``measure_collectives`` launches ``world_size`` workers (``course_lib.parallel.launcher.launch``, one thread
each) and times each op over ``DEFAULT_SIZES``, from one float to 64 MiB, reporting a low quantile of many
runs of the slowest rank (``CollectiveTiming``). Between processes on one machine the "link" is memory
copies, so a large message is bound by memory bandwidth and a small one by latency (the software of a
message, and two processes waking up together). Each call also counts its minor page faults: gloo's
all-gather and reduce-scatter allocate a temporary of the message's size on every call, and glibc serves
blocks above its mmap threshold (at most 32 MiB on 64-bit Linux) with fresh pages from the kernel, one page
fault per 4 KiB page; ``CollectiveTiming.fresh_page_share`` says whether a call wrote into such fresh
memory, which is where the α–β fit (``course_lib.parallel.alpha_beta``) finds its knee.
Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import math
import mmap
import statistics
from dataclasses import dataclass

OPS = ("all_reduce", "all_gather", "reduce_scatter")
#: Message sizes from one float to 64 MiB: ×16 apart up to 16 MiB, then closer, where a CPU's "link" changes
#: regime (gloo's all-gather and reduce-scatter get fresh pages for their 32 MiB-and-up buffers every call).
DEFAULT_SIZES = (
    4,
    64,
    1024,
    16 * 1024,
    256 * 1024,
    4 * 2**20,
    16 * 2**20,
    24 * 2**20,
    32 * 2**20,
    48 * 2**20,
    64 * 2**20,
)
#: Bytes per page of memory: a freshly mapped buffer takes one page fault per page on first touch.
PAGE_BYTES = mmap.PAGESIZE


@dataclass(frozen=True)
class CollectiveTiming:
    """One measured collective: seconds of the slowest rank (a low quantile over repeats), and the minor page
    faults one call took (median over repeats, most faulting rank; None where the OS does not count them)."""

    op: str
    p: int
    nbytes: int  # all-reduce / reduce-scatter: the input vector; all-gather: the gathered output
    seconds: float
    page_faults: float | None = None

    @property
    def fresh_page_share(self) -> float | None:
        """Page faults × page size / nbytes: ~1 when every call wrote into a freshly mapped buffer of its size."""
        return None if self.page_faults is None else self.page_faults * PAGE_BYTES / self.nbytes


def _minor_faults() -> int | None:
    """Minor page faults of this process so far (all its threads: gloo runs collectives on its own)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _measure_worker(rank, world_size, ops, sizes, repeats, warmup, min_time_s=0.0, max_repeats=200, quantile=0.25):
    """Inside a launched worker: time each op and size; every rank returns the same rows.

    After the warm-up the ranks agree on a number of runs per (op, size), more for fast ones (they must run
    the same collectives in the same order, or wait for each other forever), then run them in ``repeats``
    rounds, each round a share of every (op, size): a burst of another program's work then lands on all
    sizes alike instead of on whichever one was being timed, and the low quantile filters it out."""
    import math
    import statistics
    import time
    import warnings

    import torch
    import torch.distributed as dist

    from course_lib.parallel.launcher import worker_device

    dev = worker_device()  # cuda:<rank> under NCCL, else the CPU
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    p = world_size
    buffers = {}
    for size in sizes:
        n = max(p, -(-size // 4 // p) * p)  # fp32 elements, a multiple of p so it splits evenly
        buffers[size] = (torch.ones(n, device=dev), torch.empty(n // p, device=dev))  # full (n,), part (n / p,)
    cases = [(op, size) for op in ops for size in sizes]

    def timed(op, size):
        full, part = buffers[size]
        dist.barrier()  # start together: a collective waits for its last rank
        sync()
        f0 = _minor_faults()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the *_tensor names are deprecated
            if op == "all_reduce":
                dist.all_reduce(full)
            elif op == "all_gather":
                all_gather(full, part)
            else:
                reduce_scatter(part, full)
        sync()  # a GPU collective was only launched
        dt = time.perf_counter() - t0
        f1 = _minor_faults()
        return dt, (None if f0 is None else f1 - f0)

    # the fastest warm-up run of each case (a slow one may have waited a scheduler tick), the same on both ranks
    fastest = torch.tensor([min([timed(*c)[0] for _ in range(warmup)], default=0.0) for c in cases], device=dev)
    dist.all_reduce(fastest, op=dist.ReduceOp.MAX)  # (cases,)
    per_round = {}
    for c, t_run in zip(cases, fastest.tolist()):
        count = repeats
        if t_run > 0 and min_time_s > 0:
            count = min(max(repeats, math.ceil(min_time_s / t_run)), max_repeats)
        per_round[c] = math.ceil(count / repeats)
    runs = {c: [] for c in cases}
    for r in range(repeats):
        for c in cases if r % 2 == 0 else cases[::-1]:  # alternate, so no case always follows the same one
            runs[c].extend(timed(*c) for _ in range(per_round[c]))
    rows = []
    for op, size in cases:
        times = [dt for dt, _ in runs[(op, size)]]
        faults = [f for _, f in runs[(op, size)] if f is not None]
        stats = torch.tensor([times + [statistics.median(faults) if faults else -1.0]], dtype=torch.float64, device=dev)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # per run the slowest rank; the most faulting rank
        stats = stats.cpu()
        typical = float(torch.quantile(stats[0, :-1], quantile))  # a low quantile: see measure_collectives
        rows.append((op, p, buffers[size][0].numel() * 4, typical, None if stats[0, -1] < 0 else float(stats[0, -1])))
    return rows


def measure_collectives(
    world_size: int = 2,
    sizes=DEFAULT_SIZES,
    ops=OPS,
    *,
    repeats: int = 5,
    warmup: int = 2,
    min_time_s: float = 0.05,
    max_repeats: int = 200,
    quantile: float = 0.25,
    launches: int = 1,
    timeout_s: float = 300.0,
    backend: str = "gloo",
) -> list[CollectiveTiming]:
    """Time gloo ``ops`` over ``sizes`` (bytes, rounded to whole fp32 elements, a multiple of
    ``world_size``) between ``world_size`` local processes, one thread each; with the page faults per call.

    Each run starts after a barrier and counts its slowest rank. After ``warmup`` runs come at least
    ``repeats`` runs, more (up to ``max_repeats``) until they add up to about ``min_time_s``, and the time
    reported is their lower quartile (``quantile``; 0 is the best run). Not the best run: on a small shared
    machine a 300 µs collective has a fast tail of lucky runs (both ranks awake at once) that differs 1.5×
    from one launch to the next, and a slow tail of runs that waited a scheduler tick (~4 ms); the lower
    quartile of ~100 runs repeats within ~10%. What a launch cannot average away is the launch itself: which
    cores the two workers land on and how their wake-ups line up shift a small message's latency by ±20%
    for the whole launch. ``launches`` > 1 starts the workers that many times and reports, per op and size,
    the median over launches (of the time and of the page faults).

    ``backend``: "gloo" (processes on this machine), "nccl" (one GPU per rank: what a learner with two or
    more GPUs measures their own NVLink or PCIe with; ``launch`` refuses it with fewer GPUs than ranks) or
    "auto" (NCCL when there is a GPU per rank, else gloo)."""
    from course_lib.parallel.launcher import default_backend, launch

    if backend not in ("gloo", "nccl", "auto"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or 'auto', got {backend!r}")
    backend = default_backend(world_size) if backend == "auto" else backend

    sizes = tuple(sizes)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes):
        raise ValueError(f"sizes must be a non-empty sequence of positive ints (bytes), got {sizes!r}")
    ops = tuple(ops)
    if not ops or any(op not in OPS for op in ops):
        raise ValueError(f"ops must be a non-empty subset of {OPS}, got {ops!r}")
    for name, value, low in (
        ("repeats", repeats, 1),
        ("warmup", warmup, 0),
        ("max_repeats", max_repeats, repeats),
        ("launches", launches, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    for name, value, high in (("min_time_s", min_time_s, math.inf), ("quantile", quantile, 1.0)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not 0 <= value <= high:
            raise ValueError(f"{name} must be a finite number in [0, {high}], got {value!r}")
    per_launch = [
        launch(
            _measure_worker,
            world_size,
            ops,
            sizes,
            repeats,
            warmup,
            float(min_time_s),
            max_repeats,
            float(quantile),
            backend=backend,
            threads_per_worker=1,
            timeout_s=timeout_s,
        )[0]
        for _ in range(launches)
    ]
    out = []
    for rows in zip(*per_launch):  # the same (op, p, nbytes) from every launch
        op, p, nbytes = rows[0][:3]
        faults = [r[4] for r in rows if r[4] is not None]
        out.append(
            CollectiveTiming(
                op, p, nbytes, statistics.median(r[3] for r in rows), statistics.median(faults) if faults else None
            )
        )
    return out


__all__ = ["DEFAULT_SIZES", "OPS", "PAGE_BYTES", "CollectiveTiming", "measure_collectives"]
