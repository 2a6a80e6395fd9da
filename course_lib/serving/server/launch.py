"""Running the server from a notebook or a script: ``serve(engine)`` starts uvicorn on a background thread
and returns a ``ServerHandle`` (its URL, its OpenAI base URL, ``stop()``, a context manager);
``spawn(model)`` starts ``python -m course_lib.serving.server`` as a process of its own, as it is deployed
(a client then never shares the server's interpreter lock), and ``wait_ready`` waits for any server process
to answer. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

from course_lib.serving.server.app import create_app
from course_lib.serving.server.engine_loop import EngineLoop, is_driven
from course_lib.serving.server.engine_process import EngineProcess
from course_lib.serving.server.metrics import ServerMetrics


class _Handle:
    """What both kinds of running server answer: ``url``, ``openai_base_url``, and a context manager that
    calls ``stop()``."""

    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    def stop(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerHandle(_Handle):
    """A running server: ``url``, ``port``, ``openai_base_url``, ``app``, ``engine_loop``; ``stop()`` or
    use it as a context manager. Stopping aborts live requests and joins every thread it started."""

    def __init__(self, server, thread: threading.Thread, app, host: str, port: int) -> None:
        self._server, self._thread, self.app = server, thread, app
        self.host, self.port = host, port
        self.engine_loop: EngineLoop | EngineProcess = app.state.engine_loop
        self.metrics: ServerMetrics = app.state.metrics

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
    elif is_driven(engine):
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


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float) -> None:
    """Block until the server process ``proc`` answers ``GET url/v1/models`` with 200; an error naming the
    exit code if it dies first, ``TimeoutError`` after ``timeout_s``."""
    import httpx

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it answered {url}")
        try:
            if httpx.get(url + "/v1/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no answer from {url} within {timeout_s:.0f} s")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it; another process could still take it first)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class SpawnedServer(_Handle):
    """``python -m course_lib.serving.server`` running as a child process: ``url``, ``openai_base_url``,
    ``pid``, ``command``; ``stop()`` or use it as a context manager (terminate, then kill after 20 s)."""

    def __init__(self, command: list[str], host: str, port: int, env: dict, startup_timeout_s: float) -> None:
        import tempfile

        self.command, self.host, self.port = command, host, port
        self._log = tempfile.TemporaryFile()  # its stderr: a file, so a chatty child never blocks on a full pipe
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=self._log)
        try:
            wait_ready(self.proc, self.url, startup_timeout_s)
        except BaseException as exc:
            self.stop()
            raise RuntimeError(f"{' '.join(command)} did not start: {exc}\n{self.log()[-2000:]}") from exc

    def log(self) -> str:
        """What the child wrote to stderr so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __repr__(self) -> str:
        return f"SpawnedServer({self.url}, pid={self.pid}, running={self.running})"


def spawn(
    model: str = "tiny-target",
    *,
    engine: str = "process",
    threads: int | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    extra_args: tuple[str, ...] | list[str] = (),
    startup_timeout_s: float = 180.0,
) -> SpawnedServer:
    """Start ``python -m course_lib.serving.server --model MODEL --engine ENGINE`` (``engine``: "process", the
    command's default, or "thread"; ``--threads`` and ``extra_args`` passed on) and return once it answers;
    ``port=0`` picks a free one. With ``threads`` the child's OpenMP pool is sized too (``OMP_NUM_THREADS``)."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a non-empty name, got {model!r}")
    if engine not in ("process", "thread"):
        raise ValueError(f"engine must be 'process' or 'thread', got {engine!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be None or an int >= 1, got {threads!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"port must be an int in 0..65535 (0: a free one), got {port!r}")
    port = port or free_port(host)
    cmd = [sys.executable, "-m", "course_lib.serving.server", "--model", model, "--host", host, "--port", str(port)]
    cmd += ["--engine", engine]
    env = dict(os.environ)
    if threads is not None:
        cmd += ["--threads", str(threads)]
        env["OMP_NUM_THREADS"] = str(threads)
    cmd += [str(a) for a in extra_args]
    return SpawnedServer(cmd, host, port, env, startup_timeout_s)
