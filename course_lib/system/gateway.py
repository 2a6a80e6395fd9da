"""A model gateway: one OpenAI-compatible entry point in front of several backends (Huyen, *AI Engineering*,
ch. 10), with the four jobs a gateway does besides forwarding.

``create_gateway`` builds a FastAPI app with ``POST /v1/chat/completions`` (OpenAI's request and response
bodies, ``usage`` included). Per request it (1) checks the key (``Authorization: Bearer <key>``; 401 for an
unknown one) and takes a token from that key's ``TokenBucket`` (429 with ``Retry-After`` when empty);
(2) routes: ``model="auto"`` asks the router, a backend's name picks it; (3) calls the backend with a
timeout, and on an error or a timeout calls the route's fallback instead (502 when none answers, in OpenAI's
error body); (4) writes one ``LedgerEntry`` per request: key, backend, tokens in and out, dollars at the
backend's prices, whether it fell back, and the seconds spent inside the gateway. Backends are objects with
``complete(messages, max_tokens) -> Reply``: ``EngineBackend`` wraps a course ``Engine`` (chat template for a
chat model, the last message as a raw prefix for a code model), ``FaultyBackend`` injects errors and delays
to exercise the fallback. The gateway is the only process that sees every request, which is why cost
accounting and limits live there. Introduced in 08_system_1_context_guardrails_gateway.ipynb.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from course_lib.engine import SamplingParams


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class TokenBucket:
    """``rate`` tokens per second refill a bucket of at most ``burst``; a request takes one (or ``n``).
    ``clock`` is injectable so tests need no sleeping."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst = _positive("rate", rate), _positive("burst", burst)
        self.clock = clock
        self.tokens, self.last = self.burst, clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now

    def try_take(self, n: float = 1.0) -> bool:
        n = _positive("n", n)
        with self._lock:
            self._refill()
            if self.tokens >= n:
                self.tokens -= n
                return True
            return False

    def retry_after(self, n: float = 1.0) -> float:
        """Seconds until ``n`` tokens are there (0 if they are now)."""
        with self._lock:
            self._refill()
            return max(0.0, (n - self.tokens) / self.rate)


@dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Prices:
    """Dollars per million tokens, input (prefill) and output (decode), as APIs price them."""

    input_usd_per_mtok: float
    output_usd_per_mtok: float

    def __post_init__(self) -> None:
        for name in ("input_usd_per_mtok", "output_usd_per_mtok"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")

    def usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_usd_per_mtok + completion_tokens * self.output_usd_per_mtok) / 1e6


class EngineBackend:
    """A course ``Engine`` as a gateway backend, greedy. ``chat=True``: the messages go through the tokenizer's
    chat template; ``chat=False`` (a code model): the last message's content is the prefix to continue.
    One request at a time (a lock): the engine's ``generate`` needs an idle engine."""

    def __init__(self, engine, prices: Prices, chat: bool) -> None:
        if not isinstance(prices, Prices):
            raise ValueError(f"prices must be a Prices, got {type(prices).__name__}")
        if chat and not getattr(engine.tokenizer, "chat_template", None):
            raise ValueError("chat=True needs an engine whose tokenizer has a chat template")
        self.engine, self.prices, self.chat = engine, prices, bool(chat)
        self._lock = threading.Lock()

    def prompt(self, messages: list[dict]) -> str:
        if self.chat:
            return self.engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return messages[-1]["content"]

    def complete(self, messages: list[dict], max_tokens: int) -> Reply:
        with self._lock:
            [r] = self.engine.generate([self.prompt(messages)], SamplingParams(max_new_tokens=max_tokens))
        return Reply(r.text, len(r.prompt_ids), len(r.output_ids))


class EchoBackend:
    """Answers at once with the last message, counting words as tokens: the gateway's own latency, alone."""

    prices = Prices(0.0, 0.0)

    def complete(self, messages: list[dict], max_tokens: int) -> Reply:
        text = messages[-1]["content"]
        return Reply(text, len(text.split()), min(max_tokens, len(text.split())))


