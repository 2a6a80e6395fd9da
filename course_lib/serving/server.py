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

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (OpenAI's request and chunk
formats, ``stream`` with ``stream_options.include_usage``; plus vLLM's ``ignore_eos`` extension),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus). Chat: the tokenizer's chat template
when it has one, else the documented fallback ``render_chat`` ("role: content" lines, then "assistant:").
Errors use OpenAI's body ``{"error": {"message", "type", "code"}}``: 400 malformed body or parameters,
404 unknown model, 429 more than ``max_queue`` requests in the server, 504 past ``request_timeout_s``
(the request is aborted and its KV freed), 500 engine failure, 503 shutting down. A streaming request
that fails after its headers were sent ends with a ``data: {"error": ...}`` event, then ``data: [DONE]``.
A client that disconnects has its request aborted in the engine. Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
import logging
import math
import queue
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict

from course_lib.engine.sampling import SamplingParams

log = logging.getLogger(__name__)

_OWNED_ENGINES: weakref.WeakSet = weakref.WeakSet()  # engines driven by a running EngineLoop
_OWNED_LOCK = threading.Lock()
# OpenAI names two finish reasons; the engine's "eos" (end of sequence) is OpenAI's "stop"
_OPENAI_REASON = {"eos": "stop", "stop": "stop", "length": "length"}


# ----------------------------------------------------------------------------- the engine side
class _EngineCore:
    """What the engine's own thread does between steps, shared by ``EngineLoop`` (a thread of the server) and
    ``EngineProcess``'s child: add and abort requests, step, count. Each call returns per-request items
    ``("added", rid, prompt_tokens)``, ``("error", rid, status, message)`` or ``("token", rid, TokenEvent)``."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.live: set[str] = set()  # added and not yet finished or aborted
        self.steps = 0
        self.errors = 0
        self.step_seconds = 0.0  # time spent inside engine.step(), summed

    def add(self, rid: str, prompt, params: SamplingParams) -> tuple:
        try:
            seq = self.engine.add_request(prompt, params, request_id=rid)
        except ValueError as exc:  # bad input: nothing was queued
            return ("error", rid, 400, str(exc))
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the loop
            log.exception("add_request failed for %s", rid)
            return ("error", rid, 500, f"engine error: {exc!r}")
        self.live.add(rid)
        return ("added", rid, seq.num_prompt_tokens)

    def abort(self, rid: str) -> None:
        self.live.discard(rid)
        try:
            self.engine.abort(rid)  # frees its KV
        except ValueError:
            pass  # it finished (or was never added) meanwhile

    def step(self) -> list[tuple]:
        """One engine step: a token item per generated token, or, if the step raised, an error for every live
        request (aborted, its KV freed) and the loop carries on."""
        t0 = time.perf_counter()
        try:
            events = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - fail this batch's requests, keep serving
            self.errors += 1
            log.exception("engine step failed; failing its %d requests", len(self.live))
            failed = sorted(self.live)
            for rid in failed:
                self.abort(rid)
            return [("error", rid, 500, f"engine error: {exc!r}") for rid in failed]
        finally:
            self.step_seconds += time.perf_counter() - t0
        self.steps += 1
        for ev in events:
            if ev.finished:
                self.live.discard(ev.request)
        return [("token", ev.request, ev) for ev in events]

    def gauges(self) -> tuple:
        """(waiting, running, KV bytes used, KV bytes reserved, steps, step errors, step seconds)."""
        e = self.engine
        s = e.scheduler
        kv = (e.backend.bytes_used(), e.backend.bytes_reserved())
        return (len(s.waiting), len(s.running), *kv, self.steps, self.errors, self.step_seconds)


def _set_gauges(metrics: ServerMetrics | None, gauges: tuple) -> None:
    if metrics is not None:
        waiting, running, kv_used, kv_reserved = gauges[:4]
        metrics.waiting.set(waiting)
        metrics.running.set(running)
        metrics.kv_used.set(kv_used)
        metrics.kv_reserved.set(kv_reserved)


# ----------------------------------------------------------------------------- the engine loop thread
class EngineLoop:
    """The only thread that touches the engine: commands in through a queue, TokenEvents out per request.

    ``submit`` registers a request with its ``asyncio`` loop and queue; the loop thread puts on that queue
    ("added", prompt_tokens) or ("error", status, message) first, then one ("token", TokenEvent) per
    generated token, with one ``call_soon_threadsafe`` per step for all the requests of an event loop. A ``step()`` that raises fails the requests it was running
    (each gets a 500 error) and the loop carries on with the next ones."""

    def __init__(self, engine, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self._core = _EngineCore(engine)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}  # live request id → sink
        self._thread: threading.Thread | None = None

    @property
    def steps(self) -> int:
        return self._core.steps

    @property
    def step_errors(self) -> int:
        return self._core.errors

    # -- called from any thread
    def start(self) -> None:
        if self._thread is not None:
            return
        with _OWNED_LOCK:
            if self.engine in _OWNED_ENGINES:
                raise RuntimeError("this engine is already driven by a running server; stop that one first")
            if self.engine.has_unfinished():
                raise RuntimeError("the engine has unfinished requests; a server needs an idle engine")
            _OWNED_ENGINES.add(self.engine)
        self._thread = threading.Thread(target=self._run, name="course-engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort every live request (each gets a 503), end the thread and release the engine."""
        if self._thread is None:
            return
        self._commands.put(("stop",))
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the engine loop did not stop within {timeout} s (a step is stuck?)")
        self._thread = None
        with _OWNED_LOCK:
            _OWNED_ENGINES.discard(self.engine)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(
        self, request_id: str, prompt, params: SamplingParams, loop: asyncio.AbstractEventLoop, q: asyncio.Queue
    ) -> None:
        """Queue a request; its items will be put on ``q`` inside ``loop``."""
        self._commands.put(("add", request_id, prompt, params, (loop, q)))

    def abort(self, request_id: str) -> None:
        """Abort a request if it is still live; harmless if it already finished."""
        self._commands.put(("abort", request_id))

    def abort_all(self, status: int = 503, message: str = "the server is shutting down") -> None:
        self._commands.put(("abort_all", status, message))

    def call(self, fn: Callable, timeout: float = 10.0):
        """Run ``fn(engine)`` on the loop thread between steps and return its result (the safe way to read
        engine state, e.g. ``call(lambda e: e.backend.bytes_used())``)."""
        if not self.alive:
            raise RuntimeError("the engine loop is not running")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("call", fn, fut))
        return fut.result(timeout)

    # -- the loop thread
    def _run(self) -> None:
        engine = self.engine
        while True:
            try:
                # block only while idle; while generating, take what has arrived and step again
                cmd = self._commands.get() if not engine.has_unfinished() else self._commands.get_nowait()
            except queue.Empty:
                cmd = None
            stop = False
            while cmd is not None:
                stop = self._handle(cmd) or stop
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            if stop:
                self._fail_all(503, "the server is shutting down")
                self._update_gauges()
                return
            if engine.has_unfinished():
                self._step()
            self._update_gauges()

    def _handle(self, cmd) -> bool:
        kind = cmd[0]
        if kind == "add":
            _, rid, prompt, params, sink = cmd
            self._sinks[rid] = sink
            self._route([self._core.add(rid, prompt, params)])
        elif kind == "abort":
            self._abort(cmd[1])
        elif kind == "abort_all":
            self._fail_all(cmd[1], cmd[2])
        elif kind == "call":
            _, fn, fut = cmd
            try:
                fut.set_result(fn(self.engine))
            except Exception as exc:  # noqa: BLE001 - the caller gets it
                fut.set_exception(exc)
        elif kind == "stop":
            return True
        return False

    def _abort(self, rid: str) -> None:
        self._sinks.pop(rid, None)
        self._core.abort(rid)

    def _fail_all(self, status: int, message: str) -> None:
        failed = list(self._sinks)
        for rid in failed:
            self._core.abort(rid)
        self._route([("error", rid, status, message) for rid in failed])

    def _step(self) -> None:
        self._route(self._core.step())

    def _route(self, items: list[tuple]) -> None:
        _route(self._sinks, items, self._abort)

    @staticmethod
    def _send(out: dict) -> list:
        """Put each request's items on its queue: one ``call_soon_threadsafe`` per event loop. Returns the
        request ids that could not be reached (their event loop is closed)."""
        per_loop: dict = {}
        for rid, ((loop, q), items) in out.items():
            per_loop.setdefault(loop, []).append((rid, q, items))
        lost = []
        for loop, batch in per_loop.items():
            try:
                loop.call_soon_threadsafe(_put_batch, batch)
            except RuntimeError:  # the event loop is closed
                log.warning("could not deliver to %d requests; aborting them", len(batch))
                lost += [rid for rid, _, _ in batch]
        return lost

    def _update_gauges(self) -> None:
        if self.metrics is not None:
            _set_gauges(self.metrics, self._core.gauges())


