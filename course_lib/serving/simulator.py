"""Chapter 06's serving simulator: the engine's own scheduler, a bookkeeping KV cache, and a calibrated clock.

Replaying a trace on the real engine takes as long as the trace; a policy sweep over arrival rates would
take hours. The simulator keeps everything that decides *which* tokens run in a step (the very same
``Scheduler`` class, its budgets, its preemption, a KV backend that does the slot accounting of the real
one without tensors) and replaces the one thing that costs time, the forward, by a cost model fitted on
this machine:  step_time ≈ a + b·prefill_tokens + c·decode_rows (+ d·Σ decode context).
On a CPU a decode row costs little next to the fixed cost ``a`` (the weights are read once per step
whatever the batch: decode is bandwidth-bound), while every prefill token costs compute (compute-bound),
which is why batching decodes is nearly free and a long prefill stalls everyone decoding beside it.
``run_real`` replays the same trace on an ``Engine`` by wall clock, ``compare`` sets the two side by side,
``sweep`` draws throughput–latency and goodput curves per policy. Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import platform
import statistics
import time
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from course_lib.engine.attention.contiguous import ContiguousBackend
from course_lib.engine.attention.paged import PagedBackend
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from course_lib.engine.sequence import Sequence
from course_lib.measure.fitting import nonneg_lstsq
from course_lib.measure.metrics import SLO, RequestTrace, ServingSummary, summarize
from course_lib.serving.traces import Trace

KV_CACHES = ("contiguous", "paged")


# ----------------------------------------------------------------------------- what a step costs
@dataclass(frozen=True)
class StepShape:
    """What one scheduled step holds, in the cost model's terms."""

    prefill_tokens: int  # prompt tokens (whole prompts, chunks, recomputation after preemption)
    decode_rows: int  # sequences generating one token
    decode_context: int  # Σ KV length (after the step) of the decode rows: what their attention reads

    @property
    def features(self) -> tuple[float, float, float, float]:
        return (1.0, float(self.prefill_tokens), float(self.decode_rows), float(self.decode_context))


def roofline_cost_model(model: str = "llama-3-8b", gpu: str = "H100 SXM", dtype: str = "bf16") -> CostModel:
    """A GPU-shaped cost model from datasheet roofs (no measurement), to ask what a policy does on a real
    serving GPU: a = weight bytes / bandwidth (a decode step streams every weight once, whatever its batch),
    b = 2·matmul params / peak FLOP/s per prefill token (prefill is compute-bound), c = 0, and d = KV bytes per
    token / bandwidth (each decode row reads its own context). Lower bounds: real kernels reach 50-80%."""
    from course_lib.measure.hardware import gpu_spec
    from course_lib.models.accounting import ModelShape, kv_bytes_per_token, matmul_params, weight_bytes

    shape, spec = ModelShape.from_name(model), gpu_spec(gpu)
    bw, flops = spec.bandwidth, spec.peak_flops(dtype)
    return CostModel(
        a=weight_bytes(shape, dtype) / bw,
        b=2 * matmul_params(shape) / flops,
        c=0.0,
        d=kv_bytes_per_token(shape, dtype) / bw,
        meta={
            "source": f"roofline of {model} on {gpu} ({dtype}), datasheet peaks",
            "max_model_len": shape.max_position,
        },
    )


def step_shape(batch: ScheduledBatch) -> StepShape:
    """The shape of a batch just returned by ``Scheduler.schedule`` (before the step updates the sequences)."""
    prefill = rows = context = 0
    for seq, n in zip(batch.seqs, batch.num_tokens):
        if n == 1 and seq.num_cached_tokens >= seq.num_prompt_tokens:
            rows += 1
            context += seq.num_cached_tokens + 1
        else:
            prefill += n
    return StepShape(prefill, rows, context)


