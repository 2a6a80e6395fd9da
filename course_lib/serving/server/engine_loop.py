"""The engine loop thread: the only thread of the server's process that touches the engine (it is not
thread-safe). Commands (add, abort, call) come in through a thread-safe queue between steps; each step's
``TokenEvent``s go out to the per-request ``asyncio.Queue``s. Its Python shares the interpreter lock
with the HTTP side's; ``engine_process`` moves the engine out of the process instead.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import weakref
from collections.abc import Callable

from course_lib.engine.sampling import SamplingParams
from course_lib.serving.server.core import EngineCore, route
from course_lib.serving.server.metrics import ServerMetrics, set_gauges

_OWNED_ENGINES: weakref.WeakSet = weakref.WeakSet()  # engines driven by a running EngineLoop
_OWNED_LOCK = threading.Lock()


class EngineLoop:
    """The only thread that touches the engine: commands in through a queue, TokenEvents out per request.

    ``submit`` registers a request with its ``asyncio`` loop and queue; the loop thread puts on that queue
    ("added", prompt_tokens) or ("error", status, message) first, then one ("token", TokenEvent) per
    generated token, with one ``call_soon_threadsafe`` per step for all the requests of an event loop. A
    ``step()`` that raises fails the requests it was running (each gets a 500 error) and the loop carries on
    with the next ones."""

    def __init__(self, engine, metrics: ServerMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self._core = EngineCore(engine)
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
        route(self._sinks, items, self._abort)

    def _update_gauges(self) -> None:
        if self.metrics is not None:
            set_gauges(self.metrics, self._core.gauges())


def is_driven(engine) -> bool:
    """Whether a running ``EngineLoop`` drives ``engine`` (a second server must not step it too)."""
    with _OWNED_LOCK:
        return engine in _OWNED_ENGINES