def _route(sinks: dict, items: list[tuple], abort: Callable[[str], None]) -> None:
    """Hand ``_EngineCore`` items to their requests' queues (one hop per event loop); a request that errored
    or finished leaves ``sinks``, and one whose event loop is gone is aborted."""
    out: dict[str, tuple] = {}
    for kind, rid, *rest in items:
        sink = sinks.get(rid)
        if sink is None:
            continue
        out.setdefault(rid, (sink, []))[1].append((kind, *rest))
        if kind == "error" or (kind == "token" and rest[0].finished):
            sinks.pop(rid, None)
    for rid in EngineLoop._send(out):
        abort(rid)


def _put_batch(batch: list) -> None:
    """On the event loop: hand each request its items."""
    for _, q, items in batch:
        for item in items:
            q.put_nowait(item)


# ----------------------------------------------------------------------------- the engine in its own process
class EngineProcess:
    """The engine in a process of its own, as vLLM's ``AsyncLLM`` runs its ``EngineCore``: the HTTP side keeps
    parsing, detokenizing and writing events, but no longer shares an interpreter lock with the engine's
    Python (scheduling, sampling, bookkeeping), so a step takes as long as it does alone.

        with serve(EngineProcess("tiny-target", threads=1)) as server: ...

    ``engine_kwargs`` are ``Engine``'s arguments (``model`` a name or folder, ``kv_cache``, ``config``, ...);
    the engine is built in the child (spawned: a fresh interpreter, torch imported there, ~4 s). The child
    sends back one message per step: that step's tokens for every request as plain tuples, plus the gauges
    (waiting, running, KV bytes) that ``/metrics`` shows. Same interface as ``EngineLoop`` (``start``,
    ``stop``, ``submit``, ``abort``, ``abort_all``, ``call``, ``alive``, ``steps``, ``step_errors``);
    ``call(fn)`` needs a picklable ``fn`` (a module-level function, not a lambda). ``cpus``: pin the child
    to these CPUs (``os.sched_setaffinity``), e.g. to keep it off the core that runs the HTTP side. If the child dies, every
    live request gets a 500 and ``alive`` turns False."""

    def __init__(
        self,
        model="tiny-target",
        *,
        threads: int | None = 1,
        cpus=None,
        startup_timeout_s: float = 120.0,
        **engine_kwargs,
    ):
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be None or an int ≥ 1, got {threads!r}")
        if not (isinstance(startup_timeout_s, (int, float)) and startup_timeout_s > 0):
            raise ValueError(f"startup_timeout_s must be a number > 0, got {startup_timeout_s!r}")
        if cpus is not None:
            import os

            cpus = set(cpus) if not isinstance(cpus, (str, bytes)) and hasattr(cpus, "__iter__") else cpus
            allowed = set(range(os.cpu_count() or 1)) if hasattr(os, "sched_setaffinity") else set()
            if not isinstance(cpus, set) or not cpus or not cpus <= allowed:
                raise ValueError(
                    f"cpus must be None or a non-empty set of this machine's CPUs {sorted(allowed)}, got {cpus!r}"
                )
        if not isinstance(model, (str, bytes)) and not hasattr(model, "__fspath__"):
            raise ValueError(
                f"model must be a model name or folder (the child process builds the engine), got {type(model).__name__}"
            )
        self.engine_kwargs = {"model": str(model), **engine_kwargs}
        self.threads, self.cpus, self.startup_timeout_s = threads, cpus, startup_timeout_s
        self.metrics: ServerMetrics | None = None
        self.tokenizer = None
        self.max_model_len: int | None = None
        self.pid: int | None = None
        self.steps = 0
        self.step_errors = 0
        self.step_seconds = 0.0  # time the child spent inside engine.step(), summed
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._next_call = 0
        self._send_lock = threading.Lock()
        self._proc = None
        self._conn = None
        self._reader: threading.Thread | None = None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.alive else "not running"
        return f"EngineProcess({self.engine_kwargs['model']!r}, threads={self.threads}, {state})"

    # -- called from any thread
    def start(self) -> None:
        """Spawn the child and wait until its engine is built (raises with the child's traceback if not)."""
        if self._proc is not None:
            return
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=_engine_process_main,
            args=(child, self.engine_kwargs, self.threads, self.cpus),
            name="course-engine",
            daemon=True,
        )
        proc.start()
        child.close()
        try:
            if not parent.poll(self.startup_timeout_s):
                raise RuntimeError(f"the engine process did not start within {self.startup_timeout_s} s")
            msg = parent.recv()
        except (EOFError, OSError):
            msg = ("failed", f"the engine process exited with code {proc.exitcode} before it was ready")
        except BaseException:
            proc.kill()
            proc.join(5)
            raise
        if msg[0] != "ready":
            proc.join(5)
            raise RuntimeError(f"the engine process failed to build its engine:\n{msg[1]}")
        info = msg[1]
        self.tokenizer, self.max_model_len, self.pid = info["tokenizer"], info["max_model_len"], info["pid"]
        self._proc, self._conn = proc, parent
        self._reader = threading.Thread(target=self._read, name="course-engine-reader", daemon=True)
        self._reader.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort every live request (each gets a 503), end the child and the reader thread."""
        if self._proc is None:
            return
        self._post(("stop",))
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        if self._reader is not None:
            self._reader.join(timeout)
        self._fail_all(503, "the server is shutting down")
        self._conn.close()
        self._proc = self._reader = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive() and self._reader is not None and self._reader.is_alive()

    def submit(
        self, request_id: str, prompt, params: SamplingParams, loop: asyncio.AbstractEventLoop, q: asyncio.Queue
    ) -> None:
        """Queue a request; its items will be put on ``q`` inside ``loop``."""
        self._sinks[request_id] = (loop, q)
        if not self._post(("add", request_id, prompt, params)):
            self._sinks.pop(request_id, None)
            EngineLoop._send({request_id: ((loop, q), [("error", 503, "the engine process is not running")])})

    def abort(self, request_id: str) -> None:
        """Abort a request if it is still live; harmless if it already finished."""
        if self._sinks.pop(request_id, None) is not None:
            self._post(("abort", request_id))

    def abort_all(self, status: int = 503, message: str = "the server is shutting down") -> None:
        self._fail_all(status, message)
        self._post(("abort_all",))

    def call(self, fn: Callable, timeout: float = 10.0):
        """Run ``fn(engine)`` in the child between steps and return its (picklable) result."""
        if not self.alive:
            raise RuntimeError("the engine process is not running")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._send_lock:
            self._next_call += 1
            cid = self._next_call
            self._calls[cid] = fut
            try:
                self._conn.send(("call", cid, fn))
            except Exception as exc:  # pickling fn failed (a lambda, a closure): say so
                self._calls.pop(cid, None)
                raise ValueError(
                    f"call() sends fn to the engine process, so it must be picklable (a module-level function): {exc}"
                ) from None
        return fut.result(timeout)

    # -- internals
    def _post(self, msg) -> bool:
        if self._conn is None:
            return False
        try:
            with self._send_lock:
                self._conn.send(msg)
            return True
        except (OSError, ValueError, EOFError):
            return False

    def _fail_all(self, status: int, message: str) -> None:
        out = {rid: (sink, [("error", status, message)]) for rid, sink in list(self._sinks.items())}
        self._sinks.clear()
        EngineLoop._send(out)

    def _read(self) -> None:
        """The reader thread: the child's messages → the requests' asyncio queues, one hop per event loop."""
        conn = self._conn
        try:
            while True:
                msg = conn.recv()
                kind = msg[0]
                if kind == "batch":
                    self._deliver(msg[1])
                    self._gauges(msg[2])
                elif kind == "result":
                    fut = self._calls.pop(msg[1], None)
                    if fut is not None:
                        fut.set_result(msg[2]) if msg[3] else fut.set_exception(msg[2])
                elif kind == "stopped":
                    return
        except (EOFError, OSError):
            log.error("the engine process ended unexpectedly; failing its live requests")
        finally:
            self._fail_all(500, "the engine process ended")
            for fut in self._calls.values():
                fut.set_exception(RuntimeError("the engine process ended"))
            self._calls.clear()

    def _deliver(self, items: list) -> None:
        from course_lib.engine.engine import TokenEvent

        # tokens came as plain tuples (see _engine_process_main): TokenEvents again, as EngineLoop hands them out
        items = [("token", it[1], TokenEvent(*it[1:])) if it[0] == "token" else it for it in items]
        _route(self._sinks, items, self.abort)

    def _gauges(self, g: tuple) -> None:
        self.steps, self.step_errors, self.step_seconds = g[4:]
        _set_gauges(self.metrics, g)


def _engine_process_main(conn, engine_kwargs: dict, threads: int | None, cpus: set[int] | None = None) -> None:
    """The child of ``EngineProcess``: build the engine, then take commands between steps and send each step's
    tokens back as one message."""
    import traceback

    try:
        import torch

        if cpus:
            __import__("os").sched_setaffinity(0, cpus)
        if threads:
            torch.set_num_threads(threads)
        from course_lib.engine import Engine

        engine = Engine(**engine_kwargs)
        info = {
            "tokenizer": engine.tokenizer,
            "max_model_len": engine.config.max_model_len,
            "pid": __import__("os").getpid(),
        }
        conn.send(("ready", info))
    except BaseException:  # noqa: BLE001 - the parent raises it with this traceback
        conn.send(("failed", traceback.format_exc()))
        return
    core = _EngineCore(engine)
    try:
        while True:
            out: list = []
            # block only while idle; while generating, take what has arrived and step again
            cmds = [] if engine.has_unfinished() else [conn.recv()]
            while conn.poll():
                cmds.append(conn.recv())
            stop = False
            for cmd in cmds:
                kind = cmd[0]
                if kind == "add":
                    out.append(core.add(*cmd[1:]))
                elif kind == "abort":
                    core.abort(cmd[1])
                elif kind == "abort_all":
                    for rid in list(core.live):
                        core.abort(rid)
                elif kind == "call":
                    try:
                        conn.send(("result", cmd[1], cmd[2](engine), True))
                    except Exception as exc:  # noqa: BLE001 - the caller gets it
                        conn.send(("result", cmd[1], exc, False))
                elif kind == "stop":
                    stop = True
            if stop:
                for rid in list(core.live):
                    core.abort(rid)
                conn.send(("batch", out, core.gauges()))
                conn.send(("stopped",))
                return
            if engine.has_unfinished():
                for item in core.step():  # a TokenEvent travels as a plain tuple: cheaper to pickle
                    if item[0] == "token":
                        ev = item[2]
                        item = ("token", ev.request, ev.token_id, ev.time, ev.index, ev.finished, ev.finish_reason)
                    out.append(item)
            conn.send(("batch", out, core.gauges()))
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the parent went away


# ----------------------------------------------------------------------------- metrics
class ServerMetrics:
    """Prometheus metrics in their own ``CollectorRegistry`` (two apps in one process never collide)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.waiting = Gauge("course_requests_waiting", "Requests in the engine's waiting queue", registry=r)
        self.running = Gauge("course_requests_running", "Requests the engine is running", registry=r)
        self.in_server = Gauge("course_requests_in_server", "Requests admitted and not yet answered", registry=r)
        self.kv_used = Gauge("course_kv_cache_bytes_used", "KV cache bytes holding tokens", registry=r)
        self.kv_reserved = Gauge(
            "course_kv_cache_bytes_reserved", "KV cache bytes reserved for live requests", registry=r
        )
        self.requests = Counter(
            "course_requests", "Requests by how they ended", ["finish_reason"], registry=r
        )  # eos / stop / length / abort (client left) / timeout / error / rejected (429)
        self.prompt_tokens = Counter("course_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("course_generation_tokens", "Generated tokens", registry=r)
        latency = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)
        self.ttft = Histogram(
            "course_time_to_first_token_seconds", "Arrival → first token", buckets=latency, registry=r
        )
        self.tpot = Histogram(
            "course_time_per_output_token_seconds", "Per request (last − first) / (n − 1)", buckets=latency, registry=r
        )
        self.e2e = Histogram("course_e2e_request_latency_seconds", "Arrival → last token", buckets=latency, registry=r)


