"""What communication costs: measure collectives, fit the α–β model, predict TP and PP on real links.

A message of n bytes costs α + n·β: α the latency of one message (software, protocol, wire), β the time
per byte (1 / bandwidth). Ring collectives of p ranks send p−1 (or 2(p−1)) messages of n/p bytes in a
row (Thakur, Rabenseifner & Gropp 2005):

    all-reduce                   t = 2(p−1)·α + 2(p−1)/p · n·β     (n: the vector every rank holds)
    all-gather, reduce-scatter   t =  (p−1)·α +  (p−1)/p · n·β     (n: the full, gathered vector)

Small messages are latency-bound (α), large ones bandwidth-bound (β): a decode step of tensor
parallelism all-reduces only batch · hidden · bytes per layer, a few kilobytes, so it pays α twice per
layer however fast the link is. ``measure_collectives`` times gloo collectives between processes on
this machine (inside ``launch``ed workers); ``fit_alpha_beta`` recovers α and β from them, optionally in
two regimes: between processes on one machine the "link" is memory copies, whose cost per byte jumps where
buffers stop being reused — gloo's all-gather and reduce-scatter allocate a temporary of the message's size
on every call, and glibc serves blocks above its mmap threshold (at most 32 MiB on 64-bit Linux) with
fresh pages from the kernel, one page fault per 4 KiB page — or stop fitting in the cache;
``CollectiveTiming.page_faults`` tells which. NVLink, PCIe and InfiniBand move data by DMA between buffers
the library allocated once (NCCL at start-up), so a datasheet link keeps one β;
``collective_time`` predicts for the datasheet links of ``data/interconnects.json`` (NVLink, PCIe,
InfiniBand); ``estimate`` combines the roofline time of a model's shard with its communication for
tensor (Megatron: two all-reduces per layer) and pipeline parallelism, and ``memory_per_device`` says
whether the shard fits. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import json
import math
import mmap
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from course_lib.measure.fitting import nonneg_lstsq

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


# ----------------------------------------------------------------------------- the model
def coefficients(op: str, p: int) -> tuple[float, float]:
    """(a, b) with t = a·α + b·n·β for ``op`` on a ring of ``p`` ranks; "send" is one message (a = b = 1)."""
    _check_p(p)
    if op == "all_reduce":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter"):
        return float(p - 1), (p - 1) / p
    if op == "send":
        return 1.0, 1.0
    raise ValueError(f"op must be one of {(*OPS, 'send')}, got {op!r}")


def _check_p(p) -> int:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p (ranks) must be an int >= 1, got {p!r}")
    return p


def _check_bytes(nbytes) -> float:
    ok = isinstance(nbytes, (int, float)) and not isinstance(nbytes, bool) and math.isfinite(nbytes)
    if not ok or nbytes < 0:
        raise ValueError(f"nbytes must be a finite number of bytes >= 0, got {nbytes!r}")
    return float(nbytes)


def ring_time(op: str, nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Seconds of ``op`` on ``nbytes`` over ``p`` ranks with latency ``alpha`` (s) and ``beta`` (s/byte); 0 for p = 1."""
    a, b = coefficients(op, p)
    if p == 1 and op != "send":
        return 0.0
    return a * alpha + b * _check_bytes(nbytes) * beta


@dataclass(frozen=True)
class Interconnect:
    """One link of ``data/interconnects.json``: per-direction datasheet bandwidth and a typical latency."""

    key: str
    name: str
    gbps: float  # GB/s per GPU, one direction
    latency_us: float  # α: fixed cost of one message
    scope: str  # "node" (inside a server) or "cluster" (between servers)
    reference: str  # data/references.json key of the bandwidth
    latency_reference: str
    note: str = ""

    @property
    def alpha(self) -> float:
        """Seconds per message."""
        return self.latency_us * 1e-6

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / (self.gbps * 1e9)


def interconnects_path() -> Path:
    from course_lib.core.paths import data_dir

    return data_dir() / "interconnects.json"