@dataclass(frozen=True)
class CostModel:
    """step_time = a + b·prefill_tokens + c·decode_rows + d·decode_context, in seconds (least squares)."""

    a: float  # s, fixed cost of a step (weights streamed once, Python, sampling)
    b: float  # s per prefill token (compute-bound)
    c: float  # s per decode row
    d: float = 0.0  # s per token of decode context (attention reads the KV cache)
    rms_s: float = math.nan  # root-mean-square residual of the fit
    max_rel_err: float = math.nan  # largest |residual| / measured time over the fitted points
    n_points: int = 0
    meta: dict = field(default_factory=dict)  # machine, model, grid

    def __post_init__(self) -> None:
        for name in ("a", "b", "c", "d"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"CostModel.{name} must be a finite number, got {v!r}")

    def step_time(self, prefill_tokens: int, decode_rows: int, decode_context: int = 0) -> float:
        """Predicted seconds of one step (at least 1 µs)."""
        t = self.a + self.b * prefill_tokens + self.c * decode_rows + self.d * decode_context
        return max(t, 1e-6)

    def shape_time(self, shape: StepShape) -> float:
        return self.step_time(shape.prefill_tokens, shape.decode_rows, shape.decode_context)

    def batch_time(self, batch: ScheduledBatch) -> float:
        return self.shape_time(step_shape(batch))

    def describe(self) -> str:
        return (
            f"step ≈ {self.a * 1e3:.2f} ms + {self.b * 1e6:.1f} µs·prefill_tokens + {self.c * 1e6:.1f} µs·decode_rows"
            + (f" + {self.d * 1e9:.1f} ns·decode_context" if self.d else "")
            + f"  (rms residual {self.rms_s * 1e3:.2f} ms, max rel err {self.max_rel_err:.0%}, {self.n_points} points)"
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"a", "b", "c"} - set(d)
        if missing:
            raise ValueError(f"not a cost model: missing {sorted(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        return cls.from_dict(json.loads(Path(path).read_text()))


def fit_cost_model(
    points, use_context: bool | None = None, relative: bool = True, meta: dict | None = None
) -> CostModel:
    """Fit a + b·prefill + c·rows (+ d·context) to (prefill_tokens, decode_rows, decode_context, seconds)
    points with ``numpy.linalg.lstsq``. ``relative``: weight each point by 1/time, so a 3 ms decode step
    counts as much as a 300 ms prefill (a simulator replays thousands of the former). Every coefficient is
    kept ≥ 0 (``fitting.nonneg_lstsq``): a negative one has no physical meaning, work never saves time.
    ``use_context`` None: keep the context term only if it cuts the RMS relative residual by ≥ 10%."""
    arr = np.asarray([tuple(p) for p in points], dtype=float)
    if arr.ndim != 2 or arr.shape[1] != 4 or arr.shape[0] < 4 or not np.isfinite(arr).all():
        raise ValueError("points must be at least 4 finite (prefill_tokens, decode_rows, decode_context, s) tuples")
    if (arr[:, 3] <= 0).any():
        raise ValueError("step times must be > 0")
    X = np.column_stack([np.ones(len(arr)), arr[:, :3]])  # (N, 4)
    y = arr[:, 3]  # (N,)
    w = 1.0 / y if relative else np.ones_like(y)  # (N,)

    def fit(cols: list[int]) -> tuple[np.ndarray, float]:
        if np.linalg.matrix_rank(X[:, cols]) < len(cols):
            raise ValueError("points must vary prefill tokens and decode rows (the fit is otherwise underdetermined)")
        coef, _ = nonneg_lstsq(X[:, cols] * w[:, None], y * w)
        full = np.zeros(4)
        full[cols] = coef
        return full, float(np.sqrt(np.mean(((X @ full - y) * w) ** 2)))

    coef, err = fit([0, 1, 2])
    if use_context or (use_context is None and np.ptp(arr[:, 2]) > 0):
        coef4, err4 = fit([0, 1, 2, 3])
        if use_context or (err4 <= 0.9 * err and coef4[3] > 0):
            coef = coef4
    resid = X @ coef - y
    a, b, c, d = (float(v) for v in coef)
    rms = float(np.sqrt(np.mean(resid**2)))
    return CostModel(a, b, c, d, rms, float(np.max(np.abs(resid) / y)), len(arr), dict(meta or {}))


# ----------------------------------------------------------------------------- calibration on this machine
@dataclass(frozen=True)
class CalibrationPoint:
    shape: StepShape
    samples_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)


