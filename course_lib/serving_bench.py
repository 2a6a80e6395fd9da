"""Chapter 02's load generator, sweeps and cost predictions: run the engine, keep every token's time.

The metrics themselves (TTFT, TPOT, percentiles, goodput, MFU, MBU) come from ``course_lib.metrics``
applied to the ``RequestTrace``s returned here; this module decides *what* to run (prompt lengths,
batch sizes, a long-tailed workload, online vs batch serving) and what it *should* cost. A prefill
is compute-bound (FLOPs ÷ peak FLOP/s); a decode step is bandwidth-bound (weight + KV bytes ÷
bandwidth) — and, for a model as small as ours, sits on a floor the roofline does not see: every
one of the few hundred torch ops in a step pays a fixed dispatch cost (``count_ops``,
``per_op_overhead_s``). Introduced in 02_metrics.ipynb.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from course_lib.costs import check_positive_int
from course_lib.engine.sampling import SamplingParams
from course_lib.metrics import RequestTrace
from course_lib.models.accounting import (ModelShape, decode_flops, decode_step_bytes, kv_bytes_per_token,
                                          prefill_flops, weight_bytes)
from course_lib.roofline import min_time


def _positive_ints(name: str, values) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} must be a non-empty sequence of positive ints")
    for v in values:
        check_positive_int(f"each of {name}", v)
    return values


# ----------------------------------------------------------------------------- prompts and requests
def prompt_pool(tokenizer, n_tokens: int = 2048, text: str | None = None, chunk_chars: int = 2000) -> list[int]:
    """``n_tokens`` token ids of held-out Python source (the corpus' validation split, which the
    embedded models never trained on), or of ``text``. Tokenized in chunks to stay under the
    tokenizer's length warning; prompts are then slices of this pool, so every length is exact."""
    check_positive_int("n_tokens", n_tokens)
    if text is None:
        from course_lib.models.corpus import corpus_text

        text = corpus_text("val")
    ids: list[int] = []
    for start in range(0, len(text), chunk_chars):
        ids += tokenizer(text[start:start + chunk_chars])["input_ids"]
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
    raise ValueError(f"the text yields only {len(ids)} tokens, fewer than n_tokens={n_tokens}")


@dataclass(frozen=True)
class Request:
    """One user request: a prompt (token ids) and how many tokens to generate (EOS is ignored)."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise ValueError("Request.prompt_ids must hold at least one token id")
        check_positive_int("Request.max_new_tokens", self.max_new_tokens)


def prompt_of_length(pool: Sequence[int], n: int, offset: int = 0) -> list[int]:
    """``n`` consecutive ids of ``pool`` starting at ``offset`` (wrapping around)."""
    check_positive_int("n", n)
    if n > len(pool):
        raise ValueError(f"a {n}-token prompt needs a pool of at least {n} tokens, got {len(pool)}")
    start = offset % len(pool)
    return [int(t) for t in (list(pool[start:start + n]) + list(pool[:max(0, start + n - len(pool))]))]


def make_workload(pool: Sequence[int], n_requests: int, *, prompt_lens: tuple[int, int] = (16, 256),
                  output_median: int = 24, output_sigma: float = 0.8, output_max: int = 256,
                  seed: int = 0) -> list[Request]:
    """A seeded mix of requests: prompt lengths uniform in ``prompt_lens``, output lengths log-normal
    around ``output_median`` (clipped to [2, ``output_max``]) — most answers short, a few very long,
    as in real chat traffic. The long tail is what makes the mean latency misleading."""
    check_positive_int("n_requests", n_requests)
    lo, hi = prompt_lens
    check_positive_int("prompt_lens[0]", lo)
    if not isinstance(hi, int) or hi < lo:
        raise ValueError(f"prompt_lens must be (low, high) ints with 1 <= low <= high, got {prompt_lens!r}")
    check_positive_int("output_median", output_median)
    if not (isinstance(output_sigma, (int, float)) and output_sigma >= 0):
        raise ValueError(f"output_sigma must be a number >= 0, got {output_sigma!r}")
    rng = np.random.default_rng(seed)
    lens = rng.integers(lo, hi + 1, size=n_requests)
    outs = np.clip(np.rint(output_median * rng.lognormal(0.0, output_sigma, size=n_requests)), 2, output_max)
    offsets = rng.integers(0, len(pool), size=n_requests)
    return [Request(tuple(prompt_of_length(pool, int(n), int(o))), int(m)) for n, m, o in zip(lens, outs, offsets)]


# ----------------------------------------------------------------------------- serving
def serve(engine, requests: Sequence[Request], *, batch_size: int = 1,
          common_arrival: bool = False) -> list[RequestTrace]:
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
        chunk = requests[first:first + batch_size]
        n = max(r.max_new_tokens for r in chunk)
        results = engine.generate([list(r.prompt_ids) for r in chunk], SamplingParams(max_new_tokens=n, ignore_eos=True))
        for i, (r, res) in enumerate(zip(chunk, results)):
            times = res.trace.token_times[:r.max_new_tokens]
            traces.append(RequestTrace(first + i, start if common_arrival else res.trace.arrival,
                                       res.trace.prompt_tokens, times, finish=times[-1]))
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


def ttft_sweep(engine, pool: Sequence[int], lengths: Sequence[int], repeats: int = 3,
               warmup: int = 1) -> list[TTFTPoint]:
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

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens/s of the whole batch while decoding: ``batch`` tokens every TPOT."""
        return self.batch / self.tpot_s


