"""Running the server from a notebook or a script: ``serve(engine)`` starts uvicorn on a background thread
and returns a ``ServerHandle`` (its URL, its OpenAI base URL, ``stop()``, a context manager).
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import threading
import time

from course_lib.serving.server.app import create_app
from course_lib.serving.server.engine_loop import EngineLoop, is_driven
from course_lib.serving.server.engine_process import EngineProcess
from course_lib.serving.server.metrics import ServerMetrics


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