# ----------------------------------------------------------------------------- request bodies
class StreamOptions(BaseModel):
    include_usage: bool = False


class _CommonRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI fields we do not implement are ignored

    model: str | None = None
    max_tokens: int | None = None  # None → DEFAULT_MAX_TOKENS
    temperature: float = 1.0  # OpenAI's default; pass 0 for greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens (benchmarks)


class CompletionRequest(_CommonRequest):
    """The body of ``POST /v1/completions``: one prompt, a string or token ids."""

    prompt: str | list[int]


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatRequest(_CommonRequest):
    """The body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def render_chat(messages: list[dict], tokenizer=None) -> str:
    """The prompt for chat ``messages``: the tokenizer's chat template if it has one, else one
    "role: content" line per message followed by "assistant:" (the course's tiny models have no template)."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


class _Failure(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def _error_body(status: int, message: str) -> dict:
    kind = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 504: "timeout"}
    return {"error": {"message": message, "type": kind.get(status, "server_error"), "param": None, "code": status}}


# ----------------------------------------------------------------------------- one request, asyncio side
class _TextStream:
    """Token ids → text deltas. Decodes the whole output each token (as ``Engine.stream``), so the deltas
    add up to exactly ``Engine.generate``'s text; holds back a possible stop-string prefix and a split
    multi-byte character, and cuts the text before the stop string as the OpenAI API does."""

    def __init__(self, tokenizer, stop: tuple[str, ...]) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""
        self.shown = 0

    def push(self, token_id: int, finish_reason: str | None) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if finish_reason is not None:
            if finish_reason == "stop":
                text = text[: min((text.find(s) for s in self.stop if s in text), default=len(text))]
            self.text = text
            piece, self.shown = text[self.shown :], max(self.shown, len(text))
            return piece
        if text.endswith("\ufffd"):
            return ""  # a multi-byte character is split across tokens: wait for its other bytes
        limit = len(text) - self.hold
        if limit <= self.shown:
            return ""
        piece, self.shown = text[self.shown : limit], limit
        return piece


@dataclass
class _Job:
    """One admitted request on the asyncio side: its queue of engine items, timer and bookkeeping."""

    state: _State
    request_id: str
    arrival: float
    text: _TextStream
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    prompt_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # the engine's, once finished
    closed: bool = False
    timer: asyncio.TimerHandle | None = None

    def start(self, prompt, params: SamplingParams) -> None:
        loop = asyncio.get_running_loop()
        s = self.state
        s.in_server += 1
        s.metrics.in_server.set(s.in_server)
        if s.request_timeout_s is not None:
            self.timer = loop.call_later(s.request_timeout_s, self.queue.put_nowait, ("timeout",))
        s.loop.submit(self.request_id, prompt, params, loop, self.queue)

    async def _next(self):
        item = await self.queue.get()
        if item[0] == "error":
            raise _Failure(item[1], item[2], "error")
        if item[0] == "timeout":
            raise _Failure(504, f"request timed out after {self.state.request_timeout_s} s", "timeout")
        if item[0] == "disconnect":
            raise _Failure(499, "the client disconnected", "abort")
        return item

    async def admitted(self) -> None:
        """Wait until the engine has queued the request (or refused it: raises ``_Failure``)."""
        item = await self._next()
        self.prompt_tokens = item[1]
        self.state.metrics.prompt_tokens.inc(self.prompt_tokens)

    async def pieces(self) -> AsyncIterator[tuple[str, str | None]]:
        """(text delta, OpenAI finish reason or None) per generated token."""
        while self.finish_reason is None:
            _, ev = await self._next()
            if not self.token_times:
                self.state.metrics.ttft.observe(ev.time - self.arrival)
            self.token_times.append(ev.time)
            self.finish_reason = ev.finish_reason if ev.finished else None
            yield self.text.push(ev.token_id, self.finish_reason), _OPENAI_REASON.get(self.finish_reason)

    def close(self, reason: str | None = None) -> None:
        """Idempotent: abort in the engine if still live, count how it ended, release its place."""
        if self.closed:
            return
        self.closed = True
        s = self.state
        if self.timer is not None:
            self.timer.cancel()
        if self.finish_reason is None:
            s.loop.abort(self.request_id)
        reason = self.finish_reason or reason or "abort"
        s.metrics.requests.labels(finish_reason=reason).inc()
        s.metrics.generation_tokens.inc(len(self.token_times))
        if self.finish_reason is not None and self.token_times:
            s.metrics.e2e.observe(self.token_times[-1] - self.arrival)
            if len(self.token_times) > 1:
                s.metrics.tpot.observe((self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1))
        s.in_server -= 1
        s.metrics.in_server.set(s.in_server)

    def usage(self) -> dict:
        n = len(self.token_times)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n}