def _spy(engine, sink: list) -> None:
    """Record (shape, sequences, tokens) of every batch this engine's scheduler returns (this instance only)."""
    schedule = engine.scheduler.schedule

    def recorded(*args, **kwargs):
        batch = schedule(*args, **kwargs)
        if batch.seqs:
            sink.append((step_shape(batch), len(batch), batch.total_tokens))
        return batch

    engine.scheduler.schedule = recorded


def _model_key(engine) -> str:
    cfg = engine.hf_model.config
    name = Path(str(getattr(cfg, "_name_or_path", "") or "model")).name or "model"
    return f"{name}-L{cfg.num_hidden_layers}-H{cfg.hidden_size}-{str(engine.model.dtype).removeprefix('torch.')}"


def measure_step_times(
    engine,
    pool: SequenceABC[int],
    *,
    decode_rows: SequenceABC[int] = (0, 1, 4, 8, 16),
    prefill_tokens: SequenceABC[int] = (0, 64, 256, 512),
    context_lens: SequenceABC[int] = (32, 256),
    repeats: int = 3,
) -> list[CalibrationPoint]:
    """Time whole ``engine.step()`` calls (schedule, forward, sample, postprocess) over a grid: ``rows``
    sequences decoding with prompts of ``context_len`` tokens, plus one new prompt of ``p`` tokens in the
    same step (p = 0: decode only). The first pass over the grid is a warm-up and is thrown away."""
    from course_lib.engine import Engine

    rows_grid = sorted({int(r) for r in decode_rows})
    pre_grid = sorted({int(p) for p in prefill_tokens})
    if min(rows_grid) < 0 or min(pre_grid) < 0 or not any(pre_grid) or max(rows_grid) == 0:
        raise ValueError("decode_rows and prefill_tokens must be ints ≥ 0, each with at least one positive value")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    steps_needed = (repeats + 1) * len(pre_grid) + 2
    cfg = SchedulerConfig(
        max_num_seqs=max(rows_grid) + 1,
        max_num_batched_tokens=max(max(pre_grid) + max(rows_grid), max(rows_grid) * max(context_lens)),
        chunked_prefill=False,
    )
    eng = Engine(engine.hf_model, engine.tokenizer, device=engine.device, config=cfg)
    shapes: list[tuple[StepShape, int, int]] = []
    _spy(eng, shapes)
    samples: dict[tuple[int, int, int], list[tuple[StepShape, float]]] = {}
    combos = [(0, 0)] + [(r, c) for r in rows_grid if r > 0 for c in context_lens]
    for rows, ctx in combos:
        for i in range(rows):
            eng.add_request(
                list(pool[i * 7 : i * 7 + ctx]), SamplingParams(max_new_tokens=steps_needed + 2, ignore_eos=True)
            )
        while any(s.num_output_tokens == 0 for s in eng.scheduler.running) or eng.scheduler.waiting:
            eng.step()  # prefill the decoders (not timed)
        for rep in range(repeats + 1):
            for p in pre_grid:
                if p == 0 and rows == 0:
                    continue
                if p:
                    eng.add_request(list(pool[1000 : 1000 + p]), SamplingParams(max_new_tokens=1, ignore_eos=True))
                t0 = time.perf_counter()
                eng.step()
                dt = time.perf_counter() - t0
                if rep > 0:
                    samples.setdefault((p, rows, ctx), []).append((shapes[-1][0], dt))
        for rid in list(eng._live):
            eng.abort(rid)
    out = []
    for got in samples.values():
        ctx_mean = round(statistics.fmean(sh.decode_context for sh, _ in got))
        shape = StepShape(got[0][0].prefill_tokens, got[0][0].decode_rows, ctx_mean)
        out.append(CalibrationPoint(shape, tuple(dt for _, dt in got)))
    return out


