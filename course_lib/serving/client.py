"""Chapter 02's client side: serve requests to the engine, sweep lengths and batches, keep every token's time.

The metrics themselves (TTFT, TPOT, percentiles, goodput, MFU, MBU) come from ``course_lib.measure.metrics``
applied to the ``RequestTrace``s returned here; this module decides *what* to run (prompt lengths,
batch sizes, the workloads of ``course_lib.serving.workload``, online vs batch serving) and fits
latency ≈ a + b·input + c·output to what it measured. What it *should* cost is
``course_lib.bottlenecks.time_floors.prefill_time`` / ``decode_time``. Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from course_lib.engine.sampling import SamplingParams
from course_lib.measure.costs import check_positive_int
from course_lib.measure.metrics import RequestTrace
from course_lib.serving.workload import Request, prompt_of_length


def _positive_ints(name: str, values) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} must be a non-empty sequence of positive ints")
    for v in values:
        check_positive_int(f"each of {name}", v)
    return values


# ----------------------------------------------------------------------------- serving
def serve(
    engine, requests: Sequence[Request], *, batch_size: int = 1, common_arrival: bool = False
) -> list[RequestTrace]:
    """Serve ``requests`` in arrival order as consecutive static batches of ``batch_size``; one
    ``RequestTrace`` per request. Every row of a batch generates the batch's longest output (a finished
    row keeps its slot: the waste continuous batching removes in chapter 06); each trace is cut at its
    own ``max_new_tokens``. ``common_arrival``: all requests arrived together when serving began (a
    burst, or a batch job), so later batches' TTFT includes their wait in the queue; otherwise each
    request arrives just as its batch starts (a quiet online server)."""
    requests = list(requests)
    if not requests or not all(isinstance(r, Request) for r in requests):
        raise ValueError("requests must be a non-empty sequence of Request")
    check_positive_int("batch_size", batch_size)
    start = time.perf_counter()
    traces: list[RequestTrace] = []
    for first in range(0, len(requests), batch_size):
        chunk = requests[first : first + batch_size]
        n = max(r.max_new_tokens for r in chunk)
        results = engine.generate(
            [list(r.prompt_ids) for r in chunk], SamplingParams(max_new_tokens=n, ignore_eos=True)
        )
        for i, (r, res) in enumerate(zip(chunk, results)):
            times = res.trace.token_times[: r.max_new_tokens]
            traces.append(
                RequestTrace(
                    first + i,
                    start if common_arrival else res.trace.arrival,
                    res.trace.prompt_tokens,
                    times,
                    finish=times[-1],
                )
            )
    return traces


def with_common_arrival(traces: Sequence[RequestTrace], arrival: float | None = None) -> list[RequestTrace]:
    """Copies of ``traces`` as if every request had arrived at ``arrival`` (default: the earliest one)."""
    traces = list(traces)
    if not traces:
        raise ValueError("traces must be a non-empty sequence of RequestTrace")
    t0 = min(t.arrival for t in traces) if arrival is None else arrival
    return [RequestTrace(t.request_id, t0, t.prompt_tokens, list(t.token_times), t.finish) for t in traces]


# ----------------------------------------------------------------------------- sweeps
@dataclass(frozen=True)
class TTFTPoint:
    prompt_len: int
    ttft_s: float  # median over repeats
    samples_s: tuple[float, ...]


def ttft_sweep(
    engine, pool: Sequence[int], lengths: Sequence[int], repeats: int = 3, warmup: int = 1
) -> list[TTFTPoint]:
    """TTFT of a single request (batch 1, one output token) for each prompt length: the prefill."""
    lengths = _positive_ints("lengths", lengths)
    check_positive_int("repeats", repeats)
    params = SamplingParams(max_new_tokens=1, ignore_eos=True)
    out = []
    for n in lengths:
        ids = prompt_of_length(pool, n)
        for _ in range(warmup):
            engine.generate([ids], params)
        samples = tuple(engine.generate([ids], params)[0].trace.ttft for _ in range(repeats))
        out.append(TTFTPoint(n, statistics.median(samples), samples))
    return out


@dataclass(frozen=True)
class BatchRun:
    """One static batch of ``batch`` identical-length requests; ``traces`` are from the median run."""

    batch: int
    prompt_len: int
    new_tokens: int
    tpot_s: float  # median over runs of the mean TPOT of the batch's requests
    ttft_s: float  # median over runs of the mean TTFT
    traces: tuple[RequestTrace, ...]
    tpot_samples_s: tuple[float, ...] = ()  # every run's mean TPOT (for a run-to-run spread)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens/s of the whole batch while decoding: ``batch`` tokens every TPOT."""
        return self.batch / self.tpot_s


