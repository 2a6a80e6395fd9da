"""The KV cache: what it saves (work), what it costs (memory), measured on the engine and sized for real models.

Without a cache every decode step runs the whole sequence again: the step that makes a sequence L tokens
long is a prefill of L − 1 tokens, compute-bound, and the total work to reach L grows as L². With the
cache a step is one token attending to the L − 1 stored keys: it streams the weights and the cache once,
bandwidth-bound, and the total grows as L (plus a small quadratic attention term). ``kv_on_off`` measures
both on the course engine next to the library's FLOP model; ``engine_kv_check`` checks the size formula
2 · layers · kv_heads · head_dim · bytes per token against the bytes the engine's cache tensors really
hold; ``kv_gb`` / ``fit_requests`` / ``kv_table`` / ``kv_explorer`` turn the same formula into
gigabytes and concurrent requests on a GPU. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from course_lib.core.dtypes import DTYPE_NAMES, canonical
from course_lib.measure.costs import check_positive_int
from course_lib.models.accounting import (
    PRESETS,
    ModelShape,
    decode_flops,
    kv_bytes_per_token,
    prefill_flops,
    weight_bytes,
)

#: dtypes the explorer offers (those of the GPU datasheet table)
KV_DTYPES = ("bf16", "fp16", "fp8", "fp32")
#: contexts the explorer's slider offers: 512 … 128k tokens
CONTEXTS = tuple(2**i for i in range(9, 18))
#: batches the explorer's slider offers: 1 … 256
BATCHES = tuple(2**i for i in range(9))
#: vLLM's default gpu_memory_utilization (data/references.json: vllm_gpu_memory_utilization)
USABLE = 0.9


# ----------------------------------------------------------------------------- argument checks
def _shape(model) -> ModelShape:
    if isinstance(model, ModelShape):
        return model
    key = model.strip().lower() if isinstance(model, str) else None
    if key not in PRESETS:
        raise ValueError(f"model must be a preset name, one of {sorted(PRESETS)}, or a ModelShape; got {model!r}")
    return PRESETS[key]


def _dtype(name: str, value) -> str:
    try:
        return canonical(value)
    except (ValueError, TypeError):
        raise ValueError(f"{name} must be one of {list(DTYPE_NAMES)} (or an alias such as 'bfloat16'), got {value!r}")


def _gpu(gpu):
    from course_lib.measure.hardware import GpuSpec, gpu_names, gpu_spec

    if isinstance(gpu, GpuSpec):
        return gpu
    try:
        return gpu_spec(gpu)
    except ValueError:
        raise ValueError(f"gpu must be one of {list(gpu_names())} (or NVIDIA's device name), got {gpu!r}") from None


def _usable(usable) -> float:
    if isinstance(usable, bool) or not isinstance(usable, (int, float)) or not 0 < usable <= 1:
        raise ValueError(f"usable must be a fraction in (0, 1], got {usable!r}")
    return float(usable)


def attention_kind(shape: ModelShape) -> str:
    """'MHA' (a KV head per query head), 'MQA' (one KV head for all) or 'GQA' (groups in between)."""
    if shape.num_kv_heads == shape.num_heads:
        return "MHA"
    return "MQA" if shape.num_kv_heads == 1 else "GQA"


# ----------------------------------------------------------------------------- 1. KV cache on vs off
def step_flops(shape: ModelShape, length: int, prompt_len: int, use_kv_cache: bool) -> float:
    """FLOPs of the step whose token makes the sequence ``length`` tokens long (batch 1).

    The first step is the prefill of the prompt either way. After it, without a cache the step is a
    prefill of all ``length − 1`` tokens so far; with it, one token attending to ``length − 1`` keys."""
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("length", length)
    if length <= prompt_len:
        raise ValueError(f"length must exceed prompt_len ({prompt_len}): a step adds a token, got {length}")
    if length == prompt_len + 1 or not use_kv_cache:
        return prefill_flops(shape, length - 1)
    return decode_flops(shape, length - 1)


def total_flops(shape: ModelShape, length: int, prompt_len: int, use_kv_cache: bool) -> float:
    """FLOPs of generating from a ``prompt_len``-token prompt until the sequence is ``length`` tokens long:
    Σ prefill(n) for n < length without a cache (∝ L²), prefill + Σ decode with it (∝ L); the cached
    total equals ``roofline.generation_flops(shape, prompt_len, length − prompt_len)``."""
    check_positive_int("length", length)
    return sum(step_flops(shape, n, prompt_len, use_kv_cache) for n in range(prompt_len + 1, length + 1))


@dataclass(frozen=True)
class StepCost:
    """Time of one engine step predicted as ``fixed_s + FLOPs / flop_rate``; both numbers come from two
    separate no-cache steps (over 2 and ``calib_tokens`` tokens, mean of at least 11 timings each),
    never from a fit to the series they predict."""

    fixed_s: float  # what a step costs besides its FLOPs: Python, dispatch, sampling, reading the weights
    flop_rate: float  # FLOP/s one more FLOP of a forward runs at, on this machine, for this model
    calib_tokens: int

    def seconds(self, flops: float) -> float:
        return self.fixed_s + flops / self.flop_rate


@dataclass(frozen=True)
class KvOnOffRow:
    """One sequence length L: measured (median over repeats) and predicted times, with and without the cache."""

    length: int
    cached_step_s: float  # the step that made the sequence L tokens long
    nocache_step_s: float
    cached_total_s: float  # from the start of the request until the sequence is L tokens long
    nocache_total_s: float
    cached_flops: float  # total FLOPs up to L (the FLOP model)
    nocache_flops: float
    predicted_cached_total_s: float
    predicted_nocache_total_s: float

    @property
    def speedup(self) -> float:
        """How many times faster the cache made generating up to L."""
        return self.nocache_total_s / self.cached_total_s

    @property
    def flop_ratio(self) -> float:
        """How many times more work the no-cache path does up to L (the FLOP model's prediction of ``speedup``
        if time were all FLOPs)."""
        return self.nocache_flops / self.cached_flops


@dataclass(frozen=True)
class KvOnOff:
    """``kv_on_off``'s result: one row per length, the step-cost model used for the prediction, and whether
    both paths produced the same greedy tokens."""

    engine: str
    device: str
    prompt_len: int
    repeats: int
    threads: int
    cost: StepCost
    same_tokens: bool
    rows: tuple[KvOnOffRow, ...]
    shape: ModelShape

    def predicted_totals(self, length: int) -> tuple[float, float]:
        """(with cache, without) predicted seconds to reach ``length`` tokens."""
        return tuple(
            sum(
                self.cost.seconds(step_flops(self.shape, n, self.prompt_len, kv))
                for n in range(self.prompt_len + 1, length + 1)
            )
            for kv in (True, False)
        )

    def __str__(self) -> str:
        c = self.cost
        lines = [
            f"{self.engine} on {self.device}, batch 1, prompt {self.prompt_len} tokens, median of {self.repeats}, "
            f"{self.threads} thread(s); greedy tokens {'identical' if self.same_tokens else 'DIFFER'} with and without cache",
            f"prediction: step = {c.fixed_s * 1e3:.2f} ms + FLOPs / {c.flop_rate / 1e9:.2f} GFLOP/s "
            f"(from separate no-cache steps over 2 and {c.calib_tokens} tokens; nothing fitted to the rows)",
            f"{'L':>6} {'step cache':>11} {'step none':>10} {'total cache':>12} {'pred':>8} {'total none':>11} "
            f"{'pred':>8} {'speedup':>8} {'FLOP ratio':>10}",
        ]
        for r in self.rows:
            lines.append(
                f"{r.length:>6} {r.cached_step_s * 1e3:>8.2f} ms {r.nocache_step_s * 1e3:>7.2f} ms "
                f"{r.cached_total_s:>10.3f} s {r.predicted_cached_total_s:>6.3f} s {r.nocache_total_s:>9.3f} s "
                f"{r.predicted_nocache_total_s:>6.3f} s {r.speedup:>7.1f}x {r.flop_ratio:>9.1f}x"
            )
        return "\n".join(lines)


def _check_lengths(lengths) -> list[int]:
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise ValueError(f"lengths must be a non-empty list of ints >= 2 (sequence lengths), got {lengths!r}")
    values = list(lengths)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 2 for v in values):
        raise ValueError(f"lengths must be a non-empty list of ints >= 2 (sequence lengths), got {lengths!r}")
    return sorted(set(values))


def _engine(engine_name, max_len: int, device: str):
    from course_lib.engine import Engine, SchedulerConfig
    from course_lib.models.load import EMBEDDED

    if isinstance(engine_name, Engine):
        if engine_name.has_unfinished():
            raise ValueError("engine_name is an Engine with unfinished requests; kv_on_off needs an idle engine")
        if max_len > engine_name.config.max_model_len:
            raise ValueError(
                f"lengths and calib_tokens need max_model_len >= {max_len}, the engine has "
                f"{engine_name.config.max_model_len}"
            )
        name = Path(getattr(engine_name.hf_model.config, "_name_or_path", "") or "engine").name
        return engine_name, ModelShape.from_config(engine_name.hf_model.config, name=name), name
    if engine_name not in EMBEDDED:
        raise ValueError(
            f"engine_name must be one of the embedded models {list(EMBEDDED)} or an Engine, got {engine_name!r}"
        )
    shape = ModelShape.from_embedded(engine_name)
    if max_len > shape.max_position:
        raise ValueError(
            f"lengths must be <= {engine_name}'s context window of {shape.max_position} tokens, got {max_len}"
        )
    engine = Engine(engine_name, device=device, config=SchedulerConfig(max_num_seqs=1, max_model_len=max_len))
    return engine, shape, engine_name


def _run(engine, ids: list[int], new_tokens: int, use_kv_cache: bool) -> tuple[list[int], list[float]]:
    """Token ids and, per generated token, seconds from the request's start until it was on the host."""
    import time

    from course_lib.engine import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)  # greedy
    t0 = time.perf_counter()
    events = list(engine.events([ids], params, use_kv_cache=use_kv_cache))
    return [ev.token_id for ev in events], [ev.time - t0 for ev in events]


