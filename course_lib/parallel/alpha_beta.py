"""The ring α–β cost model of a collective, and its fit to measured timings (one regime or two).

A message of n bytes costs α + n·β: α the latency of one message (software, protocol, wire), β the time
per byte (1 / bandwidth). Ring collectives of p ranks send p−1 (or 2(p−1)) messages of n/p bytes in a
row (Thakur, Rabenseifner & Gropp 2005):

    all-reduce                   t = 2(p−1)·α + 2(p−1)/p · n·β     (n: the vector every rank holds)
    all-gather, reduce-scatter   t =  (p−1)·α +  (p−1)/p · n·β     (n: the full, gathered vector)

Small messages are latency-bound (α), large ones bandwidth-bound (β): a decode step of tensor
parallelism all-reduces only batch · hidden · bytes per layer, a few kilobytes, so it pays α twice per
layer however fast the link is. ``fit_alpha_beta`` recovers α and β from ``CollectiveTiming`` rows
(``course_lib.parallel.collectives``), optionally in two regimes: between processes on one machine the
"link" is memory copies, whose cost per byte jumps where buffers stop being reused (fresh pages from the
kernel) or stop fitting in the cache; ``AlphaBetaFit.page_fault_agreement`` says whether the knee sits
where the page faults start. NVLink, PCIe and InfiniBand move data by DMA between buffers the library
allocated once (NCCL at start-up), so a datasheet link (``course_lib.parallel.interconnects``) keeps one β.
Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course_lib.measure.fitting import nonneg_lstsq
from course_lib.parallel.collectives import OPS, PAGE_BYTES, CollectiveTiming


def coefficients(op: str, p: int) -> tuple[float, float]:
    """(a, b) with t = a·α + b·n·β for ``op`` on a ring of ``p`` ranks; "send" is one message (a = b = 1)."""
    _check_p(p)
    if op == "all_reduce":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter", "all_to_all"):  # all-to-all: p − 1 pairwise exchanges of n/p
        return float(p - 1), (p - 1) / p
    if op == "send":
        return 1.0, 1.0
    raise ValueError(f"op must be one of {(*OPS, 'all_to_all', 'send')}, got {op!r}")


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
            where = f"between {fmt_bytes(self.knee_bytes)} and {fmt_bytes(above)}" if above else "at the end"
            head += (
                f" up to {fmt_bytes(self.knee_bytes)}, β_large = {self.beta_large * 1e9:.4f} ns/B "
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
            row = f"{t.op:<15}{t.p:>3}{t.nbytes:>12,}{fmt_seconds(t.seconds):>12}{fmt_seconds(pred):>12}{err * 100:>7.0f}%"
            if knee:
                row += f"{'large' if t.nbytes > self.knee_bytes else 'small':>8}"
            lines.append(row)
        lines.append(f"worst error: {self.worst_error * 100:.0f}%")
        return "\n".join(lines)


def _gbps(beta: float) -> float:
    return math.inf if beta == 0 else 1e-9 / beta


def fmt_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def fmt_bytes(nbytes: float) -> str:
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
            cells.append(f"{fmt_seconds(t.seconds):>10}{err * 100:>6.0f}%{regime:>2}{fresh:>7} ")
        lines.append(f"{fmt_bytes(n):>12} |" + "|".join(cells))
    return "\n".join(lines)


__all__ = [
    "AlphaBetaFit",
    "coefficients",
    "fit_alpha_beta",
    "fit_by_op",
    "fmt_bytes",
    "fmt_seconds",
    "format_by_size",
    "held_out",
    "ring_time",
]


def held_out(timings, every: int = 2, *, knee="auto", label: str = "held-out") -> tuple[AlphaBetaFit, list]:
    """Score the fit on sizes it never saw: fit on every ``every``-th message size of each op (the first, the
    smallest and the largest always among them), predict the others. Returns (the fit of each op keyed as
    ``fit_by_op``, merged into a dict) and [(timing, predicted / measured − 1)] for the held-out timings."""
    rows = [t if isinstance(t, CollectiveTiming) else CollectiveTiming(*t) for t in timings]
    if isinstance(every, bool) or not isinstance(every, int) or every < 2:
        raise ValueError(f"every must be an int >= 2 (1 would hold nothing out), got {every!r}")
    fits, scored = {}, []
    for op in sorted({t.op for t in rows}):
        mine = [t for t in rows if t.op == op]
        sizes = sorted({t.nbytes for t in mine})
        keep = {s for i, s in enumerate(sizes) if i % every == 0} | {sizes[0], sizes[-1]}
        if len(keep) == len(sizes):
            raise ValueError(f"{op}: {len(sizes)} sizes leave none to hold out with every={every}")
        fit = fit_alpha_beta([t for t in mine if t.nbytes in keep], label=f"{label} {op}", knee=knee)
        fits[op] = fit
        scored += [(t, fit.predict(t.op, t.nbytes, t.p) / t.seconds - 1) for t in mine if t.nbytes not in keep]
    return fits, scored