def calibrate(engine, pool: SequenceABC[int], *, use_context: bool | None = None, **grid) -> CostModel:
    """Measure step times on this machine (``measure_step_times``) and fit the cost model to their medians."""
    points = measure_step_times(engine, pool, **grid)
    meta = {
        "model": _model_key(engine),
        "machine": platform.processor() or platform.machine(),
        "threads": _threads(),
        "max_model_len": engine.config.max_model_len,
        "kv_layout": [engine.model.num_layers, engine.model.num_kv_heads, engine.model.head_dim],
        "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
        "points": [[*dataclasses.astuple(p.shape), p.median_s] for p in points],
    }
    return fit_cost_model(
        [(*dataclasses.astuple(p.shape), p.median_s) for p in points], use_context=use_context, meta=meta
    )


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def calibration_path(engine) -> Path:
    """Where ``load_or_calibrate`` caches this engine's cost model: under ``corpus.cache_dir()/serving``."""
    from course_lib.models.corpus import cache_dir

    return cache_dir() / "serving" / f"cost-{_model_key(engine)}-{platform.machine()}-{_threads()}t.json"


def load_or_calibrate(engine, pool: SequenceABC[int], *, path: str | Path | None = None, refresh: bool = False, **grid):
    """The cached cost model for this engine and machine, or a fresh calibration (then cached)."""
    path = Path(path) if path is not None else calibration_path(engine)
    if path.exists() and not refresh:
        return CostModel.load(path)
    model = calibrate(engine, pool, **grid)
    model.save(path)
    return model


# ----------------------------------------------------------------------------- a KV cache without tensors
class SimContiguousBackend(ContiguousBackend):
    """The contiguous cache's slot accounting (rows, lengths, bytes) without its tensors."""

    name = "sim-contiguous"

    def _ensure_capacity(self, rows: int) -> None:
        pass  # bookkeeping only: never allocate the K/V tensors

    def prepare(self, *args, **kwargs):
        raise RuntimeError("a simulated backend holds no K/V: it cannot run a forward")

    forward = prepare


class SimPagedBackend(PagedBackend):
    """The paged cache's block accounting (``BlockManager``: blocks, reference counts) without its pools."""

    name = "sim-paged"

    def _ensure_capacity(self, blocks: int) -> None:
        pass

    def prepare(self, *args, **kwargs):
        raise RuntimeError("a simulated backend holds no K/V: it cannot run a forward")

    forward = prepare


