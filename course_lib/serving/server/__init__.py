"""An OpenAI-compatible streaming server around the course ``Engine``: one loop thread owns the engine.

    with serve(Engine("tiny-target"), max_queue=16) as server:      # uvicorn in a background thread
        openai.OpenAI(base_url=server.openai_base_url, api_key="-").completions.create(...)
    with serve(EngineProcess("tiny-target", threads=1)) as server:  # the engine in a process of its own
        ...

The engine is not thread-safe, so exactly one thread touches it: ``EngineLoop`` takes commands (add,
abort, call) from a thread-safe queue between steps, calls ``step()`` while anything is unfinished, and
hands each step's ``TokenEvent``s to the per-request ``asyncio.Queue``s with one
``loop.call_soon_threadsafe`` per step. The HTTP side (FastAPI on uvicorn) only parses, detokenizes and
writes server-sent events. Per token the server adds an event hop, a decode and an SSE write, all under
the same GIL as the engine loop's Python; whether that is small next to a step depends on the step's
cost, so measure it: ``loadgen.server_overhead`` compares p50 TPOT with in-process generation. With an
``EngineProcess`` the engine steps in a child process (as vLLM's ``AsyncLLM`` runs its ``EngineCore``) and
sends each step's tokens back as one message: the HTTP side's per-token Python no longer competes with the
engine's for one interpreter lock.

The parts, in the manner of vLLM's entrypoints: ``protocol`` (request bodies, error body), ``params``
(a body → the engine's ``SamplingParams``, every field checked or refused by name), ``responses`` (choices,
chunks and log-probs in OpenAI's formats), ``app`` (the FastAPI routes), ``job`` (one request on the asyncio
side: its prompts' engine requests and their choices), ``text_stream`` (token ids → text deltas),
``core`` (what the engine's thread does between steps), ``engine_loop`` (that thread), ``engine_process``
(the engine in a child process), ``metrics`` (Prometheus), ``launch`` (``serve`` from a notebook, ``spawn`` as a process of its own) and
``__main__`` (``python -m course_lib.serving.server --model tiny-target --port 8000``).
Introduced in 06_batching_serving.ipynb.
"""

from course_lib.serving.server.app import create_app
from course_lib.serving.server.engine_loop import EngineLoop
from course_lib.serving.server.engine_process import EngineProcess
from course_lib.serving.server.launch import ServerHandle, SpawnedServer, serve, spawn, wait_ready
from course_lib.serving.server.metrics import ServerMetrics
from course_lib.serving.server.protocol import (
    DEFAULT_MAX_TOKENS,
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    StreamOptions,
    render_chat,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "EngineLoop",
    "EngineProcess",
    "ServerHandle",
    "ServerMetrics",
    "SpawnedServer",
    "StreamOptions",
    "create_app",
    "render_chat",
    "serve",
    "spawn",
    "wait_ready",
]