class FaultyBackend:
    """``inner`` with faults: calls numbered in ``fail_calls`` (0-based) raise, those in ``slow_calls`` first
    sleep ``delay_s``. Deterministic, so a demonstration and a test see the same faults."""

    def __init__(self, inner, fail_calls=(), slow_calls=(), delay_s: float = 0.0) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s!r}")
        self.inner, self.fail_calls, self.slow_calls, self.delay_s = inner, set(fail_calls), set(slow_calls), delay_s
        self.prices, self.calls = inner.prices, 0

    def complete(self, messages: list[dict], max_tokens: int) -> Reply:
        i, self.calls = self.calls, self.calls + 1
        if i in self.slow_calls:
            time.sleep(self.delay_s)
        if i in self.fail_calls:
            raise RuntimeError(f"injected failure on call {i}")
        return self.inner.complete(messages, max_tokens)


@dataclass(frozen=True)
class LedgerEntry:
    key: str
    route: str  # the backend the router (or the request's model) chose
    backend: str  # the backend that answered ("" when none did)
    fell_back: bool
    prompt_tokens: int
    completion_tokens: int
    usd: float
    gateway_s: float  # from the request entering the handler to the response being built
    status: int


@dataclass
class Ledger:
    entries: list[LedgerEntry] = field(default_factory=list)

    def total_usd(self, key: str | None = None) -> float:
        return sum(e.usd for e in self.entries if key is None or e.key == key)

    def by_backend(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for e in self.entries:
            if e.backend:
                d = out.setdefault(e.backend, {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "usd": 0.0})
                d["requests"] += 1
                d["prompt_tokens"] += e.prompt_tokens
                d["completion_tokens"] += e.completion_tokens
                d["usd"] += e.usd
        return out


def _error(status: int, message: str, type_: str, param: str | None = None, headers=None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": type_}}
    return JSONResponse(body, status_code=status, headers=headers)


def _check_messages(body) -> tuple[list[dict], int] | str:
    """(messages, max_tokens), or the name of the field that is wrong."""
    if not isinstance(body, dict):
        return "body"
    msgs = body.get("messages")
    ok = isinstance(msgs, list) and msgs
    if not ok or not all(isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in msgs):
        return "messages"
    max_tokens = body.get("max_tokens", 16)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens"
    return msgs, max_tokens


def create_gateway(
    backends: dict,
    router: Callable[[str], str],
    *,
    keys: dict[str, TokenBucket],
    fallbacks: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> FastAPI:
    """The gateway app. ``backends``: name → backend (``complete(messages, max_tokens) -> Reply`` and a
    ``prices``); ``router``: last user message → backend name; ``keys``: API key → its bucket; ``fallbacks``:
    backend name → the backend to try when it fails or exceeds ``timeout_s``. ``app.state.ledger`` is the
    ``Ledger``. A timed-out call keeps running on its backend's worker thread (a real gateway cannot stop a
    remote server either; the course server aborts past its own ``request_timeout_s``)."""
    if not backends or not all(hasattr(b, "complete") and isinstance(b.prices, Prices) for b in backends.values()):
        raise ValueError("backends must be a non-empty dict of name -> backend with complete() and Prices")
    if not callable(router):
        raise ValueError(f"router must be a callable text -> backend name, got {type(router).__name__}")
    if not keys or not all(isinstance(b, TokenBucket) for b in keys.values()):
        raise ValueError("keys must be a non-empty dict of API key -> TokenBucket")
    fallbacks = dict(fallbacks or {})
    for a, b in fallbacks.items():
        if a not in backends or b not in backends or a == b:
            raise ValueError(f"fallbacks must map a backend name to another one, got {a!r} -> {b!r}")
    _positive("timeout_s", timeout_s)
    pools = {name: ThreadPoolExecutor(1, thread_name_prefix=f"gateway-{name}") for name in backends}
    ledger = Ledger()
    app = FastAPI(title="course gateway")
    app.state.ledger = ledger

    async def call(name: str, msgs: list[dict], max_tokens: int) -> Reply:
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(pools[name], backends[name].complete, msgs, max_tokens)
        return await asyncio.wait_for(fut, timeout_s)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        t0 = time.perf_counter()
        auth = request.headers.get("authorization", "")
        key = auth.removeprefix("Bearer ").strip()
        if key not in keys:
            return _error(401, "unknown API key: send 'Authorization: Bearer <key>'", "invalid_api_key")
        bucket = keys[key]
        if not bucket.try_take():
            wait = bucket.retry_after()
            ledger.entries.append(LedgerEntry(key, "", "", False, 0, 0, 0.0, time.perf_counter() - t0, 429))
            return _error(429, f"rate limit for this key: retry in {wait:.2f} s", "rate_limit_exceeded",
                          headers={"Retry-After": f"{math.ceil(wait)}"})  # fmt: skip
        try:
            body = await request.json()
        except ValueError:
            body = None
        parsed = _check_messages(body)
        if isinstance(parsed, str):
            return _error(400, f"invalid field {parsed!r}: messages must be a non-empty list of "
                          "{role, content: str}, max_tokens an int >= 1", "invalid_request_error", parsed)  # fmt: skip
        msgs, max_tokens = parsed
        model = body.get("model", "auto")
        route = router(msgs[-1]["content"]) if model == "auto" else model
        if route not in backends:
            return _error(404, f"unknown model {model!r}: use 'auto' or one of {sorted(backends)}", "model_not_found")
        tried, reply, name = [route], None, route
        while reply is None:
            try:
                reply = await call(name, msgs, max_tokens)
            except (Exception, asyncio.TimeoutError):  # noqa: BLE001 - any backend failure falls back
                nxt = fallbacks.get(name)
                if nxt is None or nxt in tried:
                    ledger.entries.append(LedgerEntry(key, route, "", len(tried) > 1, 0, 0, 0.0,
                                                      time.perf_counter() - t0, 502))  # fmt: skip
                    return _error(502, f"no backend answered (tried {tried})", "backend_error")
                tried.append(nxt)
                name = nxt
        usd = backends[name].prices.usd(reply.prompt_tokens, reply.completion_tokens)
        usage = {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                 "total_tokens": reply.prompt_tokens + reply.completion_tokens}  # fmt: skip
        out = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": name, "usage": usage,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text}, "finish_reason": "stop"}],
        }  # fmt: skip
        dt = time.perf_counter() - t0
        ledger.entries.append(LedgerEntry(key, route, name, len(tried) > 1, reply.prompt_tokens,
                                          reply.completion_tokens, usd, dt, 200))  # fmt: skip
        return JSONResponse(out, headers={"x-gateway-backend": name, "x-gateway-cost-usd": f"{usd:.3e}"})

    return app


def _stats(times: list[float]) -> dict:
    s = sorted(times)
    return {"p50_s": s[len(s) // 2], "p99_s": s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)], "all": times}


def latency(fns, n: int) -> dict:
    """p50 and p99 (seconds) of ``n`` timed calls (``time.perf_counter``) of ``fns``: one callable, or a dict
    name → callable timed in turn (a, b, a, b, …) so that a disturbance on a shared machine hits all alike;
    then a dict name → stats."""
    one = callable(fns)
    table = {"": fns} if one else fns
    if not isinstance(table, dict) or not table or not all(callable(f) for f in table.values()):
        raise ValueError(f"fns must be a callable or a non-empty dict of name -> callable, got {fns!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2, got {n!r}")
    times: dict[str, list[float]] = {k: [] for k in table}
    for _ in range(n):
        for k, fn in table.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    out = {k: _stats(v) for k, v in times.items()}
    return out[""] if one else out


__all__ = [
    "EchoBackend", "EngineBackend", "FaultyBackend", "Ledger", "LedgerEntry", "Prices", "Reply", "TokenBucket",
    "create_gateway", "latency",
]  # fmt: skip