@dataclass
class _State:
    loop: EngineLoop
    metrics: ServerMetrics
    tokenizer: object
    model_name: str
    max_queue: int
    request_timeout_s: float | None
    max_model_len: int
    in_server: int = 0  # admitted and not yet answered; only the event loop thread changes it


# ----------------------------------------------------------------------------- the app
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
    state = _State(engine_loop, metrics, tokenizer, model_name, max_queue, request_timeout_s, max_model_len)

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
        return JSONResponse(_error_body(status, message), status_code=status)

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
            raise _Failure(404, f"the model `{body.model}` does not exist; this server serves `{model_name}`", "")
        if body.n != 1:
            raise _Failure(400, f"n={body.n}: this server returns one choice per request (n=1)", "")
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
            raise _Failure(400, message, "") from None

    async def run(request: Request, body, prompt, max_tokens, chat: bool):
        arrival = time.perf_counter()
        try:
            params = sampling_params(body, max_tokens)
        except _Failure as f:
            return error(f.status, f.message)
        if not engine_loop.alive:
            return error(503, "the engine loop is not running")
        if state.in_server >= max_queue:
            metrics.requests.labels(finish_reason="rejected").inc()
            return error(429, f"the server already holds max_queue={max_queue} requests; retry later")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        job = _Job(state, rid, arrival, _TextStream(state.tokenizer, params.stop))
        job.start(prompt, params)
        watcher = asyncio.create_task(_close_on_disconnect(request, job))
        try:
            await job.admitted()
        except _Failure as f:
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
        except _Failure as f:
            job.close(f.reason)
            return error(f.status, f.message)
        finally:
            watcher.cancel()
            job.close("abort")  # no-op unless cancelled
        reason = _OPENAI_REASON[job.finish_reason]
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

    async def _sse(job: _Job, rid: str, created: int, chat: bool, include_usage: bool):
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
        except _Failure as f:
            job.close(f.reason)
            yield f"data: {json.dumps(_error_body(f.status, f.message))}\n\n"
        finally:
            job.close("abort")  # no-op after a normal end; the client left otherwise
        yield "data: [DONE]\n\n"

    class _SSEResponse(StreamingResponse):
        """Server-sent events whose request is aborted however the response ends (done, error, disconnect)."""

        def __init__(self, content, job: _Job, watcher: asyncio.Task) -> None:
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