def _calibrate(engine, shape: ModelShape, ids: list[int], calib_tokens: int, repeats: int) -> StepCost:
    """Time a no-cache step over 2 tokens and one over ``calib_tokens`` tokens: the slope between them is
    the FLOP rate, the intercept the fixed cost of a step. Each is the second step of a 2-token no-cache
    generation, timed by the engine's token events exactly as the series is (no request set-up inside)."""
    prompt = (ids * (calib_tokens // len(ids) + 1))[: calib_tokens - 1]  # (calib_tokens − 1,) ids
    n = max(11, repeats)

    def step_s(tokens: list[int]) -> float:
        # Mean, not median: a total is a sum of steps, and on a shared CPU step times are often bimodal
        # (alone on a core or not), so the median lands on either mode while the mean is what a sum sees.
        _run(engine, tokens, 2, False)  # warm-up
        return statistics.fmean(t[1] - t[0] for t in (_run(engine, tokens, 2, False)[1] for _ in range(n)))

    t2, tn = step_s(prompt[:1]), step_s(prompt)
    f2, fn = prefill_flops(shape, 2), prefill_flops(shape, calib_tokens)
    if tn <= t2:
        raise RuntimeError(
            f"calibration failed: a step over {calib_tokens} tokens ({tn * 1e3:.2f} ms) was not slower than "
            f"one over 2 tokens ({t2 * 1e3:.2f} ms); the machine is too noisy, raise calib_tokens"
        )
    rate = (fn - f2) / (tn - t2)
    return StepCost(max(0.0, t2 - f2 / rate), rate, calib_tokens)


def kv_on_off(
    engine_name="tiny-target",
    lengths: SequenceABC[int] = (16, 32, 64, 128, 256),
    repeats: int = 3,
    *,
    prompt: str = "def f(x):",
    calib_tokens: int = 128,
    threads: int | None = None,
    device: str = "cpu",
) -> KvOnOff:
    """Generate greedily at batch 1 with the KV cache (the contiguous backend) and without it (the engine's
    ``use_kv_cache=False``: every step recomputes the whole sequence), up to each of ``lengths`` (sequence
    lengths, prompt included), and compare with the FLOP model.

    Measured, per length L (median of ``repeats`` runs, after a warm-up run of each path): the time of the
    step that made the sequence L tokens long, and the total from the request's start to that token.
    Predicted: each step costs ``fixed_s + FLOPs / flop_rate`` (``StepCost``), FLOPs from
    ``accounting.prefill_flops`` / ``decode_flops`` (see ``step_flops``). The two constants come from two
    separate no-cache steps over 2 and ``calib_tokens`` tokens, timed before the series; nothing is fitted
    to, or scaled to match, the measured rows, so the prediction can miss and the gap is the lesson.
    ``engine_name``: an embedded model name (an engine is built with ``max_model_len`` = the longest length, or ``calib_tokens`` + 1)
    or an idle ``Engine``. ``threads``: torch threads while timing (default ``hardware.timing_threads()``:
    the idle cores). Introduced in 05_attention_kv_cache.ipynb."""
    import torch

    from course_lib.measure.hardware import timing_threads

    lengths = _check_lengths(lengths)
    check_positive_int("repeats", repeats)
    if isinstance(calib_tokens, bool) or not isinstance(calib_tokens, int) or calib_tokens < 3:
        raise ValueError(f"calib_tokens must be an int >= 3 (tokens in the calibration step), got {calib_tokens!r}")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
    if threads is not None:
        check_positive_int("threads", threads)
    engine, shape, name = _engine(engine_name, max(lengths[-1], calib_tokens + 1), device)
    [ids] = engine.encode([prompt])
    p = len(ids)
    if lengths[0] <= p:
        raise ValueError(f"lengths must all exceed the prompt's {p} tokens ({prompt!r}), got {lengths}")
    new = lengths[-1] - p
    saved = torch.get_num_threads()
    threads = threads or timing_threads()
    torch.set_num_threads(threads)
    try:
        cost = _calibrate(engine, shape, ids, calib_tokens, repeats)
        warm = min(new, lengths[0] - p + 1)
        for kv in (True, False):
            _run(engine, ids, warm, kv)
        times: dict[bool, list[list[float]]] = {True: [], False: []}
        tokens: dict[bool, list[int]] = {}
        for _ in range(repeats):  # alternate the paths so that a noisy spell hits both
            for kv in (True, False):
                toks, t = _run(engine, ids, new, kv)
                tokens.setdefault(kv, toks)
                times[kv].append(t)
    finally:
        torch.set_num_threads(saved)

    def median(kv: bool, length: int, step: bool) -> float:
        i = length - p - 1  # index of the token that made the sequence `length` long
        return statistics.median(t[i] - (t[i - 1] if step and i else 0.0) for t in times[kv])

    rows = []
    for L in lengths:
        steps = range(p + 1, L + 1)
        flops = {kv: [step_flops(shape, n, p, kv) for n in steps] for kv in (True, False)}
        rows.append(
            KvOnOffRow(
                L,
                median(True, L, True),
                median(False, L, True),
                median(True, L, False),
                median(False, L, False),
                sum(flops[True]),
                sum(flops[False]),
                sum(map(cost.seconds, flops[True])),
                sum(map(cost.seconds, flops[False])),
            )
        )
    return KvOnOff(
        name, str(engine.device), p, repeats, threads, cost, tokens[True] == tokens[False], tuple(rows), shape
    )


def plot_kv_on_off(result: KvOnOff, *, ax=None):
    """Total time to reach each length, with and without the cache: measured points and the predicted curves
    (``fixed_s + FLOPs / flop_rate`` per step, constants from separate no-cache steps), on log-log axes where
    the no-cache line's slope of ~2 against the cached one's ~1 is the L² vs L of the FLOP model."""
    from course_lib.measure.plots import new_axes

    if not isinstance(result, KvOnOff):
        raise ValueError(f"result must be the KvOnOff that kv_on_off returns, got {type(result).__name__}")
    fig, ax = new_axes(ax)
    p, last = result.prompt_len, result.rows[-1].length
    xs = np.unique(np.geomspace(p + 1, last, 60).round().astype(int))
    curves = np.array([result.predicted_totals(int(x)) for x in xs])  # (len(xs), 2)
    lengths = [r.length for r in result.rows]
    for col, kv, marker, label in ((0, True, "o", "KV cache"), (1, False, "s", "no cache (recompute)")):
        (line,) = ax.plot(xs, curves[:, col], "--", lw=1.2, label=f"{label}: predicted")
        measured = [r.cached_total_s if kv else r.nocache_total_s for r in result.rows]
        ax.plot(lengths, measured, marker, ms=7, color=line.get_color(), label=f"{label}: measured", zorder=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L (tokens, prompt included)")
    ax.set_ylabel("time to generate up to L (s)")
    ax.set_title(f"{result.engine}: KV cache on vs off (batch 1, {result.device})")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig, ax


# ----------------------------------------------------------------------------- 2. formula vs the engine's tensors
@dataclass(frozen=True)
class KvCheck:
    """KV bytes per token from the formula and from the engine's cache tensors (``.nbytes`` / slots)."""

    model: str
    dtype: str
    formula_bytes_per_token: float  # accounting.kv_bytes_per_token
    tensor_bytes_per_token: float  # Σ nbytes of every layer's K and V / (rows · max_len)
    tensor_bytes: int  # Σ nbytes
    rows: int
    max_len: int

    @property
    def matches(self) -> bool:
        return self.formula_bytes_per_token == self.tensor_bytes_per_token

    def __str__(self) -> str:
        return (
            f"{self.model} {self.dtype}: formula 2·layers·kv_heads·head_dim·bytes = {self.formula_bytes_per_token:,.0f} "
            f"B/token; the engine's tensors hold {self.tensor_bytes:,} B for {self.rows} row(s) × {self.max_len} "
            f"slots = {self.tensor_bytes_per_token:,.0f} B/token ({'match' if self.matches else 'MISMATCH'})"
        )


def engine_kv_check(engine) -> KvCheck:
    """Compare ``accounting.kv_bytes_per_token`` with the bytes the engine's contiguous cache really holds.

    The cache allocates its rows on first use; if it has none yet, one row is allocated and freed again
    (the tensors stay, as they do after any request). Introduced in 05_attention_kv_cache.ipynb."""
    from course_lib.engine import Engine
    from course_lib.engine.attention import ContiguousBackend

    if not isinstance(engine, Engine):
        raise ValueError(f"engine must be a course_lib.engine.Engine, got {type(engine).__name__}")
    backend = engine.backend
    if not isinstance(backend, ContiguousBackend):
        raise ValueError(f"engine must use the contiguous KV cache, it uses {type(backend).__name__}")
    if not backend.k:
        backend.free(backend.allocate())
    tensors = backend.k + backend.v  # per layer (rows, kv_heads, max_len, head_dim)
    rows, _, max_len, _ = tensors[0].shape
    nbytes = sum(t.nbytes for t in tensors)
    config = engine.hf_model.config
    shape = ModelShape.from_config(config, name=Path(getattr(config, "_name_or_path", "") or "engine").name)
    dtype = canonical(backend.dtype)
    return KvCheck(
        shape.name, dtype, kv_bytes_per_token(shape, dtype), nbytes / (rows * max_len), nbytes, rows, max_len
    )


# ----------------------------------------------------------------------------- 3. calculator
def kv_gb(model, dtype: str = "bf16", context: int = 4096, batch: int = 1) -> float:
    """GB (1e9 bytes) of KV cache for ``batch`` sequences of ``context`` tokens: Llama-2-7B fp16 at 4096 ×
    1 is 2.15 GB (2 GiB). ``model``: a preset name or a ``ModelShape``."""
    shape = _shape(model)
    dtype = _dtype("dtype", dtype)
    check_positive_int("context", context)
    check_positive_int("batch", batch)
    return kv_bytes_per_token(shape, dtype) * context * batch / 1e9


def fit_requests(
    model, gpu, dtype: str = "bf16", context: int = 4096, weights_dtype: str | None = None, usable: float = USABLE
) -> int:
    """How many concurrent requests of ``context`` tokens fit, KV cache in ``dtype``, beside the weights
    (in ``weights_dtype``, default ``dtype``) in ``usable`` of one GPU's memory (``hardware.gpu_spec``;
    0.9 is vLLM's default ``gpu_memory_utilization``). 0 when not even one does, or the weights alone
    overflow. Activations and the CUDA context are not counted: a real engine fits somewhat fewer."""
    from course_lib.measure.roofline import fits_in_memory

    shape, spec = _shape(model), _gpu(gpu)
    dtype = _dtype("dtype", dtype)
    weights_dtype = dtype if weights_dtype is None else _dtype("weights_dtype", weights_dtype)
    check_positive_int("context", context)
    usable = _usable(usable)
    return fits_in_memory(shape, spec, 1, context, weights_dtype, kv_dtype=dtype, usable=usable).max_batch


def draw_kv(model, gpu, dtype: str, context: int, batch: int) -> tuple[Figure, str]:
    """The KV explorer's picture and text for one choice, weights and KV cache both in ``dtype``: weights
    + KV cache of ``batch`` requests against context, next to the GPU's usable memory. A ``Figure`` of its
    own (no pyplot state). A combination that cannot run (weights that do not fit, a dtype the GPU lacks,
    a context past the model's window) gives a line of text saying so, never an exception."""
    from course_lib.measure.roofline import device_bytes

    shape, spec = _shape(model), _gpu(gpu)
    dtype = _dtype("dtype", dtype)
    check_positive_int("context", context)
    check_positive_int("batch", batch)
    per_token = kv_bytes_per_token(shape, dtype)
    weights = weight_bytes(shape, dtype) / 1e9
    usable = device_bytes(spec) * USABLE / 1e9
    kv = kv_gb(shape, dtype, context, batch)
    fit = fit_requests(shape, spec, dtype, context)
    kind = attention_kind(shape)
    group = f", {shape.gqa_group} query heads per KV head" if kind == "GQA" else ""
    elem = per_token / (2 * shape.num_layers * shape.num_kv_heads * shape.head_dim)  # bytes per element
    lines = [
        f"{shape.name} {dtype} on {spec.name}: KV cache = 2 x {shape.num_layers} layers x {shape.num_kv_heads} "
        f"KV heads x {shape.head_dim} head_dim x {elem:g} B = {per_token / 1024:g} KiB per token ({kind}{group})",
        f"  {batch} request(s) x {context:,} tokens: KV cache {kv:,.2f} GB + weights {weights:,.2f} GB = "
        f"{kv + weights:,.2f} GB of {usable:,.1f} GB usable ({USABLE:.0%} of {spec.memory_gb:g} GiB)",
    ]
    if weights > usable:
        lines.append(
            f"  the weights alone ({weights:,.1f} GB) exceed the usable memory: no request fits on one {spec.name}"
        )
    elif fit == 0:
        lines.append(f"  not even one request of {context:,} tokens fits beside the weights")
    else:
        verdict = "fits" if batch <= fit else f"does NOT fit: batch {batch} > {fit}"
        lines.append(f"  at most {fit:,} concurrent request(s) of {context:,} tokens fit: batch {batch} {verdict}")
    if dtype in KV_DTYPES and not spec.supports(dtype):
        lines.append(
            f"note: {spec.name} has no {dtype} support (datasheet): sizes are counted in {dtype} as asked; "
            f"the chip would compute in {spec.best_dtype(dtype)}"
        )
    if context > shape.max_position:
        lines.append(f"note: {context:,} tokens exceed {shape.name}'s context window of {shape.max_position:,} tokens")

    fig = Figure(figsize=(7, 4), dpi=80)
    FigureCanvasAgg(fig)  # renders without pyplot
    ax = fig.add_subplot()
    xs = np.array(CONTEXTS if context in CONTEXTS else sorted({*CONTEXTS, context}), dtype=float)
    ax.plot(xs, weights + per_token * xs * batch / 1e9, "-", label=f"weights + KV cache, batch {batch}")
    ax.axhline(weights, color="grey", ls=":", label=f"weights {weights:,.1f} GB")
    ax.axhline(usable, color="red", ls="--", label=f"usable {usable:,.1f} GB ({spec.name})")
    ax.plot([context], [weights + kv], "o", ms=8, zorder=6, label=f"{context:,} tokens: {weights + kv:,.1f} GB")
    if context > shape.max_position:
        ax.axvline(shape.max_position, color="black", lw=0.8, label=f"context window {shape.max_position:,}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(CONTEXTS, [f"{c // 1024}k" if c >= 1024 else str(c) for c in CONTEXTS])
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens per request)")
    ax.set_ylabel("GB")
    ax.set_title(f"{shape.name} {dtype} on {spec.name}")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig, "\n".join(lines)


def kv_explorer_outputs(model, gpu, dtype: str, context: int, batch: int) -> tuple[dict, ...]:
    """The explorer's output area for one choice, as notebook outputs (a text stream and a PNG)."""
    from course_lib.measure.plots import as_outputs

    try:
        fig, text = draw_kv(model, gpu, dtype, context, batch)
    except ValueError as exc:
        return ({"output_type": "stream", "name": "stdout", "text": f"cannot size this combination: {exc}\n"},)
    return as_outputs(fig, text)


def kv_explorer(default_model: str = "llama-2-7b", default_gpu: str = "H100 SXM"):
    """An ipywidgets explorer: pick model, GPU, dtype, context (512 … 128k) and batch (1 … 256); see the KV
    cache's size and how many requests fit. ``draw_kv`` computes (tested); each change replaces the
    ``Output`` widget's outputs in one assignment, as ``plots.phase_explorer`` does."""
    import ipywidgets as widgets

    from course_lib.measure.hardware import gpu_names

    controls = {
        "model": widgets.Dropdown(options=sorted(PRESETS), value=default_model, description="model"),
        "gpu": widgets.Dropdown(options=list(gpu_names()), value=default_gpu, description="GPU"),
        "dtype": widgets.Dropdown(options=list(KV_DTYPES), value="bf16", description="dtype"),
        "context": widgets.SelectionSlider(options=list(CONTEXTS), value=4096, description="context"),
        "batch": widgets.SelectionSlider(options=list(BATCHES), value=1, description="batch"),
    }
    out = widgets.Output()

    def refresh(_change=None) -> None:
        out.outputs = kv_explorer_outputs(**{name: w.value for name, w in controls.items()})

    for w in controls.values():
        w.observe(refresh, names="value")
    refresh()
    return widgets.VBox([*controls.values(), out])


# ----------------------------------------------------------------------------- 4. per-model table
@dataclass(frozen=True)
class KvRow:
    """One model's KV cache: bytes per token, GB at a context for one request, and its attention type."""

    model: str
    kv_bytes_per_token: float
    gb_at_context: float
    attention: str  # MHA / GQA / MQA
    num_heads: int
    num_kv_heads: int


def kv_table(models: Iterable | None = None, dtype: str = "bf16", context: int = 4096) -> list[KvRow]:
    """One ``KvRow`` per model (preset names or ``ModelShape``s; default: every preset), KV cache in
    ``dtype`` at ``context`` tokens for batch 1. ``format_kv_table`` prints it."""
    dtype = _dtype("dtype", dtype)
    check_positive_int("context", context)
    if models is None:
        models = sorted(PRESETS)
    if isinstance(models, (str, ModelShape)) or not isinstance(models, Iterable):
        raise ValueError(f"models must be a list of preset names or ModelShapes, got {models!r}")
    shapes = [_shape(m) for m in models]
    if not shapes:
        raise ValueError("models must hold at least one model")
    return [
        KvRow(
            s.name,
            kv_bytes_per_token(s, dtype),
            kv_gb(s, dtype, context, 1),
            attention_kind(s),
            s.num_heads,
            s.num_kv_heads,
        )
        for s in shapes
    ]


def format_kv_table(rows: SequenceABC[KvRow], context: int | None = None) -> str:
    """``kv_table``'s rows as an aligned text table."""
    head = f"GB @ {context:,}" if context else "GB @ context"
    lines = [f"{'model':<14} {'KiB/token':>10} {head:>12} {'attention':<18}"]
    for r in rows:
        att = f"{r.attention} ({r.num_heads}q/{r.num_kv_heads}kv)"
        lines.append(f"{r.model:<14} {r.kv_bytes_per_token / 1024:>10g} {r.gb_at_context:>12.2f} {att:<18}")
    return "\n".join(lines)


__all__ = [
    "BATCHES",
    "CONTEXTS",
    "KV_DTYPES",
    "KvCheck",
    "KvOnOff",
    "KvOnOffRow",
    "KvRow",
    "StepCost",
    "attention_kind",
    "draw_kv",
    "engine_kv_check",
    "fit_requests",
    "format_kv_table",
    "kv_explorer",
    "kv_explorer_outputs",
    "kv_gb",
    "kv_on_off",
    "kv_table",
    "plot_kv_on_off",
    "step_flops",
    "total_flops",
]


# ---------------------------------------------------------------------------------------------- paged vs contiguous
@dataclass(frozen=True)
class PagedStep:
    """Decode-step and attention-only times of one backend at a batch and context (median of rounds)."""

    backend: str
    step_s: float
    attention_s: float


def paged_step_times(
    batch: int = 8, context: int = 256, repeats: int = 10, rounds: int = 3, block_size: int = 16, model="tiny-target"
) -> dict[str, PagedStep]:
    """Time one decode step of ``model`` (the whole forward) and its attention alone, with the contiguous and
    the paged backend (torch gather path), at ``batch`` sequences of ``context`` cached tokens. Rounds
    alternate between the backends, so a noisy neighbour slows both. Each repeat appends one token and
    truncates it back, so every repeat decodes at the same length."""
    import torch

    from course_lib.engine import Engine, SchedulerConfig
    from course_lib.engine.attention import ContiguousBackend
    from course_lib.engine.attention.paged import PagedBackend
    from course_lib.engine.model import LlamaEngineModel
    from course_lib.measure.bench import benchmark
    from course_lib.models.load import load_model

    for name, value in (("batch", batch), ("context", context), ("repeats", repeats), ("rounds", rounds)):
        check_positive_int(name, value)
    hf, tok = load_model(model)
    m = LlamaEngineModel(hf)
    if context + block_size > m.max_position:
        raise ValueError(f"context must be ≤ {m.max_position - block_size} for {model}, got {context}")
    cfg = SchedulerConfig(max_num_seqs=batch, max_model_len=context + block_size)
    backends = {
        "contiguous": ContiguousBackend(m.num_layers, m.num_kv_heads, m.head_dim, context + block_size, batch),
        "paged": PagedBackend.for_model(m, cfg, block_size=block_size, decode="gather"),
    }
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, m.vocab_size, (batch, context), generator=g).tolist()
    H, Hkv, hd = m.num_heads, m.num_kv_heads, m.head_dim
    q, k, v = (
        torch.randn(batch, H, hd, generator=g),
        torch.randn(batch, Hkv, hd, generator=g),
        torch.randn(batch, Hkv, hd, generator=g),
    )
    pos = torch.full((batch,), context)
    fns = {}
    with torch.inference_mode():
        for name, kv in backends.items():
            eng = Engine(hf, tok, config=cfg, backend=kv)
            handles = [kv.allocate() for _ in range(batch)]
            for h in handles:
                kv.append(h, context)
            eng.forward(handles, prompts, [0] * batch)  # prefill: every sequence holds `context` tokens

            def step(eng=eng, kv=kv, handles=handles):
                for h in handles:
                    kv.append(h, 1)
                eng.forward(handles, [[7]] * batch, [context] * batch)
                for h in handles:
                    kv.truncate(h, context)

            def attention(kv=kv, handles=handles):
                for h in handles:
                    kv.append(h, 1)
                meta = kv.prepare(handles, [1] * batch, pos)
                for layer in range(m.num_layers):
                    kv.forward(layer, q, k, v, meta)
                for h in handles:
                    kv.truncate(h, context)

            fns[name] = (step, attention)
        res = {n: ([], []) for n in backends}
        for _ in range(rounds):
            for name, (step, attention) in fns.items():
                res[name][0].append(benchmark(step, warmup=2, repeats=repeats, device="cpu").median_s)
                res[name][1].append(benchmark(attention, warmup=2, repeats=repeats, device="cpu").median_s)
    return {n: PagedStep(n, statistics.median(s), statistics.median(a)) for n, (s, a) in res.items()}


@dataclass(frozen=True)
class BeamMemory:
    """Peak KV bytes of one beam search on the paged backend: blocks held with copy-on-write sharing vs
    what the same beams would hold if every fork copied its parent's blocks."""

    num_beams: int
    peak_shared: int
    peak_unshared: int

    @property
    def saving(self) -> float:
        return 1 - self.peak_shared / self.peak_unshared


def beam_memory(engine, prompt, num_beams: int = 4, max_new_tokens: int = 32) -> BeamMemory:
    """Run ``engine.beam_search`` on a paged engine (``Engine(..., kv_cache="paged")``) and record, after every
    append, the bytes its block pool holds (shared prompt and common prefixes counted once) and the bytes the
    beams would hold as separate copies (``bytes_unshared``)."""
    from course_lib.engine.attention.paged import PagedBackend

    kv = engine.backend
    if not isinstance(kv, PagedBackend):
        raise ValueError("engine must use the paged KV cache: Engine(..., kv_cache='paged')")
    check_positive_int("num_beams", num_beams)
    check_positive_int("max_new_tokens", max_new_tokens)
    peak = [0, 0]
    original = kv.append

    def append(handle, n):
        original(handle, n)
        peak[0] = max(peak[0], kv.bytes_reserved())
        peak[1] = max(peak[1], kv.bytes_unshared())

    kv.append = append  # an instance attribute: only this engine, only during this call
    try:
        engine.beam_search(prompt, num_beams=num_beams, max_new_tokens=max_new_tokens, ignore_eos=True)
    finally:
        del kv.append
    return BeamMemory(num_beams, peak[0], peak[1])
