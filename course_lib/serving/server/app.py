"""The FastAPI app and its routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (OpenAI's
request and chunk formats, ``stream`` with ``stream_options.include_usage``; plus vLLM's ``ignore_eos``
extension), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus). The HTTP side only parses,
admits (429 past ``max_queue``), detokenizes and writes server-sent events; the engine runs on an
``EngineLoop`` thread or in an ``EngineProcess``. Errors use OpenAI's body: 400 malformed body or parameters,
404 unknown model, 429 more than ``max_queue`` requests in the server, 504 past ``request_timeout_s`` (the
request is aborted and its KV freed), 500 engine failure, 503 shutting down. A streaming request that fails
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

from course_lib.engine.sampling import SamplingParams
from course_lib.serving.server.engine_loop import EngineLoop
from course_lib.serving.server.engine_process import EngineProcess
from course_lib.serving.server.job import Job, ServerState, close_on_disconnect
from course_lib.serving.server.metrics import ServerMetrics
from course_lib.serving.server.protocol import (
    DEFAULT_MAX_TOKENS,
    OPENAI_REASON,
    ChatRequest,
    CompletionRequest,
    RequestFailure,
    error_body,
    render_chat,
)
from course_lib.serving.server.text_stream import TextStream


def create_app(engine, *, max_queue: int = 64, request_timeout_s: float | None = 60.0, model_name: str = "tiny-target"):
    """A FastAPI app serving ``engine``: an ``Engine`` (driven by an ``EngineLoop`` thread in this process) or an
    ``EngineProcess`` (the engine in a child process); either starts and stops with the app's lifespan.

    ``max_queue``: requests admitted at once (waiting + running + being answered); one more gets 429.
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
        try:
            yield
        finally:
            engine_loop.stop()

    app = FastAPI(title="course_lib engine server", lifespan=lifespan)
    app.state.engine_loop = engine_loop
    app.state.metrics = metrics

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse(error_body(status, message), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request, exc: RequestValidationError):
        parts = []
        for e in exc.errors():
            if e.get("type") == "json_invalid":
                return error(400, f"malformed request: the body is not valid JSON ({e.get('msg', '')})")
            where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            parts.append(f"{where}: {e.get('msg', 'invalid')}")
        return error(400, "malformed request: " + "; ".join(parts))

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

    def sampling_params(body, max_tokens) -> SamplingParams:
        if body.model is not None and body.model != model_name:
            raise RequestFailure(404, f"the model `{body.model}` does not exist; this server serves `{model_name}`", "")
        if body.n != 1:
            raise RequestFailure(400, f"n={body.n}: this server returns one choice per request (n=1)", "")
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        try:
            return SamplingParams(
                temperature=body.temperature,
                top_p=body.top_p,
                seed=body.seed,
                stop=stop,
                max_new_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                ignore_eos=body.ignore_eos,
            )
        except ValueError as exc:
            message = str(exc).replace("SamplingParams.", "").replace("max_new_tokens", "max_tokens")
            raise RequestFailure(400, message, "") from None

    async def run(request: Request, body, prompt, max_tokens, chat: bool):
        arrival = time.perf_counter()
        try:
            params = sampling_params(body, max_tokens)
        except RequestFailure as f:
            return error(f.status, f.message)
        if not engine_loop.alive:
            return error(503, "the engine loop is not running")
        if state.in_server >= max_queue:
            metrics.requests.labels(finish_reason="rejected").inc()
            return error(429, f"the server already holds max_queue={max_queue} requests; retry later")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        job = Job(state, rid, arrival, TextStream(state.tokenizer, params.stop))
        job.start(prompt, params)
        watcher = asyncio.create_task(close_on_disconnect(request, job))
        try:
            await job.admitted()
        except RequestFailure as f:
            watcher.cancel()
            job.close(f.reason)
            return error(f.status, f.message)
        except BaseException:
            watcher.cancel()
            job.close("abort")
            raise
        created = int(time.time())
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return _SSEResponse(_sse(job, rid, created, chat, usage), job, watcher)
        try:
            async for _ in job.pieces():
                pass
        except RequestFailure as f:
            job.close(f.reason)
            return error(f.status, f.message)
        finally:
            watcher.cancel()
            job.close("abort")  # no-op unless cancelled
        reason = OPENAI_REASON[job.finish_reason]
        if chat:
            message = {"role": "assistant", "content": job.text.text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": job.text.text, "logprobs": None, "finish_reason": reason}
        kind = "chat.completion" if chat else "text_completion"
        return {
            "id": rid,
            "object": kind,
            "created": created,
            "model": model_name,
            "choices": [choice],
            "usage": job.usage(),
        }

    async def _sse(job: Job, rid: str, created: int, chat: bool, include_usage: bool):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list, usage: dict | None = None) -> str:
            body = {"id": rid, "object": kind, "created": created, "model": model_name, "choices": choices}
            if include_usage:
                body["usage"] = usage
            return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

        try:
            if chat:
                yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            async for piece, reason in job.pieces():
                if chat:
                    delta = {"content": piece} if piece or reason is None else {}
                    yield chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}])
                else:
                    yield chunk([{"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}])
            if include_usage:
                yield chunk([], job.usage())
        except RequestFailure as f:
            job.close(f.reason)
            yield f"data: {json.dumps(error_body(f.status, f.message))}\n\n"
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
        if isinstance(body.prompt, list) and not body.prompt:
            return error(400, "prompt must be a non-empty string or list of token ids")
        return await run(request, body, body.prompt, body.max_tokens, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        if not body.messages:
            return error(400, "messages must hold at least one message")
        prompt = render_chat([m.model_dump() for m in body.messages], state.tokenizer)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        return await run(request, body, prompt, max_tokens, chat=True)

    return app