@lru_cache(maxsize=4)
def _load_links(path: str) -> dict[str, Interconnect]:
    from course_lib.measure.references import reference

    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    out = {}
    for entry in raw["links"]:
        link = Interconnect(**entry)
        if not (link.gbps > 0 and link.latency_us > 0):
            raise ValueError(f"{path}: link {link.key!r} needs gbps > 0 and latency_us > 0")
        reference(link.reference), reference(link.latency_reference)  # every figure has a source
        out[link.key] = link
    return out


def links() -> dict[str, Interconnect]:
    """Every link of ``data/interconnects.json`` by key: nvlink4, nvlink3, pcie5_x16, pcie4_x16, ib_ndr."""
    return dict(_load_links(str(interconnects_path())))


def link(key) -> Interconnect | AlphaBetaFit:
    """A link by key (an Interconnect or an AlphaBetaFit passes through); ValueError naming the keys."""
    if isinstance(key, (Interconnect, AlphaBetaFit)):
        return key
    table = links()
    if key not in table:
        raise ValueError(f"link must be one of {sorted(table)} (or an Interconnect / AlphaBetaFit), got {key!r}")
    return table[key]


def collective_time(op: str, nbytes: float, p: int, link_key="nvlink4") -> float:
    """Predicted seconds of a ring ``op`` ("all_reduce", "all_gather", "reduce_scatter", "send") of
    ``nbytes`` over ``p`` ranks on ``link_key`` (a key of ``links()``, an Interconnect, or a fit)."""
    lk = link(link_key)
    if isinstance(lk, AlphaBetaFit):
        return lk.predict(op, nbytes, p)  # a measured fit may have two regimes
    return ring_time(op, nbytes, p, lk.alpha, lk.beta)


