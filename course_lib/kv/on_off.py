"""KV cache on vs off, measured on the course engine next to the FLOP model's prediction.

``kv_on_off`` generates greedily at batch 1 with the cache (the contiguous backend: each step one token
attending to the stored keys, bandwidth-bound) and without it (``use_kv_cache=False``: each step a
compute-bound prefill of the whole sequence), and times every token by the engine's own events. The
prediction is ``fixed_s + FLOPs / flop_rate`` per step (``StepCost``), FLOPs from ``formulas.step_flops``,
both constants taken from two separate no-cache steps before the series, never fitted to it: where it
misses is the lesson. ``plots.plot_kv_on_off`` draws the result. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from pathlib import Path

from course_lib.kv.formulas import step_flops
from course_lib.measure.costs import check_positive_int
from course_lib.models.accounting import ModelShape, prefill_flops


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
    from course_lib.engine.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig
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

    from course_lib.engine.sampling import SamplingParams

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

    from course_lib.measure.hardware.cores import timing_threads

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