def sim_backend(
    config: SchedulerConfig,
    kv_cache: str = "contiguous",
    block_size: int = 16,
    layout=(6, 2, 32),
    prefix_caching: bool = False,
):
    """A bookkeeping backend sized exactly as ``Engine`` sizes the real one for ``config`` (``max_model_len``
    must be set). ``layout``: (layers, kv_heads, head_dim), only for the byte counts. ``prefix_caching``
    (paged only): the paged backend's own prefix cache, blocks shared by reference count."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
    if prefix_caching and kv_cache != "paged":
        raise ValueError("prefix_caching needs kv_cache='paged' (blocks that sequences can share)")
    if config.max_model_len is None:
        raise ValueError("config.max_model_len must be set (the engine takes it from the model)")
    layers, heads, hd = (int(x) for x in layout)
    if kv_cache == "paged":
        tokens = config.max_kv_tokens or config.max_num_seqs * config.max_model_len
        blocks = -(-tokens // block_size)
        extra = {"prefix_caching": True} if prefix_caching else {}  # only where the backend has it
        return SimPagedBackend(layers, heads, hd, blocks, block_size, config.max_model_len, decode="gather", **extra)
    rows = config.max_num_seqs
    if config.max_kv_tokens is not None:
        rows = min(rows, config.max_kv_tokens // config.max_model_len)
        if rows == 0:
            raise ValueError("config.max_kv_tokens cannot hold one sequence of max_model_len tokens")
    return SimContiguousBackend(layers, heads, hd, config.max_model_len, rows)


# ----------------------------------------------------------------------------- results
@dataclass(frozen=True)
class StepRecord:
    start_s: float  # s after the run started
    dt_s: float
    shape: StepShape


@dataclass
class RunResult:
    """One replay of a trace (``mode`` "sim" or "real"): per-request traces, their summary, every step."""

    mode: str
    config: SchedulerConfig
    traces: list[RequestTrace]
    summary: ServingSummary
    steps: list[StepRecord]
    makespan_s: float  # first arrival → last token
    num_preemptions: int = 0
    max_step_tokens: int = 0  # the most tokens any step held (≤ max_num_batched_tokens)
    max_step_seqs: int = 0  # the most sequences any step held (≤ max_num_seqs)
    max_kv_tokens: int = 0  # the most KV tokens reserved at once
    kv_capacity_tokens: int = 0  # what the cache could hold
    engine: object = None  # run_real: the Engine it built (its backend's counters, e.g. prefix hits)

    @property
    def throughput(self) -> float:
        """Output tokens/s over the run's window."""
        return self.summary.output_tokens_per_s

    @property
    def busy_s(self) -> float:
        """Σ step durations (the virtual clock's advance, in a simulation without idle gaps)."""
        return sum(s.dt_s for s in self.steps)

    def max_itl(self, request_ids=None) -> float:
        """The longest gap between two consecutive tokens of one request (of ``request_ids``, default all)."""
        keep = None if request_ids is None else set(request_ids)
        gaps = [g for t in self.traces if keep is None or t.request_id in keep for g in t.itl]
        return max(gaps) if gaps else math.nan

    def metrics(self) -> dict[str, float]:
        s = self.summary
        out = {
            "throughput": s.output_tokens_per_s,
            "ttft_p50": s.ttft[50],
            "ttft_p99": s.ttft[99],
            "tpot_p50": s.tpot[50],
            "tpot_p99": s.tpot[99],
            "latency_p50": s.latency[50],
            "latency_p99": s.latency[99],
            "max_itl": self.max_itl(),
        }
        if s.slo is not None:
            out["goodput_rps"] = s.goodput_rps
            out["slo_attainment"] = s.slo_attainment
        return out


def _summary(traces: list[RequestTrace], slo: SLO | None) -> ServingSummary:
    return summarize(traces, slo=slo, ps=(50, 90, 99))


def _schedule(scheduler: Scheduler, now: float) -> ScheduledBatch:
    """``schedule(now=...)`` where the scheduler takes a clock (the dynamic policy), else ``schedule()``."""
    try:
        takes_now = "now" in inspect.signature(scheduler.schedule).parameters
    except (TypeError, ValueError):
        takes_now = False
    return scheduler.schedule(now=now) if takes_now else scheduler.schedule()


def _check_trace(trace: Trace, config: SchedulerConfig, max_tokens_per_seq: int, chunking: bool) -> None:
    if not isinstance(trace, Trace):
        raise ValueError(f"trace must be a Trace, got {type(trace).__name__}")
    for i, r in enumerate(trace.requests):
        need = r.prompt_len + r.max_new_tokens
        if need > min(config.max_model_len, max_tokens_per_seq):
            raise ValueError(
                f"trace request {i} needs {need} tokens of context; the engine holds "
                f"{min(config.max_model_len, max_tokens_per_seq)} per sequence"
            )
        if not chunking and need > config.max_num_batched_tokens:
            raise ValueError(
                f"trace request {i} has {need} tokens, more than max_num_batched_tokens="
                f"{config.max_num_batched_tokens} with chunked prefill off: it could never run"
            )