# ----------------------------------------------------------------------------- measurement
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

    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    p = world_size
    buffers = {}
    for size in sizes:
        n = max(p, -(-size // 4 // p) * p)  # fp32 elements, a multiple of p so it splits evenly
        buffers[size] = (torch.ones(n), torch.empty(n // p))  # full (n,), part (n / p,)
    cases = [(op, size) for op in ops for size in sizes]

    def timed(op, size):
        full, part = buffers[size]
        dist.barrier()  # start together: a collective waits for its last rank
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
        dt = time.perf_counter() - t0
        f1 = _minor_faults()
        return dt, (None if f0 is None else f1 - f0)

    # the fastest warm-up run of each case (a slow one may have waited a scheduler tick), the same on both ranks
    fastest = torch.tensor([min([timed(*c)[0] for _ in range(warmup)], default=0.0) for c in cases])
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
        stats = torch.tensor([times + [statistics.median(faults) if faults else -1.0]], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # per run the slowest rank; the most faulting rank
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
    the median over launches (of the time and of the page faults)."""
    from course_lib.parallel.launcher import launch

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
            backend="gloo",
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


# ----------------------------------------------------------------------------- the fit
@dataclass(frozen=True, repr=False)
class AlphaBetaFit:
    """α (s per message) and β (s per byte) fitted to timings, with the timings it was fitted to. With a knee
    (two regimes), a message larger than ``knee_bytes`` pays ``beta_large`` per byte for all its bytes:
    on one machine the "link" is memory copies, and their cost per byte changes with where the buffer
    lives (fresh pages from the kernel, DRAM, cache). Datasheet links (``Interconnect``) have one β."""

    alpha: float
    beta: float
    timings: tuple[CollectiveTiming, ...]
    label: str = "fit"
    knee_bytes: float | None = None  # the largest message of the first regime; None: one regime
    beta_large: float | None = None  # s per byte of messages larger than knee_bytes

    def __post_init__(self):
        if (self.knee_bytes is None) != (self.beta_large is None):
            raise ValueError("knee_bytes and beta_large go together: give both or neither")
        if self.knee_bytes is not None and not (self.knee_bytes > 0 and self.beta_large >= 0):
            raise ValueError(f"need knee_bytes > 0 and beta_large >= 0, got {self.knee_bytes!r}, {self.beta_large!r}")

    @property
    def gbps(self) -> float:
        """1 / β in GB/s (below the knee, if there is one)."""
        return _gbps(self.beta)

    @property
    def gbps_large(self) -> float | None:
        """1 / β_large in GB/s; None without a knee."""
        return None if self.beta_large is None else _gbps(self.beta_large)

    @property
    def knee_next_bytes(self) -> int | None:
        """The smallest timed message above the knee: the knee lies between ``knee_bytes`` and this."""
        if self.knee_bytes is None:
            return None
        return min((t.nbytes for t in self.timings if t.nbytes > self.knee_bytes), default=None)

    def beta_at(self, nbytes: float) -> float:
        """Seconds per byte for a message of ``nbytes``: β up to the knee, β_large above it."""
        if self.knee_bytes is not None and _check_bytes(nbytes) > self.knee_bytes:
            return self.beta_large
        return self.beta

    def predict(self, op: str, nbytes: float, p: int) -> float:
        return ring_time(op, nbytes, p, self.alpha, self.beta_at(nbytes))

    def errors(self) -> list[float]:
        """predicted / measured − 1 for each timing, in the order of ``timings``."""
        return [self.predict(t.op, t.nbytes, t.p) / t.seconds - 1 for t in self.timings]

    def worst(self) -> tuple[CollectiveTiming, float]:
        """The timing the model misses most, and its error."""
        return max(zip(self.timings, self.errors()), key=lambda te: abs(te[1]))

    @property
    def worst_error(self) -> float:
        """The largest |predicted / measured − 1| over the timings."""
        return abs(self.worst()[1])

    def _fault_counted(self, min_pages: int) -> list[CollectiveTiming]:
        return [t for t in self.timings if t.page_faults is not None and t.nbytes >= min_pages * PAGE_BYTES]

    def page_fault_mismatches(self, min_pages: int = 256) -> list[CollectiveTiming]:
        """The timings on the wrong side of the knee for their page faults: above it without fresh pages
        (fresh-page share < 0.5), or at or below it with them. Only messages of ``min_pages`` pages or more
        count: on a smaller one a stray fault of the runtime reads as a large share. Empty without a knee."""
        if self.knee_bytes is None:
            return []
        return [
            t for t in self._fault_counted(min_pages) if (t.nbytes > self.knee_bytes) != (t.fresh_page_share >= 0.5)
        ]

    def page_fault_agreement(self, min_pages: int = 256) -> float | None:
        """Share of the (counted) timings on the side of the knee their page faults predict; 1.0: the knee is
        where the fresh pages start. None without a knee or without fault counts."""
        counted = self._fault_counted(min_pages)
        if self.knee_bytes is None or not counted:
            return None
        return 1 - len(self.page_fault_mismatches(min_pages)) / len(counted)

    def describe(self) -> str:
        """One line: α, β (and the knee with β_large) and the worst error."""
        head = f"{self.label}: α = {self.alpha * 1e6:.1f} µs, β = {self.beta * 1e9:.4f} ns/B ({self.gbps:.2f} GB/s)"
        if self.knee_bytes is not None:
            above = self.knee_next_bytes
            where = f"between {_fmt_bytes(self.knee_bytes)} and {_fmt_bytes(above)}" if above else "at the end"
            head += (
                f" up to {_fmt_bytes(self.knee_bytes)}, β_large = {self.beta_large * 1e9:.4f} ns/B "
                f"({self.gbps_large:.2f} GB/s) above (knee {where})"
            )
        return f"{head}; worst error {self.worst_error * 100:.0f}%"

    def __repr__(self) -> str:
        return f"<AlphaBetaFit {self.describe()} ({len(self.timings)} timings)>"

    def table(self) -> str:
        """Predicted vs measured per op and size, with the error (and the regime, with a knee)."""
        knee = self.knee_bytes is not None
        head = f"{'op':<15}{'p':>3}{'bytes':>12}{'measured':>12}{'predicted':>12}{'error':>8}" + (
            f"{'regime':>8}" if knee else ""
        )
        lines = [self.describe(), head, "-" * len(head)]
        for t, err in zip(self.timings, self.errors()):
            pred = self.predict(t.op, t.nbytes, t.p)
            row = f"{t.op:<15}{t.p:>3}{t.nbytes:>12,}{_fmt_s(t.seconds):>12}{_fmt_s(pred):>12}{err * 100:>7.0f}%"
            if knee:
                row += f"{'large' if t.nbytes > self.knee_bytes else 'small':>8}"
            lines.append(row)
        lines.append(f"worst error: {self.worst_error * 100:.0f}%")
        return "\n".join(lines)


def _gbps(beta: float) -> float:
    return math.inf if beta == 0 else 1e-9 / beta


def _fmt_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _fmt_bytes(nbytes: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _solve(rows, knee):
    """(α, β, β_large, sse) of the relative least-squares fit with the regimes split at ``knee`` (None: one)."""
    import numpy as np

    coef = np.array([coefficients(t.op, t.p) for t in rows])  # (rows, 2)
    seconds = np.array([t.seconds for t in rows])  # (rows,)
    nbytes = np.array([t.nbytes for t in rows], dtype=float)  # (rows,)
    per_byte = coef[:, 1] * nbytes
    if knee is None:
        cols = [coef[:, 0], per_byte]
    else:
        cols = [coef[:, 0], per_byte * (nbytes <= knee), per_byte * (nbytes > knee)]
    design = np.stack(cols, axis=1) / seconds[:, None]  # (rows, 2 or 3): predicted / measured per parameter
    x, sse = nonneg_lstsq(design, np.ones(len(rows)))  # predicted / measured should be 1
    return float(x[0]), float(x[1]), (float(x[2]) if knee is not None else None), sse


def fit_alpha_beta(timings, label: str = "fit", *, knee=None) -> AlphaBetaFit:
    """Least-squares α ≥ 0, β ≥ 0 of the ring model to ``timings`` (CollectiveTiming, or (op, p, nbytes,
    seconds) tuples). Residuals are *relative* ((predicted − measured) / measured), so a 4-byte message
    weighs as much as a 64 MB one: the goal is every size within a few tens of percent.

    ``knee``: None, one regime (the plain α–β model); a number of bytes, two regimes split there (messages
    larger than it get their own β_large); "auto", the split between two measured sizes that fits best with
    β_large > β (past a knee bytes get dearer: fresh pages, out of cache), kept only if it earns its two extra
    parameters (the Bayesian information criterion on the relative residuals) and each regime holds at
    least two sizes — one odd point is noise, not a regime."""
    rows = tuple(t if isinstance(t, CollectiveTiming) else CollectiveTiming(*t) for t in timings)
    if len(rows) < 2:
        raise ValueError(f"need at least 2 timings to fit α and β, got {len(rows)}")
    if any(not (t.seconds > 0 and math.isfinite(t.seconds)) for t in rows):
        raise ValueError("every timing must have seconds > 0")
    a, b, _, sse = _solve(rows, None)
    plain = AlphaBetaFit(a, b, rows, label)
    if knee is None:
        return plain
    sizes = sorted({t.nbytes for t in rows})
    if knee == "auto":
        candidates = sizes[1:-2]  # at least two sizes below or at the knee (α and β), two above (β_large)
        if not candidates or sse <= 1e-20 * len(rows):  # too few sizes, or one regime is already exact
            return plain
        fits = [_solve(rows, k) + (k,) for k in candidates]
        fits = [f for f in fits if f[2] > f[1]]  # bytes get dearer past a knee (fresh pages, out of cache)
        if not fits:
            return plain
        a2, b2, bl, sse2, k = min(fits, key=lambda f: f[3])
        n = len(rows)
        bic_gain = n * math.log(max(sse2, 1e-300) / sse) + 2 * math.log(n)  # < 0: the knee is worth it
        if bic_gain >= 0:
            return plain
        return AlphaBetaFit(a2, b2, rows, label, float(k), bl)
    ok = isinstance(knee, (int, float)) and not isinstance(knee, bool) and math.isfinite(knee) and knee > 0
    if not ok:
        raise ValueError(f'knee must be None, "auto" or a number of bytes > 0, got {knee!r}')
    if sum(s <= knee for s in sizes) < 2 or not any(s > knee for s in sizes):
        raise ValueError(
            f"knee={knee!r} needs at least two measured sizes at or below it and one above, got sizes {sizes}"
        )
    a2, b2, bl, _ = _solve(rows, knee)
    return AlphaBetaFit(a2, b2, rows, label, float(knee), bl)


def fit_by_op(timings, label: str = "gloo", *, knee="auto") -> dict[str, AlphaBetaFit]:
    """One fit per (op, p) present in ``timings``, keyed "all_reduce p=2" etc.: implementations differ
    per collective (gloo's all-gather and reduce-scatter are not the ring its all-reduce is, and allocate a
    buffer of the message's size per call), so one α, β for all of them fits none well. ``knee`` as in
    ``fit_alpha_beta`` (default "auto": two regimes where the data ask for them)."""
    rows = [t if isinstance(t, CollectiveTiming) else CollectiveTiming(*t) for t in timings]
    groups: dict[str, list[CollectiveTiming]] = {}
    for t in rows:
        groups.setdefault(f"{t.op} p={t.p}", []).append(t)
    return {key: fit_alpha_beta(group, label=f"{label} {key}", knee=knee) for key, group in groups.items()}


def format_by_size(fits) -> str:
    """One row per message size, for each fit (e.g. ``fit_by_op(...).values()``): measured time, the model's
    error, the regime ("·" below a knee, "▲" above) and the fresh-page share (page faults × page / bytes:
    ~1 when the call wrote into memory the kernel had just mapped)."""
    fits = [fits] if isinstance(fits, AlphaBetaFit) else list(fits)
    if not fits or not all(isinstance(f, AlphaBetaFit) for f in fits):
        raise ValueError("fits must be an AlphaBetaFit or a non-empty sequence of them (fit_by_op(...).values())")
    cols = [(f, {t.nbytes: (t, e) for t, e in zip(f.timings, f.errors())}) for f in fits]
    names = [f"{f.timings[0].op} p={f.timings[0].p}" if len({t.op for t in f.timings}) == 1 else f.label for f in fits]
    width = 27
    head = f"{'bytes':>12} |" + "|".join(f"{n:^{width}}" for n in names)
    sub = f"{'':>12} |" + "|".join(f"{'measured':>10}{'error':>7}{'':>2}{'fresh':>7} " for _ in fits)
    lines = [head, sub, "-" * len(sub)]
    for n in sorted({t.nbytes for f in fits for t in f.timings}):
        cells = []
        for f, by_size in cols:
            if n not in by_size:
                cells.append(" " * width)
                continue
            t, err = by_size[n]
            regime = "▲" if f.knee_bytes is not None and n > f.knee_bytes else "·"
            fresh = "—" if t.fresh_page_share is None else f"{t.fresh_page_share:.2f}"
            cells.append(f"{_fmt_s(t.seconds):>10}{err * 100:>6.0f}%{regime:>2}{fresh:>7} ")
        lines.append(f"{_fmt_bytes(n):>12} |" + "|".join(cells))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- parallel LLM inference
def _shape(model):
    from course_lib.models.accounting import ModelShape

    return model if isinstance(model, ModelShape) else ModelShape.from_name(model)


def _gpu(gpu):
    from course_lib.measure.hardware import GpuSpec, gpu_spec

    return gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)


def _degree(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class MemoryPerDevice:
    """Bytes one GPU holds under TP × PP: its share of the weights and of the KV cache."""

    weights: float
    kv: float
    capacity: float  # the GPU's memory in bytes

    @property
    def total(self) -> float:
        return self.weights + self.kv

    @property
    def fits(self) -> bool:
        """Whether weights + KV fit in 90% of the GPU's memory (the rest: CUDA context, activations)."""
        return self.total <= 0.9 * self.capacity


def memory_per_device(
    model="llama-3-70b",
    tp: int = 1,
    pp: int = 1,
    *,
    batch: int = 1,
    context_len: int = 4096,
    dtype: str = "bf16",
    gpu="H100 SXM",
) -> MemoryPerDevice:
    """Weights / (tp · pp) + the KV cache of ``batch`` sequences of ``context_len`` tokens, split by layers
    over ``pp`` and by KV heads over ``tp`` — but a KV head cannot be split: with tp > num_kv_heads
    each KV head is replicated, so the KV share stops shrinking at tp = num_kv_heads."""
    from course_lib.measure.costs import check_positive_int
    from course_lib.models.accounting import kv_bytes_per_token, weight_bytes

    shape, spec = _shape(model), _gpu(gpu)
    tp, pp = _degree("tp", tp), _degree("pp", pp)
    check_positive_int("batch", batch)
    check_positive_int("context_len", context_len)
    kv_total = kv_bytes_per_token(shape, dtype) * context_len * batch
    kv = kv_total / (pp * min(tp, shape.num_kv_heads))
    return MemoryPerDevice(weight_bytes(shape, dtype) / (tp * pp), kv, spec.memory_gb * 1e9)


@dataclass(frozen=True)
class ParallelEstimate:
    """One decode step (one new token per sequence) of a model split over tp × pp GPUs."""

    model: str
    tp: int
    pp: int
    batch: int
    micro_batches: int
    compute_s: float  # roofline time of one stage's shard for one micro-batch
    tp_comm_s: float  # the stage's Megatron all-reduces for one micro-batch
    p2p_s: float  # sending one micro-batch's activations to the next stage
    memory: MemoryPerDevice

    @property
    def stage_s(self) -> float:
        return self.compute_s + self.tp_comm_s

    @property
    def latency_s(self) -> float:
        """Time per token of one sequence (TPOT): through every stage in turn, plus the hops between them."""
        return self.pp * self.stage_s + (self.pp - 1) * self.p2p_s

    @property
    def step_s(self) -> float:
        """Time for all micro-batches to get their token: (m + pp − 1) pipeline slots (GPipe schedule)."""
        return (self.micro_batches + self.pp - 1) * (self.stage_s + (self.p2p_s if self.pp > 1 else 0.0))

    @property
    def bubble(self) -> float:
        """Idle fraction of the pipeline schedule: (pp − 1) / (m + pp − 1)."""
        return (self.pp - 1) / (self.micro_batches + self.pp - 1)

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.step_s

    @property
    def comm_fraction(self) -> float:
        """Share of the token latency spent communicating."""
        return 1 - self.pp * self.compute_s / self.latency_s


def estimate(
    model="llama-3-70b",
    tp: int = 1,
    pp: int = 1,
    link_key="nvlink4",
    *,
    batch: int = 1,
    micro_batches: int = 1,
    context_len: int = 4096,
    dtype: str = "bf16",
    gpu="H100 SXM",
) -> ParallelEstimate:
    """Decode-step time of ``model`` under tensor degree ``tp`` and pipeline degree ``pp``.

    Each stage holds layers / pp; each GPU of a stage 1 / tp of them. Compute: the roofline time
    (max of FLOPs / peak and bytes / bandwidth, datasheet peaks of ``gpu``) of 1 / (tp · pp) of a decode
    step's FLOPs and bytes (KV bytes split as in ``memory_per_device``) for one micro-batch. TP
    communication (Megatron-LM: one all-reduce after attention, one after the MLP): 2 · layers / pp
    all-reduces of micro-batch · hidden · bytes over tp ranks. PP: one send of micro-batch · hidden ·
    bytes between stages. No overlap of communication with compute is assumed."""
    from course_lib.core.dtypes import dtype_bytes
    from course_lib.measure.costs import check_positive_int
    from course_lib.measure.roofline import min_time
    from course_lib.models.accounting import decode_flops, kv_bytes_per_token, weights_read_per_step

    shape, spec = _shape(model), _gpu(gpu)
    tp, pp, micro_batches = _degree("tp", tp), _degree("pp", pp), _degree("micro_batches", micro_batches)
    check_positive_int("batch", batch)
    check_positive_int("context_len", context_len)
    if shape.num_heads % tp:
        raise ValueError(f"tp={tp} must divide the {shape.num_heads} attention heads of {shape.name}")
    if pp > shape.num_layers:
        raise ValueError(f"pp={pp} exceeds the {shape.num_layers} layers of {shape.name}")
    if batch % micro_batches:
        raise ValueError(f"micro_batches={micro_batches} must divide batch={batch}")
    mb = batch // micro_batches
    kv = kv_bytes_per_token(shape, dtype) * context_len * mb / min(tp, shape.num_kv_heads)
    step_bytes = weights_read_per_step(shape, mb, dtype) / tp + kv
    flops = decode_flops(shape, context_len, mb) / tp
    compute = min_time(flops / pp, step_bytes / pp, spec.peak_flops(spec.best_dtype(dtype)), spec.bandwidth)
    message = mb * shape.hidden_size * dtype_bytes(dtype)  # (micro-batch, hidden) activations
    layers_per_stage = shape.num_layers / pp
    tp_comm = 2 * layers_per_stage * collective_time("all_reduce", message, tp, link_key) if tp > 1 else 0.0
    p2p = collective_time("send", message, 2, link_key) if pp > 1 else 0.0
    memory = memory_per_device(shape, tp, pp, batch=batch, context_len=context_len, dtype=dtype, gpu=spec)
    return ParallelEstimate(shape.name, tp, pp, batch, micro_batches, compute, tp_comm, p2p, memory)


def tp_time_per_token(model="llama-3-70b", tp: int = 8, link_key="nvlink4", batch: int = 1, dtype="bf16", **kw):
    """Tensor-parallel decode estimate (pp = 1): ``estimate(model, tp, 1, link_key, ...)``; ``.latency_s`` is TPOT."""
    return estimate(model, tp, 1, link_key, batch=batch, dtype=dtype, **kw)


def pp_time(model="llama-3-70b", pp: int = 8, link_key="nvlink4", batch: int = 1, micro_batches: int = 1, **kw):
    """Pipeline-parallel decode estimate (tp = 1): ``.latency_s`` per token, ``.step_s`` and ``.bubble`` for
    ``micro_batches`` in flight. In decode every micro-batch re-reads its stage's weights, so pipelining
    raises throughput only where the step is not bandwidth-bound, and never lowers one token's latency."""
    return estimate(model, 1, pp, link_key, batch=batch, micro_batches=micro_batches, **kw)


def parallel_plan(
    model="llama-3-70b",
    n_gpus: int = 8,
    link_key="nvlink4",
    *,
    gpu="H100 SXM",
    batch: int = 1,
    context_len: int = 4096,
    dtype: str = "bf16",
    degrees=(1, 2, 4, 8),
) -> list[ParallelEstimate]:
    """Every (tp, pp) from ``degrees`` with tp · pp ≤ ``n_gpus`` (e.g. Llama-3-70B on 8× H100)."""
    _degree("n_gpus", n_gpus)
    shape = _shape(model)
    out = []
    for pp in degrees:
        for tp in degrees:
            if tp * pp <= n_gpus and shape.num_heads % tp == 0 and pp <= shape.num_layers:
                out.append(
                    estimate(shape, tp, pp, link_key, batch=batch, context_len=context_len, dtype=dtype, gpu=gpu)
                )
    return out


def format_plan(plan: list[ParallelEstimate]) -> str:
    """A table of a ``parallel_plan``: memory per GPU, whether it fits, token latency and its comm share."""
    if not plan:
        raise ValueError("plan must be a non-empty list of ParallelEstimate (from parallel_plan)")
    head = f"{'tp':>3}{'pp':>4}{'GB/GPU':>9}{'fits':>6}{'TPOT':>11}{'comm':>7}{'tok/s':>9}"
    lines = [f"{plan[0].model}, batch {plan[0].batch}", head, "-" * len(head)]
    for e in plan:
        lines.append(
            f"{e.tp:>3}{e.pp:>4}{e.memory.total / 1e9:>9.1f}{'yes' if e.memory.fits else 'no':>6}"
            f"{_fmt_s(e.latency_s):>11}{e.comm_fraction * 100:>6.0f}%{e.tokens_per_s:>9.1f}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plots
def _figure(figsize=(7, 4)):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=80)  # its own figure, not pyplot's global one
    FigureCanvasAgg(fig)
    return fig


def plot_alpha_beta(fit, links_to_show=("nvlink4", "pcie4_x16"), marks=None):
    """Measured times (markers) and the fitted model (lines) per op against message size, log-log, for one
    ``AlphaBetaFit`` or several (e.g. ``fit_by_op(...).values()``); a fit's knee as a dotted vertical line,
    ``marks`` ({label: bytes}, e.g. the last-level cache) dashed grey; the datasheet links' all-reduce
    predictions dashed for scale. Returns a matplotlib Figure."""
    import numpy as np

    fits = [fit] if isinstance(fit, AlphaBetaFit) else list(fit)
    if not fits or not all(isinstance(f, AlphaBetaFit) for f in fits):
        raise ValueError("fit must be an AlphaBetaFit or a non-empty sequence of them (fit_by_op(...).values())")
    fig = _figure()
    ax = fig.add_subplot()
    timings = [t for f in fits for t in f.timings]
    sizes = np.array(sorted({t.nbytes for t in timings}), dtype=float)
    x = np.logspace(np.log10(sizes.min()), np.log10(sizes.max()), 200)
    markers = dict(zip(OPS, "osD"))
    for f in fits:
        for op in OPS:
            points = [t for t in f.timings if t.op == op]
            if not points:
                continue
            p = points[0].p
            (line,) = ax.plot(
                [t.nbytes for t in points], [t.seconds for t in points], markers[op], label=f"{op} measured"
            )
            model = "two-regime α–β fit" if f.knee_bytes is not None else "α–β fit"
            ax.plot(x, [f.predict(op, n, p) for n in x], "-", color=line.get_color(), label=f"{op} {model}")
            if f.knee_bytes is not None:
                ax.axvline(f.knee_bytes, color=line.get_color(), ls=":", lw=1)
    for name, nbytes in (marks or {}).items():
        ax.axvline(nbytes, color="grey", ls="--", lw=1)
        ax.text(nbytes, 0.02, f"{name} ", transform=ax.get_xaxis_transform(), fontsize=7, color="grey", ha="right")
    p = timings[0].p
    for key in links_to_show:
        lk = link(key)
        ax.plot(x, [collective_time("all_reduce", n, p, lk) for n in x], "--", lw=1, label=f"all_reduce, {lk.name}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("seconds")
    if len(fits) == 1:
        f = fits[0]
        title = f"{f.label}: α = {f.alpha * 1e6:.0f} µs, 1/β = {f.gbps:.2f} GB/s"
        if f.knee_bytes is not None:
            title += f", above {_fmt_bytes(f.knee_bytes)} {f.gbps_large:.2f} GB/s"
    else:
        title = "measured (markers) and fitted (lines); dotted: a fit's knee"
    ax.set_title(f"{title} (p = {p})", fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=6)
    return fig


def plot_plan(plan: list[ParallelEstimate]):
    """Memory per GPU (with the GPU's capacity) and token latency for each (tp, pp) of a plan."""
    if not plan:
        raise ValueError("plan must be a non-empty list of ParallelEstimate (from parallel_plan)")
    fig = _figure((9, 3.5))
    ax_mem, ax_t = fig.subplots(1, 2)
    labels = [f"TP{e.tp}·PP{e.pp}" for e in plan]
    xs = range(len(plan))
    ax_mem.bar(xs, [e.memory.weights / 1e9 for e in plan], label="weights")
    ax_mem.bar(xs, [e.memory.kv / 1e9 for e in plan], bottom=[e.memory.weights / 1e9 for e in plan], label="KV")
    ax_mem.axhline(0.9 * plan[0].memory.capacity / 1e9, color="k", ls="--", lw=1, label="90% of GPU memory")
    ax_mem.set_ylabel("GB per GPU")
    ax_t.bar(xs, [e.pp * e.compute_s * 1e3 for e in plan], label="compute")
    ax_t.bar(
        xs,
        [(e.latency_s - e.pp * e.compute_s) * 1e3 for e in plan],
        bottom=[e.pp * e.compute_s * 1e3 for e in plan],
        label="communication",
    )
    ax_t.set_ylabel("ms per token (TPOT)")
    for ax in (ax_mem, ax_t):
        ax.set_xticks(list(xs), labels, rotation=60, fontsize=7)
        ax.legend(fontsize=7)
    fig.suptitle(f"{plan[0].model}, batch {plan[0].batch}")
    fig.tight_layout()
    return fig


__all__ = [
    "DEFAULT_SIZES",
    "OPS",
    "PAGE_BYTES",
    "AlphaBetaFit",
    "CollectiveTiming",
    "Interconnect",
    "MemoryPerDevice",
    "ParallelEstimate",
    "coefficients",
    "collective_time",
    "estimate",
    "fit_alpha_beta",
    "fit_by_op",
    "format_by_size",
    "format_plan",
    "interconnects_path",
    "link",
    "links",
    "measure_collectives",
    "memory_per_device",
    "parallel_plan",
    "plot_alpha_beta",
    "plot_plan",
    "pp_time",
    "ring_time",
    "tp_time_per_token",
]
