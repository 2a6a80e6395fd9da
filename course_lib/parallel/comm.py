"""What communication costs: measure collectives, fit the α–β model, predict TP and PP on real links.

A message of n bytes costs α + n·β: α the latency of one message (software, protocol, wire), β the time
per byte (1 / bandwidth). Ring collectives of p ranks send p−1 (or 2(p−1)) messages of n/p bytes in a
row (Thakur, Rabenseifner & Gropp 2005):

    all-reduce                   t = 2(p−1)·α + 2(p−1)/p · n·β     (n: the vector every rank holds)
    all-gather, reduce-scatter   t =  (p−1)·α +  (p−1)/p · n·β     (n: the full, gathered vector)

Small messages are latency-bound (α), large ones bandwidth-bound (β): a decode step of tensor
parallelism all-reduces only batch · hidden · bytes per layer, a few kilobytes, so it pays α twice per
layer however fast the link is. ``measure_collectives`` times gloo collectives between processes on
this machine (inside ``launch``ed workers); ``fit_alpha_beta`` recovers α and β from them;
``collective_time`` predicts for the datasheet links of ``data/interconnects.json`` (NVLink, PCIe,
InfiniBand); ``estimate`` combines the roofline time of a model's shard with its communication for
tensor (Megatron: two all-reduces per layer) and pipeline parallelism, and ``memory_per_device`` says
whether the shard fits. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

OPS = ("all_reduce", "all_gather", "reduce_scatter")
#: Message sizes from one float to 64 MiB, ×16 apart.
DEFAULT_SIZES = (4, 64, 1024, 16 * 1024, 256 * 1024, 4 * 2**20, 64 * 2**20)


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
    from course_lib.paths import data_dir

    return data_dir() / "interconnects.json"


@lru_cache(maxsize=4)
def _load_links(path: str) -> dict[str, Interconnect]:
    from course_lib.references import reference

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
    return ring_time(op, nbytes, p, lk.alpha, lk.beta)


# ----------------------------------------------------------------------------- measurement
@dataclass(frozen=True)
class CollectiveTiming:
    """One measured collective: best-of-repeats seconds of the slowest rank."""

    op: str
    p: int
    nbytes: int  # all-reduce / reduce-scatter: the input vector; all-gather: the gathered output
    seconds: float


def _measure_worker(rank, world_size, ops, sizes, repeats, warmup):
    """Inside a launched worker: time each op and size; every rank returns the same rows."""
    import time
    import warnings

    import torch
    import torch.distributed as dist

    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    p = world_size
    rows = []
    for op in ops:
        for size in sizes:
            n = max(p, -(-size // 4 // p) * p)  # fp32 elements, a multiple of p so it splits evenly
            full = torch.ones(n)  # (n,)
            part = torch.empty(n // p)  # (n / p,)

            def run():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # the *_tensor names are deprecated
                    if op == "all_reduce":
                        dist.all_reduce(full)
                    elif op == "all_gather":
                        all_gather(full, part)
                    else:
                        reduce_scatter(part, full)

            times = []
            for i in range(warmup + repeats):
                dist.barrier()  # start together: a collective waits for its last rank
                t0 = time.perf_counter()
                run()
                dt = time.perf_counter() - t0
                if i >= warmup:
                    times.append(dt)
            slowest = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # per repeat, the slowest rank's time
            rows.append((op, p, n * 4, float(slowest.min())))  # best repeat: noise only adds time
    return rows


def measure_collectives(
    world_size: int = 2,
    sizes=DEFAULT_SIZES,
    ops=OPS,
    *,
    repeats: int = 5,
    warmup: int = 2,
    timeout_s: float = 300.0,
) -> list[CollectiveTiming]:
    """Time gloo ``ops`` over ``sizes`` (bytes, rounded to whole fp32 elements, a multiple of
    ``world_size``) between ``world_size`` local processes: after ``warmup`` runs, the best of ``repeats``
    of the slowest rank's time, each run started after a barrier. One thread per worker."""
    from course_lib.parallel.launcher import launch

    sizes = tuple(sizes)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes):
        raise ValueError(f"sizes must be a non-empty sequence of positive ints (bytes), got {sizes!r}")
    ops = tuple(ops)
    if not ops or any(op not in OPS for op in ops):
        raise ValueError(f"ops must be a non-empty subset of {OPS}, got {ops!r}")
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    rows = launch(
        _measure_worker,
        world_size,
        ops,
        sizes,
        repeats,
        warmup,
        backend="gloo",
        threads_per_worker=1,
        timeout_s=timeout_s,
    )[0]
    return [CollectiveTiming(*row) for row in rows]


# ----------------------------------------------------------------------------- the fit
@dataclass(frozen=True)
class AlphaBetaFit:
    """α (s per message) and β (s per byte) fitted to timings, with the timings it was fitted to."""

    alpha: float
    beta: float
    timings: tuple[CollectiveTiming, ...]
    label: str = "fit"

    @property
    def gbps(self) -> float:
        """1 / β in GB/s."""
        return math.inf if self.beta == 0 else 1e-9 / self.beta

    def predict(self, op: str, nbytes: float, p: int) -> float:
        return ring_time(op, nbytes, p, self.alpha, self.beta)

    def errors(self) -> list[float]:
        """predicted / measured − 1 for each timing."""
        return [self.predict(t.op, t.nbytes, t.p) / t.seconds - 1 for t in self.timings]

    @property
    def worst_error(self) -> float:
        """The largest |predicted / measured − 1| over the timings."""
        return max(abs(e) for e in self.errors())

    def table(self) -> str:
        """Predicted vs measured per op and size, with the error."""
        head = f"{'op':<15}{'p':>3}{'bytes':>12}{'measured':>12}{'predicted':>12}{'error':>8}"
        lines = [
            f"{self.label}: α = {self.alpha * 1e6:.1f} µs, β = {self.beta * 1e9:.4f} ns/B ({self.gbps:.2f} GB/s)",
            head,
            "-" * len(head),
        ]
        for t, err in zip(self.timings, self.errors()):
            pred = self.predict(t.op, t.nbytes, t.p)
            lines.append(
                f"{t.op:<15}{t.p:>3}{t.nbytes:>12,}{_fmt_s(t.seconds):>12}{_fmt_s(pred):>12}{err * 100:>7.0f}%"
            )
        lines.append(f"worst error: {self.worst_error * 100:.0f}%")
        return "\n".join(lines)


