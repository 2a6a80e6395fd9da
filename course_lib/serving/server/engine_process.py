"""The engine in a process of its own, as vLLM's ``AsyncLLM`` runs its ``EngineCore``: ``EngineProcess`` in
the server's process (a pipe, a reader thread, the requests' queues) and ``_engine_process_main``, the
child process (``core.procs``: forked from a server that imported torch once) that builds the engine, steps it and sends each step's tokens back as one message. The
HTTP side's per-token Python then no longer competes with the engine's for one interpreter lock.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
from collections.abc import Callable

from course_lib.engine.sampling import SamplingParams
from course_lib.serving.server.core import EngineCore, route, send
from course_lib.serving.server.metrics import ServerMetrics, set_gauges

log = logging.getLogger(__name__)


class EngineProcess:
    """The engine in a process of its own, as vLLM's ``AsyncLLM`` runs its ``EngineCore``: the HTTP side keeps
    parsing, detokenizing and writing events, but no longer shares an interpreter lock with the engine's
    Python (scheduling, sampling, bookkeeping), so a step takes as long as it does alone.

        with serve(EngineProcess("tiny-target", threads=1)) as server: ...

    ``engine_kwargs`` are ``Engine``'s arguments (``model`` a name or folder, ``kv_cache``, ``config``, ...);
    the engine is built in the child (``core.procs``: a fork of a server that imported torch once, so the
    child pays only for transformers and the model). The child
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
        from course_lib.core import procs

        ctx = procs.context()  # a fork server with torch and transformers imported (core.procs)
        parent, child = ctx.Pipe(duplex=True)
        proc = procs.process(
            ctx,
            _engine_process_main,
            (child, self.engine_kwargs, self.threads, self.cpus),
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
            send({request_id: ((loop, q), [("error", request_id, 503, "the engine process is not running")])})

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
        out = {rid: (sink, [("error", rid, status, message)]) for rid, sink in list(self._sinks.items())}
        self._sinks.clear()
        send(out)

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
        items = [("token", it[1], TokenEvent(*it[2]), it[3]) if it[0] == "token" else it for it in items]
        route(self._sinks, items, self.abort)

    def _gauges(self, g: dict) -> None:
        self.steps, self.step_errors, self.step_seconds = g["steps"], g["errors"], g["step_seconds"]
        set_gauges(self.metrics, g)


def event_fields(ev) -> tuple:
    """A ``TokenEvent``'s fields in order, as a tuple (``TokenEvent(*fields)`` rebuilds it)."""
    return tuple(getattr(ev, f.name) for f in dataclasses.fields(ev))


def _exit_now() -> None:
    """Leave the child at once once it said "stopped": a normal exit spends about a second finalising torch
    and transformers, and ``stop()`` would wait for it (the disaggregation workers do the same)."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
    core = EngineCore(engine)
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
                _exit_now()
            if engine.has_unfinished():
                for item in core.step():  # a TokenEvent travels as a plain tuple: cheaper to pickle
                    if item[0] == "token":
                        item = ("token", item[1], event_fields(item[2]), item[3])
                    out.append(item)
            conn.send(("batch", out, core.gauges()))
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the parent went away
