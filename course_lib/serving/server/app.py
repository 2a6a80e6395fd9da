"""The FastAPI app and its routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (OpenAI's
request and chunk formats: ``n`` and ``best_of``, ``logprobs``, ``echo``, list prompts, list-form chat
content, penalties, ``logit_bias``, ``response_format`` (json_object, json_schema: grammar-constrained, see
``engine/structured.py``), ``stream`` with ``stream_options.include_usage``; vLLM's ``top_k``,
``min_p``, ``repetition_penalty``, ``min_tokens`` and ``ignore_eos``; any other field is refused by name,
see ``params``), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus). The HTTP side only
parses, admits (429 past ``max_queue`` sequences), detokenizes and writes server-sent events; the engine
runs on an ``EngineLoop`` thread or in an ``EngineProcess``. Errors use OpenAI's body, ``{"error": {"message",
"type", "param", "code"}}`` with string type and code: 400 malformed body or parameters (``param`` names the
field), 404 unknown model or route, 429 more than ``max_queue`` sequences in the server (``Retry-After``: the
mean request latency so far; the openai client honours it when it retries, which it does twice by default,
so pass ``max_retries=0`` to see the backpressure), 504 past ``request_timeout_s`` (the request is aborted and
its KV freed), 500 engine failure, 503 shutting down or no engine (``Retry-After`` too; ``/health`` answers
503 the same way). A streaming request that fails
after its headers were sent ends with a ``data: {"error": ...}`` event, then ``data: [DONE]``; a client that
disconnects has its request aborted in the engine. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from course_lib.serving.server.engine_loop import EngineLoop
from course_lib.serving.server.engine_process import EngineProcess
from course_lib.serving.server.job import Job, ServerState, close_on_disconnect
from course_lib.serving.server.metrics import ServerMetrics
from course_lib.serving.server.params import plan
from course_lib.serving.server.protocol import (
    RETRY_AFTER_UNAVAILABLE_S,
    ChatRequest,
    CompletionRequest,
    RequestFailure,
    error_body,
)
from course_lib.serving.server.responses import TokenStrings, choice_body, chunk_choice


def create_app(engine, *, max_queue: int = 64, request_timeout_s: float | None = 60.0, model_name: str = "tiny-target"):
    """A FastAPI app serving ``engine``: an ``Engine`` (driven by an ``EngineLoop`` thread in this process) or an
    ``EngineProcess`` (the engine in a child process); either starts and stops with the app's lifespan.

    ``max_queue``: sequences admitted at once (waiting + running + being answered; a request holds one per
    prompt and sample); past it a request gets 429, and one that could never fit a 400.
    ``request_timeout_s``: from arrival to the last token; past it the request is aborted (504), None = no limit.
    ``app.state.engine_loop`` is the ``EngineLoop`` or ``EngineProcess``; ``app.state.metrics`` the ``ServerMetrics``."""
    if not isinstance(max_queue, int) or isinstance(max_queue, bool) or max_queue < 1:
        raise ValueError(f"max_queue must be an int ≥ 1, got {max_queue!r}")
    if request_timeout_s is not None and not (
        isinstance(request_timeout_s, (int, float)) and math.isfinite(request_timeout_s) and request_timeout_s > 0
    ):
        raise ValueError(f"request_timeout_s must be None or a finite number > 0, got {request_timeout_s!r}")
    metrics = ServerMetrics()
    if isinstance(engine, EngineProcess):  # the engine runs in a child process, started with the app
        engine_loop, tokenizer, max_model_len = engine, None, None
        engine.metrics = metrics
    else:
        engine_loop = EngineLoop(engine, metrics)
        try:
            tokenizer = copy.deepcopy(engine.tokenizer)  # the HTTP thread decodes with its own copy
        except Exception:  # noqa: BLE001 - a tokenizer that cannot be copied is shared (decode only reads it)
            tokenizer = engine.tokenizer
        max_model_len = engine.config.max_model_len
    state = ServerState(engine_loop, metrics, tokenizer, model_name, max_queue, request_timeout_s, max_model_len)

    @asynccontextmanager
    async def lifespan(app):
        engine_loop.start()
        if isinstance(engine_loop, EngineProcess):  # known once the child has built its engine
            state.tokenizer, state.max_model_len = engine_loop.tokenizer, engine_loop.max_model_len
        state.strings = TokenStrings(state.tokenizer)
        try:
            yield
        finally:
            engine_loop.stop()

    app = FastAPI(title="course_lib engine server", lifespan=lifespan)
    app.state.engine_loop = engine_loop
    app.state.metrics = metrics

    def error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
        headers = None
        if status == 429:  # about when a place frees: one request's mean latency so far
            headers = {"Retry-After": str(metrics.retry_after_s())}
        elif status == 503:
            headers = {"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)}
        return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)

    def failed(f: RequestFailure) -> JSONResponse:
        return error(f.status, f.message, f.param, f.code)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request, exc: RequestValidationError):
        by_field: dict[str, list] = {}
        for e in exc.errors():
            if e.get("type") == "json_invalid":
                return error(
                    400, f"malformed request: the body is not valid JSON ({e.get('msg', '')})", None, "invalid_json"
                )
            loc = [x for x in e.get("loc", ()) if x != "body"]
            by_field.setdefault(str(loc[0]) if loc else "body", []).append((loc[1:], e.get("msg", "invalid")))
        parts = []
        for name, errs in by_field.items():
            forms = list(dict.fromkeys(str(rest[0]) for rest, _ in errs if rest and isinstance(rest[0], str)))
            if len(forms) > 1:  # a union: none of its forms matched
                parts.append(f"{name}: matches none of its allowed forms ({', '.join(forms)})")
            else:
                parts += [".".join([name, *map(str, rest)]) + f": {msg}" for rest, msg in errs]
        missing = any(e.get("type") == "missing" for e in exc.errors())
        code = "missing_required_parameter" if missing else "invalid_type"
        return error(400, "malformed request: " + "; ".join(parts), next(iter(by_field)), code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):  # unknown route, wrong method: OpenAI's body too
        return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    @app.exception_handler(Exception)
    async def crash(request, exc: Exception):  # a bug in a route: a 500 with OpenAI's body, not a bare text
        return error(500, f"internal server error: {exc!r}", None, "internal_error")

    @app.get("/health")
    async def health():
        if not engine_loop.alive:
            return error(503, "the engine loop is not running")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "course_lib"}
        card["max_model_len"] = state.max_model_len
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def prometheus():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def echo_text(prompt) -> str:
        return prompt if isinstance(prompt, str) else state.tokenizer.decode(prompt, skip_special_tokens=True)

    async def run(request: Request, body, chat: bool):
        arrival = time.perf_counter()
        try:
            p = plan(body, state.tokenizer, model_name, max_queue=max_queue)
        except RequestFailure as f:
            return failed(f)
        if not engine_loop.alive:
            return error(503, "the engine loop is not running")
        if state.in_server + p.num_seqs > max_queue:
            metrics.requests.labels(finish_reason="rejected").inc(p.num_seqs)
            return error(429, f"the server already holds max_queue={max_queue} sequences; retry later")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        job = Job(state, rid, arrival, p)
        job.start()
        watcher = asyncio.create_task(close_on_disconnect(request, job))
        try:
            await job.admitted()
        except RequestFailure as f:
            watcher.cancel()
            job.close(f.reason)
            return failed(f)
        except BaseException:
            watcher.cancel()
            job.close("abort")
            raise
        created = int(time.time())
        echoes = [echo_text(x) if p.echo else "" for x in p.prompts]
        if p.stream:
            return _SSEResponse(_sse(job, rid, created, chat, echoes), job, watcher)
        try:
            async for _ in job.events():
                pass
        except RequestFailure as f:
            job.close(f.reason)
            return failed(f)
        finally:
            watcher.cancel()
            job.close("abort")  # no-op unless cancelled
        want = p.logprobs is not None
        choices = [choice_body(i, c, chat, state.strings, want, echoes[c.prompt]) for i, c in job.answered()]
        kind = "chat.completion" if chat else "text_completion"
        return {
            "id": rid,
            "object": kind,
            "created": created,
            "model": model_name,
            "choices": choices,
            "usage": job.usage(),
        }

    async def _sse(job: Job, rid: str, created: int, chat: bool, echoes: list[str]):
        kind = "chat.completion.chunk" if chat else "text_completion"
        p = job.plan
        index = {id(c): i for i, c in job.answered()}  # best_of = n when streaming: every choice is answered
        want = p.logprobs is not None

        def chunk(choices: list, usage: dict | None = None) -> str:
            body = {"id": rid, "object": kind, "created": created, "model": model_name, "choices": choices}
            if p.include_usage:
                body["usage"] = usage
            return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

        try:
            for c in job.choices.values():
                i = index[id(c)]
                if chat:
                    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
                elif echoes[c.prompt]:
                    yield chunk([{"index": i, "text": echoes[c.prompt], "logprobs": None, "finish_reason": None}])
            async for c, piece, _ in job.events():
                shift = len(echoes[c.prompt])
                yield chunk([chunk_choice(index[id(c)], piece, c, chat, state.strings, want, shift)])
            if p.include_usage:
                yield chunk([], job.usage())
        except RequestFailure as f:
            job.close(f.reason)
            yield f"data: {json.dumps(error_body(f.status, f.message, f.param, f.code))}\n\n"
        finally:
            job.close("abort")  # no-op after a normal end; the client left otherwise
        yield "data: [DONE]\n\n"

    class _SSEResponse(StreamingResponse):
        """Server-sent events whose request is aborted however the response ends (done, error, disconnect)."""

        def __init__(self, content, job: Job, watcher: asyncio.Task) -> None:
            super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            self.job, self.watcher = job, watcher

        async def __call__(self, scope, receive, send) -> None:
            self.watcher.cancel()  # Starlette listens for the disconnect itself while streaming
            try:
                await super().__call__(scope, receive, send)
            finally:
                self.job.close("abort")
                await self.body_iterator.aclose()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await run(request, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        return await run(request, body, chat=True)

    return app
