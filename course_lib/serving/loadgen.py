"""A client-side load generator for an OpenAI-compatible server, in the manner of vLLM's ``benchmark_serving.py``.

    timed = schedule(make_workload(pool, 32), rate=4.0)             # Poisson arrivals, 4 req/s
    result = run_load(server.url, timed, slo=SLO(ttft_s=0.5, tpot_s=0.05))
    print(result.table())
    baseline = measure_engine(engine, timed)                         # the same requests, in-process
    print(server_overhead(result, baseline))                         # what HTTP + SSE add to p50 TPOT

Every request streams; the client stamps each chunk with ``time.perf_counter()`` as it arrives, so TTFT
includes the network, the server's queue and prefill, and TPOT/ITL the server's per-token path (event hop,
detokenize, SSE write) on top of the engine's step. The numbers are ``course_lib.measure.metrics.RequestTrace``s,
so percentiles, throughput and goodput come from ``summarize`` exactly as for in-process runs. A request
that fails (429, 504, a broken stream) keeps its error and counts against goodput. Introduced in
06_batching_serving.ipynb.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from course_lib.engine.sampling import SamplingParams
from course_lib.measure.metrics import SLO, RequestTrace, ServingSummary, percentiles, summarize
from course_lib.serving.workload import Request

LOADGEN_PS = (50, 90, 99)


# ----------------------------------------------------------------------------- what to send, and when
@dataclass(frozen=True)
class TimedRequest:
    """One request of a benchmark: when to send it (s after the start), the prompt, how many tokens."""

    arrival_s: float
    prompt: str | tuple[int, ...]  # text, or token ids (sent as OpenAI's token-array prompt)
    max_tokens: int

    def __post_init__(self) -> None:
        if not (isinstance(self.arrival_s, (int, float)) and math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise ValueError(f"TimedRequest.arrival_s must be a finite number ≥ 0, got {self.arrival_s!r}")
        if isinstance(self.prompt, list):
            object.__setattr__(self, "prompt", tuple(self.prompt))
        if not self.prompt or not isinstance(self.prompt, (str, tuple)):
            raise ValueError("TimedRequest.prompt must be a non-empty string or sequence of token ids")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"TimedRequest.max_tokens must be an int ≥ 1, got {self.max_tokens!r}")


def schedule(requests, rate: float = math.inf, *, burstiness: float = 1.0, seed: int = 0) -> list[TimedRequest]:
    """Arrival times for ``requests`` (``workload.Request``s or (prompt, max_tokens) pairs) at ``rate`` req/s.

    Gaps are gamma-distributed with mean 1/rate and shape ``burstiness`` (1 = a Poisson process; < 1
    burstier, > 1 more even), as vLLM's benchmark does; ``rate=inf`` sends everything at once."""
    if not (isinstance(rate, (int, float)) and rate > 0):
        raise ValueError(f"rate must be > 0 requests/s (math.inf = all at once), got {rate!r}")
    if not (isinstance(burstiness, (int, float)) and math.isfinite(burstiness) and burstiness > 0):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness!r}")
    pairs = []
    for r in requests:
        if isinstance(r, Request):
            pairs.append((tuple(r.prompt_ids), r.max_new_tokens))
        elif isinstance(r, TimedRequest):
            pairs.append((r.prompt, r.max_tokens))
        else:
            prompt, max_tokens = r
            pairs.append((prompt, max_tokens))
    if not pairs:
        raise ValueError("requests must be non-empty")
    if math.isinf(rate):
        times = np.zeros(len(pairs))
    else:
        from course_lib.serving.traces import bursty_arrivals

        # gamma gaps of shape `burstiness` = coefficient of variation 1/√burstiness; the first request at t = 0
        times = bursty_arrivals(rate, len(pairs), cv=burstiness**-0.5, seed=seed)
    return [TimedRequest(float(t), p, m) for t, (p, m) in zip(times, pairs)]