# ----------------------------------------------------------------------------- the simulation
def simulate(
    trace: Trace,
    config: SchedulerConfig,
    cost_model: CostModel,
    *,
    kv_cache: str = "contiguous",
    block_size: int = 16,
    slo: SLO | None = None,
    pool: SequenceABC[int] | None = None,
    prefix_caching: bool = False,
) -> RunResult:
    """Replay ``trace`` through the engine's ``Scheduler`` on a virtual clock: each step costs
    ``cost_model.batch_time(batch)``; every request generates exactly ``max_new_tokens`` (EOS ignored).
    Arrivals join between steps, as in the real loop; when nothing can run the clock jumps to the next
    arrival (or to the oldest waiting request's ``max_wait_s`` deadline under a dynamic policy).
    ``pool``: token ids for the prompts (only their identity matters, for prefix caching); default a
    synthetic pool."""
    if not isinstance(cost_model, CostModel):
        raise ValueError(f"cost_model must be a CostModel, got {type(cost_model).__name__}")
    if not isinstance(config, SchedulerConfig):
        raise ValueError(f"config must be a SchedulerConfig, got {type(config).__name__}")
    if config.max_model_len is None:
        config = dataclasses.replace(config, max_model_len=int(cost_model.meta.get("max_model_len", 1024)))
    layout = cost_model.meta.get("kv_layout", (6, 2, 32))
    backend = sim_backend(config, kv_cache, block_size, layout, prefix_caching)
    _check_trace(trace, config, backend.max_tokens_per_seq(), config.chunked_prefill)
    scheduler = Scheduler(config, backend)
    if pool is None:
        pool = [(7 * i + 3) % 4093 + 2 for i in range(trace.pool_tokens)]
    ids = trace.prompt_ids(pool)
    seqs = [
        Sequence(i, p, SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True), r.arrival_s)
        for i, (r, p) in enumerate(zip(trace.requests, ids))
    ]
    max_wait = getattr(config, "max_wait_s", None)
    bpt = backend.bytes_per_token
    capacity = _kv_capacity(backend)
    now, nxt, stalls = seqs[0].arrival, 0, 0
    steps: list[StepRecord] = []
    max_tokens = max_seqs = max_kv = 0
    while nxt < len(seqs) or scheduler.has_unfinished():
        while nxt < len(seqs) and seqs[nxt].arrival <= now:
            scheduler.add(seqs[nxt])
            nxt += 1
        batch = _schedule(scheduler, now)
        if not batch.seqs:
            wake = [seqs[nxt].arrival] if nxt < len(seqs) else []
            if scheduler.waiting and hasattr(scheduler, "wait_time"):
                wake.append(now + scheduler.wait_time(now))  # inf when a batch must finish first
            elif scheduler.waiting and max_wait:
                wake.append(min(s.arrival for s in scheduler.waiting) + max_wait)
            wake = [t for t in wake if math.isfinite(t)]
            wake = [t for t in wake if t > now]
            stalls += 1
            if not wake or stalls > 10_000:  # dynamic batching may wait through many arrivals
                raise RuntimeError(
                    f"the scheduler made no progress at t={now:.4f} s with {len(scheduler.waiting)} waiting and "
                    f"{len(scheduler.running)} running requests (does a request fit the KV budget?)"
                )
            now = min(wake)
            continue
        stalls = 0
        shape = step_shape(batch)
        dt = cost_model.shape_time(shape)
        steps.append(StepRecord(now, dt, shape))
        max_tokens, max_seqs = max(max_tokens, batch.total_tokens), max(max_seqs, len(batch))
        max_kv = max(max_kv, backend.bytes_reserved() // bpt)
        now += dt
        # postprocess, as Engine.step does: a sequence whose prompt is complete emits a token now
        for seq, n in zip(batch.seqs, batch.num_tokens):
            done = seq.num_cached_tokens + n == seq.num_tokens
            seq.num_cached_tokens += n
            if done:
                seq.token_ids.append(1)
                seq.token_times.append(now)
                if seq.num_output_tokens >= seq.params.max_new_tokens:
                    scheduler.finish(seq, "length", now)
    traces = [s.trace for s in seqs]
    return RunResult(
        "sim",
        config,
        traces,
        _summary(traces, slo),
        steps,
        max(t.token_times[-1] for t in traces) - seqs[0].arrival,
        sum(s.num_preemptions for s in seqs),
        max_tokens,
        max_seqs,
        max_kv,
        capacity,
    )


# ----------------------------------------------------------------------------- the real run
def run_real(
    engine,
    trace: Trace,
    config: SchedulerConfig,
    *,
    pool: SequenceABC[int] | None = None,
    kv_cache: str = "contiguous",
    slo: SLO | None = None,
    warmup: bool = True,
    prefix_caching: bool = False,
) -> RunResult:
    """Replay ``trace`` on a real ``Engine`` built around ``engine``'s model with ``config``: a request is
    added once its arrival time has passed on the wall clock, ``step()`` runs otherwise, and the loop sleeps
    until the next arrival when idle. Every token's time is the engine's own event time."""
    from course_lib.engine import Engine
    from course_lib.serving.workload import prompt_pool

    extra = {"prefix_caching": True} if prefix_caching else {}  # only where the engine has it
    eng = Engine(engine.hf_model, engine.tokenizer, device=engine.device, config=config, kv_cache=kv_cache, **extra)
    _check_trace(trace, eng.config, eng.backend.max_tokens_per_seq(), eng.config.chunked_prefill)
    if pool is None:
        pool = prompt_pool(engine.tokenizer, trace.pool_tokens)
    ids = trace.prompt_ids(pool)
    reqs = trace.requests
    if warmup:  # first calls pay for allocation and kernel selection; the KV rows are reused afterwards
        warm = sorted(range(len(ids)), key=lambda i: -len(ids[i]))[: min(4, config.max_num_seqs)]
        eng.generate([ids[i] for i in warm], SamplingParams(max_new_tokens=3, ignore_eos=True))
    shapes: list[tuple[StepShape, int, int]] = []
    _spy(eng, shapes)
    steps: list[StepRecord] = []
    seqs: list[Sequence] = []
    max_tokens = max_seqs = max_kv = 0
    start = time.perf_counter() - reqs[0].arrival_s
    while len(seqs) < len(reqs) or eng.has_unfinished():
        now = time.perf_counter() - start
        while len(seqs) < len(reqs) and reqs[len(seqs)].arrival_s <= now:
            i = len(seqs)
            params = SamplingParams(max_new_tokens=reqs[i].max_new_tokens, ignore_eos=True)
            seqs.append(eng.add_request(ids[i], params, request_id=i, arrival=start + reqs[i].arrival_s))
        n_before = len(shapes)
        t0 = time.perf_counter()
        eng.step()
        t1 = time.perf_counter()
        if len(shapes) > n_before:
            sh, n_seqs, n_tokens = shapes[-1]
            steps.append(StepRecord(t0 - start, t1 - t0, sh))
            max_seqs, max_tokens = max(max_seqs, n_seqs), max(max_tokens, n_tokens)
            max_kv = max(max_kv, eng.backend.bytes_reserved() // max(1, _bytes_per_token(eng.backend)))
        elif not eng.scheduler.running:
            wait = reqs[len(seqs)].arrival_s - (t1 - start) if len(seqs) < len(reqs) else 0.0
            time.sleep(min(max(wait, 0.0), 0.05) if wait > 0 else 5e-4)
    traces = [s.trace for s in seqs]
    return RunResult(
        "real",
        eng.config,
        traces,
        _summary(traces, slo),
        steps,
        max(t.token_times[-1] for t in traces) - (start + reqs[0].arrival_s),
        sum(s.num_preemptions for s in seqs),
        max_tokens,
        max_seqs,
        max_kv,
        _kv_capacity(eng.backend),
        eng,
    )


def _kv_capacity(backend) -> int:
    """Tokens the cache can hold over all sequences (0 if the backend does not say)."""
    if isinstance(backend, PagedBackend):
        return backend.num_blocks * backend.block_size
    if isinstance(backend, ContiguousBackend):
        return backend.max_seqs * backend.max_len
    return 0


def _bytes_per_token(backend) -> int:
    return int(getattr(backend, "bytes_per_token", 0) or 0)


# ----------------------------------------------------------------------------- sim vs real, sweeps
COMPARED = ("throughput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")


@dataclass
class SimVsReal:
    """The same trace and policy, simulated and run: each metric and the ratio sim / real."""

    sim: RunResult
    real: RunResult

    def ratios(self) -> dict[str, float]:
        s, r = self.sim.metrics(), self.real.metrics()
        return {k: s[k] / r[k] if r[k] else math.nan for k in COMPARED}

    def within(self, tol: float = 0.2, keys=("throughput", "tpot_p50")) -> bool:
        """Do the simulated ``keys`` lie within ±``tol`` of the measured ones?"""
        rat = self.ratios()
        return all(abs(rat[k] - 1) <= tol for k in keys)

    def table(self) -> str:
        s, r, rat = self.sim.metrics(), self.real.metrics(), self.ratios()
        lines = [f"{'metric':<16}{'sim':>10}{'real':>10}{'sim/real':>10}"]
        for k in COMPARED:
            scale, unit = (1.0, "tok/s") if k == "throughput" else (1e3, "ms")
            lines.append(f"{k + ' ' + unit:<16}{s[k] * scale:>10.1f}{r[k] * scale:>10.1f}{rat[k]:>10.2f}")
        return "\n".join(lines)


def compare(
    engine,
    trace: Trace,
    config: SchedulerConfig,
    cost_model: CostModel,
    *,
    pool: SequenceABC[int] | None = None,
    kv_cache: str = "contiguous",
    slo: SLO | None = None,
    prefix_caching: bool = False,
) -> SimVsReal:
    """Run ``trace`` under ``config`` on the real engine and in the simulator (the same prompt ids)."""
    from course_lib.serving.workload import prompt_pool

    if pool is None:
        pool = prompt_pool(engine.tokenizer, trace.pool_tokens)
    kw = dict(pool=pool, kv_cache=kv_cache, slo=slo, prefix_caching=prefix_caching)
    real = run_real(engine, trace, config, **kw)
    sim = simulate(trace, real.config, cost_model, **kw)
    return SimVsReal(sim, real)


@dataclass(frozen=True)
class SweepPoint:
    policy: str  # the label given to the config
    rate: float  # requests/s
    mode: str  # "sim" or "real"
    metrics: dict


def sweep(
    trace: Trace,
    configs: dict[str, SchedulerConfig],
    rates: SequenceABC[float],
    cost_model: CostModel,
    *,
    slo: SLO | None = None,
    engine=None,
    real_rates: SequenceABC[float] = (),
    kv_cache: str = "contiguous",
) -> list[SweepPoint]:
    """Throughput, latency percentiles and goodput per policy across arrival rates: ``trace`` rescaled to
    each rate (``Trace.with_rate``) and simulated; also run on ``engine`` at ``real_rates`` (keep those few)."""
    if not configs:
        raise ValueError("configs must name at least one SchedulerConfig")
    rates = [float(r) for r in rates]
    if not rates or any(not r > 0 for r in rates):
        raise ValueError(f"rates must be positive numbers, got {rates!r}")
    if real_rates and engine is None:
        raise ValueError("real_rates needs an engine")
    pool = None
    if real_rates:
        from course_lib.serving.workload import prompt_pool

        pool = prompt_pool(engine.tokenizer, trace.pool_tokens)
    out = []
    for label, cfg in configs.items():
        for rate in rates:
            res = simulate(trace.with_rate(rate), cfg, cost_model, kv_cache=kv_cache, slo=slo, pool=pool)
            out.append(SweepPoint(label, rate, "sim", res.metrics()))
        for rate in real_rates:
            res = run_real(engine, trace.with_rate(rate), cfg, pool=pool, kv_cache=kv_cache, slo=slo)
            out.append(SweepPoint(label, float(rate), "real", res.metrics()))
    return out


__all__ = [
    "CalibrationPoint",
    "CostModel",
    "RunResult",
    "SimContiguousBackend",
    "SimPagedBackend",
    "SimVsReal",
    "StepRecord",
    "StepShape",
    "SweepPoint",
    "calibrate",
    "calibration_path",
    "compare",
    "fit_cost_model",
    "load_or_calibrate",
    "measure_step_times",
    "run_real",
    "sim_backend",
    "simulate",
    "step_shape",
    "sweep",
]