def _fmt_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def fit_alpha_beta(timings, label: str = "fit") -> AlphaBetaFit:
    """Least-squares α ≥ 0, β ≥ 0 of the ring model to ``timings`` (CollectiveTiming, or (op, p, nbytes,
    seconds) tuples). Residuals are *relative* ((predicted − measured) / measured), so a 4-byte message
    weighs as much as a 64 MB one: the goal is every size within a few tens of percent."""
    import numpy as np

    rows = tuple(t if isinstance(t, CollectiveTiming) else CollectiveTiming(*t) for t in timings)
    if len(rows) < 2:
        raise ValueError(f"need at least 2 timings to fit α and β, got {len(rows)}")
    if any(not (t.seconds > 0 and math.isfinite(t.seconds)) for t in rows):
        raise ValueError("every timing must have seconds > 0")
    coef = np.array([coefficients(t.op, t.p) for t in rows])  # (rows, 2)
    seconds = np.array([t.seconds for t in rows])  # (rows,)
    design = np.stack([coef[:, 0], coef[:, 1] * [t.nbytes for t in rows]], axis=1) / seconds[:, None]  # (rows, 2)
    target = np.ones(len(rows))  # predicted / measured should be 1
    scale = np.abs(design).max(axis=0)  # α ~ 1e-5 and β ~ 1e-10: balance the columns
    scale[scale == 0] = 1.0
    (a, b), *_ = np.linalg.lstsq(design / scale, target, rcond=None)
    a, b = a / scale[0], b / scale[1]
    if a < 0 or b < 0:  # the constrained optimum lies on an edge: fit the other parameter alone
        cands = []
        for col in (0, 1):
            x = design[:, col]
            v = max(0.0, float(x @ target / (x @ x))) if x @ x > 0 else 0.0
            cands.append((float(np.sum((x * v - target) ** 2)), col, v))
        _, col, v = min(cands)
        a, b = (v, 0.0) if col == 0 else (0.0, v)
    return AlphaBetaFit(float(a), float(b), rows, label)


def fit_by_op(timings, label: str = "gloo") -> dict[str, AlphaBetaFit]:
    """One fit per (op, p) present in ``timings``, keyed "all_reduce p=2" etc.: implementations differ
    per collective (gloo's all-gather and reduce-scatter are not the ring its all-reduce is), so one
    α, β for all of them fits none well."""
    rows = [t if isinstance(t, CollectiveTiming) else CollectiveTiming(*t) for t in timings]
    groups: dict[str, list[CollectiveTiming]] = {}
    for t in rows:
        groups.setdefault(f"{t.op} p={t.p}", []).append(t)
    return {key: fit_alpha_beta(group, label=f"{label} {key}") for key, group in groups.items()}


# ----------------------------------------------------------------------------- parallel LLM inference
def _shape(model):
    from course_lib.models.accounting import ModelShape

    return model if isinstance(model, ModelShape) else ModelShape.from_name(model)


def _gpu(gpu):
    from course_lib.hardware import GpuSpec, gpu_spec

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
    from course_lib.costs import check_positive_int
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
    from course_lib.costs import check_positive_int
    from course_lib.dtypes import dtype_bytes
    from course_lib.models.accounting import decode_flops, kv_bytes_per_token, weights_read_per_step
    from course_lib.roofline import min_time

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


def plot_alpha_beta(fit: AlphaBetaFit, links_to_show=("nvlink4", "pcie4_x16")):
    """Measured times (markers) and the fitted model (lines) per op against message size, log-log; the
    datasheet links' all-reduce predictions dashed for scale. Returns a matplotlib Figure."""
    import numpy as np

    fig = _figure()
    ax = fig.add_subplot()
    sizes = np.array(sorted({t.nbytes for t in fit.timings}), dtype=float)
    x = np.logspace(np.log10(sizes.min()), np.log10(sizes.max()), 100)
    for op, marker in zip(OPS, "osD"):
        points = [t for t in fit.timings if t.op == op]
        if not points:
            continue
        p = points[0].p
        (line,) = ax.plot([t.nbytes for t in points], [t.seconds for t in points], marker, label=f"{op} measured")
        ax.plot(x, [fit.predict(op, n, p) for n in x], "-", color=line.get_color(), label=f"{op} α–β fit")
    p = fit.timings[0].p
    for key in links_to_show:
        lk = link(key)
        ax.plot(x, [collective_time("all_reduce", n, p, lk) for n in x], "--", lw=1, label=f"all_reduce, {lk.name}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("seconds")
    ax.set_title(f"{fit.label}: α = {fit.alpha * 1e6:.0f} µs, 1/β = {fit.gbps:.2f} GB/s (p = {p})")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7)
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