# ----------------------------------------------------------------------------- what came back
@dataclass
class RequestResult:
    """One request as the client saw it: when it was sent, when each streamed token arrived, how it ended."""

    index: int
    sent: float  # perf_counter when the request left the client
    token_times: list[float] = field(default_factory=list)  # perf_counter of each token's chunk
    text: str = ""
    prompt_tokens: int = 0  # from the server's usage (0 if unknown)
    finish_reason: str | None = None
    status: int | None = None  # HTTP status; None if the connection failed
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_reason is not None

    def trace(self) -> RequestTrace:
        return RequestTrace(self.index, self.sent, self.prompt_tokens, list(self.token_times))


@dataclass
class LoadResult:
    """A benchmark run: per-request results, the ``summarize`` of their traces, and inter-token latencies."""

    results: list[RequestResult]
    summary: ServingSummary
    itl: dict  # {p: s} over every gap between consecutive tokens of every request (NaN if none)
    duration_s: float  # first send → last token
    source: str  # "server <url>" or "in-process engine"

    @property
    def n_ok(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def errors(self) -> dict:
        """{HTTP status or "connection": count} of the failed requests."""
        c = collections.Counter(
            r.status if r.status and r.status != 200 else "connection" for r in self.results if not r.ok
        )
        return dict(c)

    @property
    def requests_per_s(self) -> float:
        return self.summary.requests_per_min / 60.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.summary.output_tokens_per_s

    def p(self, metric: str, q: float = 50) -> float:
        """A percentile in seconds: ``metric`` in "ttft", "tpot", "latency", "itl"."""
        table = self.itl if metric == "itl" else getattr(self.summary, metric)
        return table[q]

    def table(self) -> str:
        s = self.summary
        lines = [
            f"{self.source}: {self.n_ok}/{len(self.results)} requests ok"
            + (f", errors {self.errors}" if self.errors else "")
        ]
        lines.append(s.table())
        lines.append("ITL ms      " + "".join(f"{v * 1e3:>9.1f}" for v in self.itl.values()))
        lines.append(f"{self.requests_per_s:.2f} req/s, {self.output_tokens_per_s:.1f} output tok/s")
        return "\n".join(lines)


def _summarize(results: list[RequestResult], start: float, slo: SLO | None, ps, source: str) -> LoadResult:
    traces = [r.trace() for r in results]
    ends = [r.token_times[-1] for r in results if r.token_times]
    end = max(ends) if ends else start + 1e-9
    summary = summarize(traces, slo=slo, window=(start, max(end, start + 1e-9)), ps=ps)
    gaps = [g for t in traces for g in t.itl]
    itl = percentiles(gaps, ps) if gaps else {p: math.nan for p in ps}
    return LoadResult(results, summary, itl, end - start, source)


# ----------------------------------------------------------------------------- the HTTP client
async def _one(client, url: str, body: dict, result: RequestResult) -> None:
    result.sent = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as response:
            result.status = response.status_code
            if response.status_code != 200:
                raw = await response.aread()
                try:
                    result.error = json.loads(raw)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    result.error = raw.decode(errors="replace")[:200] or f"HTTP {response.status_code}"
                return
            pieces = []
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.perf_counter()
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"].get("message", str(chunk["error"]))
                    result.status = chunk["error"].get("code", result.status)
                    continue
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                for choice in chunk.get("choices", ()):
                    result.token_times.append(now)  # the server sends one chunk per generated token
                    pieces.append(choice.get("text", ""))
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
            result.text = "".join(pieces)
            if result.error is None and result.finish_reason is None:
                result.error = "the stream ended without a finish_reason"
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash of the benchmark
        result.error = f"{type(exc).__name__}: {exc}"


async def run_load_async(
    url: str,
    requests: Sequence[TimedRequest],
    *,
    model: str = "tiny-target",
    slo: SLO | None = None,
    max_concurrency: int | None = None,
    ignore_eos: bool = True,
    temperature: float = 0.0,
    timeout_s: float = 300.0,
    ps=LOADGEN_PS,
) -> LoadResult:
    """Send ``requests`` to ``url`` (the server root) at their arrival times, streaming; see ``run_load``."""
    import httpx

    requests = list(requests)
    if not requests or not all(isinstance(r, TimedRequest) for r in requests):
        raise ValueError("requests must be a non-empty sequence of TimedRequest (see schedule())")
    endpoint = url.rstrip("/") + "/v1/completions"
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    results = [RequestResult(i, 0.0) for i in range(len(requests))]
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        start = time.perf_counter()

        async def send(r: TimedRequest, result: RequestResult) -> None:
            await asyncio.sleep(max(0.0, start + r.arrival_s - time.perf_counter()))
            body = {
                "model": model,
                "prompt": r.prompt if isinstance(r.prompt, str) else list(r.prompt),
                "max_tokens": r.max_tokens,
                "temperature": temperature,
                "ignore_eos": ignore_eos,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if gate is None:
                await _one(client, endpoint, body, result)
            else:
                async with gate:
                    await _one(client, endpoint, body, result)

        await asyncio.gather(*(send(r, res) for r, res in zip(requests, results)))
    return _summarize(results, start, slo, ps, f"server {url}")


def run_load(url: str, requests: Sequence[TimedRequest], **kwargs) -> LoadResult:
    """Benchmark a running server with ``requests``; blocks until every request has ended.

    Keywords: ``model``, ``slo`` (goodput = requests/s meeting it), ``max_concurrency`` (None = open
    loop: arrivals never wait for answers), ``ignore_eos`` (True: exactly ``max_tokens`` each, as vLLM's
    random dataset), ``temperature``, ``timeout_s``, ``ps``. Works inside Jupyter's running event loop
    (the benchmark then runs on a loop of its own in a worker thread)."""
    coro = run_load_async(url, requests, **kwargs)
    run = _fast_run()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(run, coro).result()


def _fast_run():
    """``uvloop.run`` where uvloop is installed (the client's per-chunk work then runs less Python, so it
    takes less CPU from the engine it measures), else ``asyncio.run``."""
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


# ----------------------------------------------------------------------------- the in-process baseline
def measure_engine(
    engine,
    requests: Sequence[TimedRequest],
    *,
    slo: SLO | None = None,
    ignore_eos: bool = True,
    temperature: float = 0.0,
    ps=LOADGEN_PS,
) -> LoadResult:
    """The same requests, at the same arrival times, driven in-process with ``add_request``/``step``: the
    baseline the server's overhead is measured against. Token times are the engine's own event times.

    The loop runs on a worker thread, as the server's engine loop does, so the two differ only by the
    HTTP path: on a CPU, torch's OpenMP pool behaves differently on the main thread (on a loaded 2-core
    machine, two spinning OpenMP threads there made steps ~10× slower than on a worker thread). The engine
    must be idle and not owned by a running server (only one thread may drive it)."""
    requests = list(requests)
    if not requests or not all(isinstance(r, TimedRequest) for r in requests):
        raise ValueError("requests must be a non-empty sequence of TimedRequest (see schedule())")
    if engine.has_unfinished():
        raise RuntimeError("measure_engine needs an idle engine")
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="course-measure") as pool:
        start, results = pool.submit(_drive_engine, engine, requests, ignore_eos, temperature).result()
    return _summarize(results, start, slo, ps, "in-process engine")


def _drive_engine(engine, requests: list[TimedRequest], ignore_eos: bool, temperature: float):
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    results = [RequestResult(i, 0.0) for i in range(len(requests))]
    outputs: list[list[int]] = [[] for _ in requests]
    start = time.perf_counter()
    nxt = 0
    try:
        while nxt < len(order) or engine.has_unfinished():
            now = time.perf_counter()
            while nxt < len(order) and start + requests[order[nxt]].arrival_s <= now:
                i = order[nxt]
                r, res = requests[i], results[i]
                res.sent = start + r.arrival_s
                params = SamplingParams(max_new_tokens=r.max_tokens, temperature=temperature, ignore_eos=ignore_eos)
                try:
                    seq = engine.add_request(r.prompt, params, request_id=f"loadgen-{i}", arrival=res.sent)
                    res.prompt_tokens = seq.num_prompt_tokens
                except ValueError as exc:
                    res.error, res.status = str(exc), 400
                nxt += 1
            if engine.has_unfinished():
                for ev in engine.step():
                    i = int(str(ev.request).rsplit("-", 1)[1])
                    results[i].token_times.append(ev.time)
                    outputs[i].append(ev.token_id)
                    if ev.finished:
                        results[i].finish_reason = {"eos": "stop"}.get(ev.finish_reason, ev.finish_reason)
            elif nxt < len(order):
                time.sleep(max(0.0, start + requests[order[nxt]].arrival_s - time.perf_counter()))
    finally:
        for i, res in enumerate(results):  # an interrupted run leaves nothing behind in the engine
            if res.error is None and res.finish_reason is None and res.sent:
                try:
                    engine.abort(f"loadgen-{i}")
                except ValueError:
                    pass
    for res, out in zip(results, outputs):
        res.text = engine.tokenizer.decode(out, skip_special_tokens=True)
        res.status = res.status or 200
    return start, results


@dataclass(frozen=True)
class Overhead:
    """What serving over HTTP adds to a latency percentile, client side vs in-process."""

    metric: str
    percentile: float
    server_s: float
    engine_s: float

    @property
    def relative(self) -> float:
        """server / engine − 1 (0.1 = the server adds 10 %)."""
        return self.server_s / self.engine_s - 1.0

    def within(self, budget: float = 0.10) -> bool:
        return self.relative <= budget

    def __str__(self) -> str:
        return (
            f"p{self.percentile:g} {self.metric.upper()}: server {self.server_s * 1e3:.2f} ms vs in-process "
            f"{self.engine_s * 1e3:.2f} ms → {self.relative:+.1%}"
        )


def server_overhead(server: LoadResult, engine: LoadResult, metric: str = "tpot", percentile: float = 50) -> Overhead:
    """The server's overhead on one percentile of ``metric`` (default p50 TPOT: the issue's ≤ 10 % goal)."""
    return Overhead(metric, percentile, server.p(metric, percentile), engine.p(metric, percentile))


def main(argv=None) -> None:
    """``python -m course_lib.serving.loadgen --url http://127.0.0.1:8000 --n 32 --rate 4``: benchmark a server."""
    import argparse

    from course_lib.core.paths import data_dir
    from course_lib.models.train import load_tokenizer
    from course_lib.serving.workload import make_workload, prompt_pool

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="tiny-target")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--rate", type=float, default=math.inf, help="requests/s (default: all at once)")
    ap.add_argument("--burstiness", type=float, default=1.0)
    ap.add_argument("--prompt-lens", type=int, nargs=2, default=(16, 128))
    ap.add_argument("--output-median", type=int, default=24)
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--slo-ttft", type=float, default=1.0)
    ap.add_argument("--slo-tpot", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    pool = prompt_pool(load_tokenizer(data_dir() / "models" / "tokenizer"), 4096)
    work = make_workload(
        pool, args.n, prompt_lens=tuple(args.prompt_lens), output_median=args.output_median, seed=args.seed
    )
    timed = schedule(work, args.rate, burstiness=args.burstiness, seed=args.seed)
    result = run_load(
        args.url, timed, model=args.model, slo=SLO(args.slo_ttft, args.slo_tpot), max_concurrency=args.max_concurrency
    )
    print(result.table())


if __name__ == "__main__":
    main()