async def _close_on_disconnect(request, job: _Job) -> None:
    """While a non-streaming request waits for its tokens, abort it if the client goes away."""
    try:
        while not job.closed:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.queue.put_nowait(("disconnect",))
                return
    except asyncio.CancelledError:
        pass


# ----------------------------------------------------------------------------- running it from a notebook
class ServerHandle:
    """A running server: ``url``, ``port``, ``openai_base_url``, ``app``, ``engine_loop``; ``stop()`` or
    use it as a context manager. Stopping aborts live requests and joins every thread it started."""

    def __init__(self, server, thread: threading.Thread, app, host: str, port: int) -> None:
        self._server, self._thread, self.app = server, thread, app
        self.host, self.port = host, port
        self.engine_loop: EngineLoop | EngineProcess = app.state.engine_loop
        self.metrics: ServerMetrics = app.state.metrics

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        if self.engine_loop.alive:
            self.engine_loop.abort_all()  # live streams end now with an error event instead of running on
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        self.engine_loop.stop()  # already stopped by the lifespan unless uvicorn was forced to exit

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ServerHandle({self.url}, running={self.running})"


def serve(
    engine,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_queue: int = 64,
    request_timeout_s: float | None = 60.0,
    model_name: str = "tiny-target",
    log_level: str = "warning",
    startup_timeout_s: float = 30.0,
) -> ServerHandle:
    """Start ``create_app(engine, ...)`` under uvicorn in a background thread; ``port=0`` picks a free port
    (read it from ``.port`` / ``.url``). Returns once the socket accepts connections. ``engine``: an ``Engine``
    (its loop thread shares this process's interpreter lock with the HTTP side) or an ``EngineProcess``
    (the engine in its own process, as production servers run it)."""
    import uvicorn

    if isinstance(engine, EngineProcess):
        if engine.alive:
            raise RuntimeError("this EngineProcess is already running for another server; stop that one first")
        startup_timeout_s = max(startup_timeout_s, engine.startup_timeout_s + 5)  # the child builds its engine first
    else:
        with _OWNED_LOCK:
            if engine in _OWNED_ENGINES:
                raise RuntimeError("this engine is already driven by a running server; stop that one first")
    app = create_app(engine, max_queue=max_queue, request_timeout_s=request_timeout_s, model_name=model_name)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on", timeout_graceful_shutdown=2, access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="course-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5)
            app.state.engine_loop.stop()
            raise RuntimeError(f"the server did not start on {host}:{port} (port in use? see the log above)")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return ServerHandle(server, thread, app, host, bound)


def main(argv=None) -> None:
    """``python -m course_lib.serving.server --model tiny-target --port 8000``: serve until Ctrl-C."""
    import argparse

    from course_lib.engine import Engine

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--model", default="tiny-target")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--engine-process", action="store_true", help="run the engine in a process of its own")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of the engine")
    args = ap.parse_args(argv)
    if args.engine_process:
        engine = EngineProcess(args.model, threads=args.threads)
    else:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        engine = Engine(args.model)
    with serve(
        engine,
        args.host,
        args.port,
        max_queue=args.max_queue,
        request_timeout_s=args.timeout,
        model_name=args.model,
    ) as server:
        print(f"serving {args.model} at {server.openai_base_url} (Ctrl-C stops)", flush=True)
        try:
            while server.running:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
