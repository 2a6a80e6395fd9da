"""The HTTP side of the load generator: every request streams from ``/v1/completions`` and the client stamps
each chunk with ``time.perf_counter()`` as it arrives, so TTFT includes the network, the server's queue and
prefill, and TPOT/ITL the server's per-token path (event hop, detokenize, SSE write) on top of the engine's
step. A request that fails (429, 504, a broken stream) keeps its error and counts against goodput.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Sequence

from course_lib.measure.metrics import SLO
from course_lib.serving.loadgen.results import LOADGEN_PS, LoadResult, RequestResult, summarize_results
from course_lib.serving.loadgen.timed_requests import TimedRequest


def _status(code, default: int) -> int:
    """The HTTP status of an error sent inside a stream: vLLM and llama.cpp put it in ``code``; OpenAI (and
    the course server) send a string code, mapped back by the course server's table."""
    if isinstance(code, int):
        return code
    from course_lib.serving.server.protocol import STATUS_OF_CODE

    return STATUS_OF_CODE.get(code, 500 if code else default)


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
                    result.status = _status(chunk["error"].get("code"), result.status)
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
    return summarize_results(results, start, slo, ps, f"server {url}")


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