def tpot_sweep(
    engine,
    pool: Sequence[int],
    batches: Sequence[int],
    prompt_len: int = 64,
    new_tokens: int = 32,
    repeats: int = 3,
    warmup: int = 1,
) -> list[BatchRun]:
    """For each batch size, generate ``new_tokens`` for ``batch`` requests of ``prompt_len`` tokens
    (different slices of the pool) as one static batch; TPOT and TTFT from the per-token times."""
    batches = _positive_ints("batches", batches)
    check_positive_int("prompt_len", prompt_len)
    if not isinstance(new_tokens, int) or new_tokens < 2:
        raise ValueError(f"new_tokens must be an int >= 2 (TPOT needs two tokens), got {new_tokens!r}")
    check_positive_int("repeats", repeats)
    out = []
    for b in batches:
        reqs = [Request(tuple(prompt_of_length(pool, prompt_len, i * prompt_len)), new_tokens) for i in range(b)]
        for _ in range(warmup):
            serve(engine, reqs, batch_size=b)
        runs = [serve(engine, reqs, batch_size=b) for _ in range(repeats)]
        tpots = [statistics.fmean(t.tpot for t in run) for run in runs]
        ttfts = [statistics.fmean(t.ttft for t in run) for run in runs]
        median_run = runs[sorted(range(len(runs)), key=tpots.__getitem__)[len(runs) // 2]]
        out.append(
            BatchRun(
                b,
                prompt_len,
                new_tokens,
                statistics.median(tpots),
                statistics.median(ttfts),
                tuple(median_run),
                tuple(tpots),
            )
        )
    return out


def latency_grid(
    engine, pool: Sequence[int], input_lens: Sequence[int], output_lens: Sequence[int], repeats: int = 3
) -> list[tuple[int, int, float]]:
    """(input tokens, output tokens, median end-to-end latency s) for every pair of the grid, batch 1.
    One warm-up request before the grid (not one per point: the engine stays warm between points)."""
    input_lens = _positive_ints("input_lens", input_lens)
    output_lens = _positive_ints("output_lens", output_lens)
    check_positive_int("repeats", repeats)
    out = []
    warm = SamplingParams(max_new_tokens=max(output_lens), ignore_eos=True)
    engine.generate([prompt_of_length(pool, max(input_lens))], warm)  # warm-up, once
    for n_in in input_lens:
        ids = prompt_of_length(pool, n_in)
        for n_out in output_lens:
            params = SamplingParams(max_new_tokens=n_out, ignore_eos=True)
            lat = [engine.generate([ids], params)[0].trace.latency for _ in range(repeats)]
            out.append((n_in, n_out, statistics.median(lat)))
    return out


@dataclass(frozen=True)
class LatencyFit:
    """latency ≈ a + b · input_tokens + c · output_tokens (least squares)."""

    a: float  # s, fixed cost per request
    b: float  # s per input token (prefill)
    c: float  # s per output token (decode)
    rms_s: float  # root-mean-square residual

    @property
    def ratio(self) -> float:
        """Input tokens that cost as much as one output token: c / b (Anyscale: about 100)."""
        return self.c / self.b

    def predict(self, input_tokens, output_tokens):
        return self.a + self.b * np.asarray(input_tokens, float) + self.c * np.asarray(output_tokens, float)


def fit_latency(points: Sequence[tuple[int, int, float]]) -> LatencyFit:
    """Fit a + b·input + c·output to (input, output, latency) points with ``numpy.linalg.lstsq``."""
    arr = np.asarray(list(points), dtype=float)
    if arr.ndim != 2 or arr.shape[1] != 3 or arr.shape[0] < 3 or not np.isfinite(arr).all():
        raise ValueError("points must be at least 3 finite (input_tokens, output_tokens, latency_s) triples")
    X = np.column_stack([np.ones(len(arr)), arr[:, 0], arr[:, 1]])  # (N, 3)
    if np.linalg.matrix_rank(X) < 3:
        raise ValueError("points must vary both input and output lengths (the fit is otherwise underdetermined)")
    (a, b, c), *_ = np.linalg.lstsq(X, arr[:, 2], rcond=None)
    rms = float(np.sqrt(np.mean((X @ np.array([a, b, c]) - arr[:, 2]) ** 2)))
    return LatencyFit(float(a), float(b), float(c), rms)


__all__ = [
    "BatchRun",
    "LatencyFit",
    "TTFTPoint",
    "fit_latency",
    "latency_grid",
    "serve",
    "tpot_sweep",
    "ttft_sweep",
    "with_common_arrival",
]


# ----------------------------------------------------------------------------- TTFT vs TPOT
@dataclass(frozen=True)
class InterferenceRun:
    """A long prompt joins while another request decodes, under a per-step token budget."""

    budget: int  # SchedulerConfig.max_num_batched_tokens
    prefill_steps: int  # steps the long prompt's prefill was spread over
    new_ttft_s: float  # TTFT of the request that joined
    running_tpot_s: float  # mean gap between tokens of the request that was already decoding
    running_max_gap_s: float  # its longest gap: the step(s) that carried the other prompt's prefill


def prefill_interference(
    engine,
    pool: Sequence[int],
    budgets: Sequence[int],
    *,
    prompt_len: int = 512,
    running_prompt: int = 32,
    running_tokens: int = 48,
    join_after: int = 8,
    repeats: int = 3,
) -> list[InterferenceRun]:
    """The TTFT vs TPOT trade-off, measured: a big per-step token budget prefills a newcomer's prompt
    in one step (short TTFT for it, one long stall for everyone decoding); a small budget spreads it
    over many steps (decoders keep their pace, the newcomer waits). ``engine`` lends its model; one
    engine per budget is built around it. Medians over ``repeats``. Introduced in 02_metrics_1_latency."""
    from course_lib.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig

    budgets = _positive_ints("budgets", budgets)
    for name, value in (("prompt_len", prompt_len), ("running_prompt", running_prompt), ("repeats", repeats)):
        check_positive_int(name, value)
    if not isinstance(join_after, int) or not 1 <= join_after < running_tokens - 1:
        raise ValueError(f"join_after must be an int in [1, running_tokens - 1), got {join_after!r}")
    if len(pool) < running_prompt + prompt_len:
        raise ValueError(
            f"pool holds {len(pool)} tokens; need running_prompt + prompt_len = {running_prompt + prompt_len}"
        )
    out = []
    for budget in budgets:
        eng = Engine(
            engine.hf_model,
            engine.tokenizer,
            device=engine.device,
            config=SchedulerConfig(max_num_batched_tokens=budget, chunked_prefill=True),
        )
        eng.generate([list(pool[:16])], SamplingParams(max_new_tokens=4, ignore_eos=True))  # warm-up
        runs = []
        for _ in range(repeats):
            a = eng.add_request(
                list(pool[:running_prompt]), SamplingParams(max_new_tokens=running_tokens, ignore_eos=True)
            )
            while len(a.output_ids) < join_after:
                eng.step()
            b = eng.add_request(
                list(prompt_of_length(pool, prompt_len, running_prompt)),
                SamplingParams(max_new_tokens=2, ignore_eos=True),
            )
            steps = 0
            while not b.output_ids:
                eng.step()
                steps += 1
            while eng.has_unfinished():
                eng.step()
            gaps = np.diff(a.trace.token_times)
            runs.append((steps, b.trace.ttft, float(np.mean(gaps)), float(np.max(gaps))))
        med = [statistics.median(r[i] for r in runs) for i in range(4)]
        out.append(InterferenceRun(budget, int(med[0]), med[1], med[2], med[3]))
    return out
