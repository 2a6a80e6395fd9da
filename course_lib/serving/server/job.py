"""One admitted request on the asyncio side of the server: its engine requests (one per prompt, each with
``best_of`` samples), one ``Choice`` per sample (its text stream, tokens, log-probs, how it ended), its
queue of engine items, its timeout, how it ended (counted in the metrics), and the state the app's routes
share. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from course_lib.engine.parallel_sampling import sample_ids
from course_lib.engine.text_stream import TextStream
from course_lib.serving.server.engine_loop import EngineLoop
from course_lib.serving.server.metrics import ServerMetrics
from course_lib.serving.server.params import Plan, engine_param
from course_lib.serving.server.protocol import RequestFailure


@dataclass
class Choice:
    """One sample of one prompt: what the engine generated for it, and its text."""

    prompt: int  # which prompt of the request
    sample: int  # which of its best_of samples
    text: TextStream
    token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    logprobs: list = field(default_factory=list)  # (token id, log-prob, top ((id, log-prob), ...)) per token
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None  # the engine's, once finished
    scheduled: float | None = None  # when the engine first scheduled it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Job:
    """One admitted HTTP request on the asyncio side: its engine requests, choices, queue, timer and counts."""

    state: ServerState
    request_id: str
    arrival: float
    plan: Plan
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    prompt_tokens: list[int] = field(default_factory=list)  # per prompt, once the engine has it
    choices: dict = field(default_factory=dict)  # engine sequence id → Choice
    live: set = field(default_factory=set)  # engine request ids (one per prompt) with a sample still running
    closed: bool = False
    timer: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        stop, tok = self.plan.params.stop, self.state.tokenizer
        self.rids = [f"{self.request_id}-{p}" for p in range(len(self.plan.prompts))]
        for p, rid in enumerate(self.rids):
            for j, sid in enumerate(sample_ids(rid, self.plan.best_of)):
                self.choices[sid] = Choice(p, j, TextStream(tok, stop))

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        s = self.state
        s.in_server += self.plan.num_seqs
        s.metrics.in_server.set(s.in_server)
        if s.request_timeout_s is not None:
            self.timer = loop.call_later(s.request_timeout_s, self.queue.put_nowait, ("timeout",))
        for rid, prompt in zip(self.rids, self.plan.prompts):
            self.live.add(rid)
            s.loop.submit(rid, prompt, self.plan.params, loop, self.queue)

    async def _next(self):
        item = await self.queue.get()
        if item[0] == "error":
            self.live.discard(item[1])  # the engine side has already dropped it
            status, message = item[2], item[3]
            if status == 400:  # the engine's words for one prompt, in the API's
                where = f"prompt[{self.rids.index(item[1])}]" if len(self.rids) > 1 else "the prompt"
                message = message.replace("prompts[0]", where).replace("max_new_tokens", "max_tokens")
                message = message.replace("SamplingParams.structured", "response_format")
            param = engine_param(message) if status == 400 else None
            code = "context_length_exceeded" if status == 400 and "context window" in message else None
            raise RequestFailure(status, message, "error", param, code)
        if item[0] == "timeout":
            raise RequestFailure(504, f"request timed out after {self.state.request_timeout_s} s", "timeout")
        if item[0] == "disconnect":
            raise RequestFailure(499, "the client disconnected", "abort")
        return item

    async def admitted(self) -> None:
        """Wait until the engine has queued every prompt (or refused one: raises ``RequestFailure``)."""
        self.prompt_tokens = [0] * len(self.rids)
        for _ in self.rids:
            _, rid, n_tokens = await self._next()
            self.prompt_tokens[self.rids.index(rid)] = n_tokens
        self.state.metrics.prompt_tokens.inc(sum(self.prompt_tokens))
        for n in self.prompt_tokens:
            self.state.metrics.prompt_hist.observe(n)

    async def events(self) -> AsyncIterator[tuple[Choice, str, object]]:
        """(choice, text delta, TokenEvent) per generated token, in the order the engine made them."""
        while self.live:
            _, rid, ev, last = await self._next()
            choice = self.choices[ev.request]
            self.state.metrics.token(ev, self.arrival, choice.token_times[-1] if choice.token_times else None)
            if ev.first_scheduled is not None:
                choice.scheduled = ev.first_scheduled
            choice.token_times.append(ev.time)
            choice.token_ids.append(ev.token_id)
            if ev.logprob is not None:
                choice.logprobs.append((ev.token_id, ev.logprob, ev.top_logprobs))
                choice.cumulative_logprob += ev.logprob
            choice.finish_reason = ev.finish_reason if ev.finished else None
            if last:
                self.live.discard(rid)
            yield choice, choice.text.push(ev.token_id, choice.finish_reason), ev

    def answered(self) -> list[tuple[int, Choice]]:
        """(OpenAI index, choice) of the choices the answer holds: per prompt the ``n`` of its ``best_of``
        samples with the highest summed log-prob (all of them, in order, when best_of = n)."""
        n, out = self.plan.n, []
        for p in range(len(self.rids)):
            mine = [c for c in self.choices.values() if c.prompt == p]
            if self.plan.best_of > n:
                mine = sorted(mine, key=lambda c: -c.cumulative_logprob)[:n]
            out += [(p * n + k, c) for k, c in enumerate(mine)]
        return out

    def close(self, reason: str | None = None) -> None:
        """Idempotent: abort in the engine what is still live, count how each choice ended, release its place."""
        if self.closed:
            return
        self.closed = True
        s = self.state
        if self.timer is not None:
            self.timer.cancel()
        for rid in self.live:
            s.loop.abort(rid)  # every sample of that prompt
        for c in self.choices.values():
            s.metrics.finished(c.finish_reason or reason or "abort", c.token_times, self.arrival, c.scheduled)
        s.in_server -= self.plan.num_seqs
        s.metrics.in_server.set(s.in_server)

    def usage(self) -> dict:
        prompt = sum(self.prompt_tokens)
        n = sum(len(c.token_ids) for c in self.choices.values())
        return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}


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
    in_server: int = 0  # sequences admitted and not yet answered; only the event loop thread changes it
    strings: object = None  # responses.TokenStrings of the tokenizer, once it is known


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