def tpot_sweep(engine, pool: Sequence[int], batches: Sequence[int], prompt_len: int = 64, new_tokens: int = 32,
               repeats: int = 3, warmup: int = 1) -> list[BatchRun]:
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
        out.append(BatchRun(b, prompt_len, new_tokens, statistics.median(tpots), statistics.median(ttfts),
                            tuple(median_run)))
    return out


def latency_grid(engine, pool: Sequence[int], input_lens: Sequence[int], output_lens: Sequence[int],
                 repeats: int = 3) -> list[tuple[int, int, float]]:
    """(input tokens, output tokens, median end-to-end latency s) for every pair of the grid, batch 1."""
    input_lens = _positive_ints("input_lens", input_lens)
    output_lens = _positive_ints("output_lens", output_lens)
    check_positive_int("repeats", repeats)
    out = []
    for n_in in input_lens:
        ids = prompt_of_length(pool, n_in)
        for n_out in output_lens:
            params = SamplingParams(max_new_tokens=n_out, ignore_eos=True)
            engine.generate([ids], params)  # warm-up
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


# ----------------------------------------------------------------------------- predictions
def prefill_time(shape: ModelShape, n_tokens: int, peak_flops: float, bandwidth: float, dtype: str = "fp32",
                 batch: int = 1) -> float:
    """Roofline lower bound of a prefill: max(FLOPs / peak, (weights + KV written) / bandwidth)."""
    moved = weight_bytes(shape, dtype) + kv_bytes_per_token(shape, dtype) * n_tokens * batch
    return min_time(prefill_flops(shape, n_tokens, batch), moved, peak_flops, bandwidth)


def decode_time(shape: ModelShape, context_len: int, peak_flops: float, bandwidth: float, dtype: str = "fp32",
                batch: int = 1) -> float:
    """Roofline lower bound of one decode step (= the TPOT floor): weights + KV caches over bandwidth,
    unless the batch is large enough to make the FLOPs dominate."""
    return min_time(decode_flops(shape, context_len, batch), decode_step_bytes(shape, context_len, batch, dtype),
                    peak_flops, bandwidth)


def output_input_ratio(shape: ModelShape, peak_flops: float, bandwidth: float, dtype: str = "bf16",
                       context_len: int = 1) -> float:
    """The roofline's answer to "one output token costs as much as how many input tokens?":
    a batch-1 decode step (reads every weight: bytes / bandwidth) over one compute-bound prefill token
    (2 · params FLOPs / peak). About bytes-per-param / 2 × the ridge point."""
    per_input = prefill_flops(shape, 1) / peak_flops
    return decode_time(shape, context_len, peak_flops, bandwidth, dtype) / per_input


def generation_flops(shape: ModelShape, prompt_len: int, new_tokens: int, batch: int = 1) -> float:
    """FLOPs of one ``generate``: the prefill (which yields the first token) + ``new_tokens − 1`` decode steps."""
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("new_tokens", new_tokens)
    return prefill_flops(shape, prompt_len, batch) + sum(
        decode_flops(shape, prompt_len + i, batch) for i in range(1, new_tokens))


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


def matmul_weights(engine) -> list[torch.Tensor]:
    """Every weight matrix a decode step multiplies by: the 2-D tensors of each layer (q/k/v, o and the
    MLP, fused or not, whatever the engine's layout) and the LM head. Norm vectors and biases are left out."""
    mats = []
    for layer in engine.model.layers:
        for f in fields(layer):
            t = getattr(layer, f.name)
            if isinstance(t, torch.Tensor) and t.dim() == 2:
                mats.append(t)  # (out_features, in_features)
    return mats + [engine.model.lm_head]  # (V, D)


def time_matmuls(engine, batch: int = 1, repeats: int | None = None):
    """Time only the matmuls of one decode step — ``batch`` rows through every weight matrix, one
    ``F.linear`` each — with ``bench.benchmark``; bytes = the weights read once. Compared with the
    whole step, it splits TPOT into "streaming the weights" and "everything else"."""
    from course_lib.bench import benchmark

    check_positive_int("batch", batch)
    mats = matmul_weights(engine)
    gen = torch.Generator(device=engine.device).manual_seed(0)
    xs = [torch.randn(batch, m.shape[1], generator=gen, device=engine.device).to(m.dtype) for m in mats]  # (B, in)

    def run() -> None:
        for x, m in zip(xs, mats):
            torch.nn.functional.linear(x, m)  # (B, out)

    flops = sum(2.0 * batch * m.numel() for m in mats)
    moved = sum(m.numel() * m.element_size() for m in mats)
    with torch.inference_mode():
        return benchmark(run, flops=flops, bytes=moved, device=engine.device.type, repeats=repeats,
                         label=f"{len(mats)} decode matmuls, batch {batch}")


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
        out = subprocess.run([exe, f"--id={index}", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True)
        return float(out.stdout.strip().splitlines()[0])

    try:
        read()
    except Exception as exc:  # nvidia-smi present but no GPU/driver
        return None, f"nvidia-smi failed: {exc}"
    return read, "nvidia-smi"


def sample_while(fn: Callable[[], object], read: Callable[[], float], *, min_seconds: float = 1.0,
                 interval_s: float = 0.05) -> tuple[list[float], float, int]:
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
    "BatchRun", "Busy", "LatencyFit", "Request", "TTFTPoint", "count_ops", "cpu_busy", "decode_time",
    "fit_latency", "generation_flops", "matmul_weights", "time_matmuls", "gpu_utilization_reader", "latency_grid", "make_workload",
    "output_input_ratio", "per_op_overhead_s", "prefill_time", "prompt_of_length", "prompt_pool", "sample_while",
    "serve", "tpot_sweep", "ttft_sweep", "with_common_arrival",
]
