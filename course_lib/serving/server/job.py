"""One admitted request on the asyncio side of the server: its queue of engine items, its timeout, how it
ended (counted in the metrics), and the state the app's routes share. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from course_lib.engine.sampling import SamplingParams
from course_lib.serving.server.engine_loop import EngineLoop
from course_lib.serving.server.metrics import ServerMetrics
from course_lib.serving.server.protocol import OPENAI_REASON, RequestFailure
from course_lib.serving.server.text_stream import TextStream


@dataclass
class Job:
    """One admitted request on the asyncio side: its queue of engine items, timer and bookkeeping."""

    state: ServerState
    request_id: str
    arrival: float
    text: TextStream
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
            raise RequestFailure(item[1], item[2], "error")
        if item[0] == "timeout":
            raise RequestFailure(504, f"request timed out after {self.state.request_timeout_s} s", "timeout")
        if item[0] == "disconnect":
            raise RequestFailure(499, "the client disconnected", "abort")
        return item

    async def admitted(self) -> None:
        """Wait until the engine has queued the request (or refused it: raises ``RequestFailure``)."""
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
            yield self.text.push(ev.token_id, self.finish_reason), OPENAI_REASON.get(self.finish_reason)

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
class ServerState:
    """What the requests of one app share: the engine side, the metrics, the tokenizer and the limits."""

    loop: EngineLoop
    metrics: ServerMetrics
    tokenizer: object
    model_name: str
    max_queue: int
    request_timeout_s: float | None
    max_model_len: int
    in_server: int = 0  # admitted and not yet answered; only the event loop thread changes it


async def close_on_disconnect(request, job: Job) -> None:
    """While a non-streaming request waits for its tokens, abort it if the client goes away."""
    try:
        while not job.closed:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.queue.put_nowait(("disconnect",))
                return
    except asyncio.CancelledError:
        pass
