"""A bounded soak of the server on 127.0.0.1: for SOAK_S seconds, WORKERS clients send a seeded mix of
non-streaming and streaming requests (completions and chat, n = 1 or 2, some with log-probs), streams cut
mid-way and non-streaming clients that give up, malformed bodies, and more requests than ``max_queue`` holds
(429s). It then checks that every request ended in a result or a clear OpenAI error, that the server counted
every sequence it was sent, that no KV byte and no bookkeeping entry is left behind, and that the process's
memory stayed under a bound. It runs twice: with the engine loop in the server's process, and with an
``EngineProcess`` (the engine in its own process, as production servers run it). Runs in ``make test`` (about
20 s each on a 2-core CPU); ``-m "not soak"`` skips it."""

import asyncio
import json
import random
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")

from course_lib.engine import Engine  # noqa: E402
from course_lib.serving.server import EngineProcess, serve  # noqa: E402
from tests.test_server import kv_idle, metric_values  # noqa: E402

pytestmark = pytest.mark.soak

SOAK_S = 12.0  # seconds of load; the test stops by itself
WORKERS = 16
MAX_QUEUE = 10  # fewer places than the workers' sequences: the queue overflows
RSS_GROWTH_MB = 160  # growth bound over the soak (warm-up excluded); measured: +60-75 MiB in the first 12 s, flat after
PROMPTS = ["def fibonacci(n):", "import os\nimport", "class Config:", "for i in range(10):"]
MALFORMED = [
    ("raw", "{not json"),
    ("json", {"prompt": "x", "temperature": "hot"}),
    ("json", {"prompt": "x", "tools": []}),
    ("json", {"prompt": []}),
    ("json", {"prompt": "x", "n": 0}),
    ("json", {"prompt": "x", "logit_bias": {"a": 1}}),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
]


def is_clear_error(status: int, body) -> bool:
    """An OpenAI error body (string type and code, a message); a 429 also says when to retry."""
    try:
        err = body["error"]
    except (TypeError, KeyError):
        return False
    return isinstance(err.get("message"), str) and isinstance(err.get("type"), str) and isinstance(err.get("code"), str)


async def one_request(c: httpx.AsyncClient, rng: random.Random, log: list) -> None:
    kind = rng.choices(["plain", "stream", "cut", "give_up", "malformed"], [30, 35, 15, 8, 12])[0]
    if kind == "malformed":
        how, body = rng.choice(MALFORMED)
        url = "/v1/chat/completions" if how == "chat" else "/v1/completions"
        if how == "raw":
            r = await c.post(url, content=body, headers={"content-type": "application/json"})
        else:
            r = await c.post(url, json=body)
        log.append(("malformed", r.status_code, 0, r.status_code == 400 and is_clear_error(400, r.json())))
        return
    n = rng.choice([1, 1, 1, 2])
    chat = rng.random() < 0.3
    body = {"max_tokens": rng.randint(1, 24), "n": n, "temperature": rng.choice([0, 0.8]), "seed": rng.randint(0, 99)}
    if rng.random() < 0.3:
        body |= {"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2}
    if chat:
        body["messages"], url = [{"role": "user", "content": rng.choice(PROMPTS)}], "/v1/chat/completions"
    else:
        body["prompt"], url = rng.choice(PROMPTS), "/v1/completions"
    if kind == "give_up":  # a non-streaming client whose read timeout is shorter than the answer
        body["max_tokens"], body["ignore_eos"] = 200, True
        try:
            r = await c.post(url, json=body, timeout=httpx.Timeout(30, read=0.05))
        except httpx.ReadTimeout:
            log.append(("gave_up", None, n, True))
            return
        log.append(("gave_up", r.status_code, n, r.status_code in (200, 429)))
        return
    if kind == "plain":
        r = await c.post(url, json=body)
        data = r.json()
        if r.status_code == 200:
            ok = len(data["choices"]) == n and all(ch["finish_reason"] in ("stop", "length") for ch in data["choices"])
        else:
            ok = is_clear_error(r.status_code, data) and (r.status_code != 429 or int(r.headers["retry-after"]) >= 1)
        log.append(("plain", r.status_code, n, ok))
        return
    cut_at = rng.randint(1, 4) if kind == "cut" else None
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    async with c.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            data = json.loads(await r.aread())
            log.append((kind, r.status_code, n, is_clear_error(r.status_code, data)))
            return
        finished, events, done, error = set(), 0, False, None
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                error = chunk
                continue
            events += 1
            for ch in chunk["choices"]:
                if ch.get("finish_reason"):
                    finished.add(ch["index"])
            if cut_at is not None and events >= cut_at:
                break  # leaving the block closes the connection mid-stream
    if cut_at is not None and not done:
        log.append(("cut", 200, n, True))
    else:
        ok = done and (finished == set(range(n)) or (error is not None and is_clear_error(500, error)))
        log.append((kind, 200, n, ok))


async def soak(url: str, seed: int) -> list:
    log: list = []
    deadline = time.monotonic() + SOAK_S
    limits = httpx.Limits(max_connections=WORKERS + 4)

    async def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as c:
            while time.monotonic() < deadline:
                await one_request(c, rng, log)
                if log[-1][1] == 429:  # back off a little (a polite client; Retry-After says ≥ 1 s)
                    await asyncio.sleep(rng.uniform(0.1, 0.5))

    await asyncio.gather(*(worker(i) for i in range(WORKERS)))
    return log


def engine_bookkeeping(engine) -> tuple[int, bool]:
    """Module-level (picklable): what the engine still tracks, read inside an EngineProcess's child too."""
    return len(engine._live), engine.has_unfinished()


@pytest.mark.parametrize("where", ["thread", "process"])
def test_soak_every_request_ends_and_nothing_leaks(where):
    """``thread``: the engine loop shares the server's process; ``process``: an EngineProcess, as production
    servers run it (the tokens cross a pipe; RSS is the parent's plus the child's)."""
    engine = Engine("tiny-target") if where == "thread" else EngineProcess("tiny-target", threads=1)
    with serve(engine, max_queue=MAX_QUEUE, request_timeout_s=20) as h:
        procs = [psutil.Process()] + ([psutil.Process(engine.pid)] if where == "process" else [])

        def rss() -> int:
            return sum(p.memory_info().rss for p in procs)

        asyncio.run(_warm(h.url))  # first batch shapes, packed weights: not counted as growth
        rss0 = rss()
        warm = sum(v for k, v in metric_values(h).items() if k.startswith("course_requests_total{"))
        t0 = time.monotonic()
        log = asyncio.run(soak(h.url, seed=1))
        elapsed = time.monotonic() - t0
        assert kv_idle(h, timeout=15)  # every abort reached the engine; its KV is free
        rss1 = rss()
        m = metric_values(h)
        bookkeeping = h.engine_loop.call(engine_bookkeeping)
        if where == "thread":
            core_left = (len(h.engine_loop._core.live), len(h.engine_loop._core.owner), len(h.engine_loop._sinks))
        else:  # the core lives in the child (its engine's bookkeeping is read above); the parent keeps sinks
            core_left = (0, 0, len(engine._sinks))
    by_kind: dict = {}
    for kind, status, _, ok in log:
        by_kind.setdefault((kind, status), [0, 0])[0 if ok else 1] += 1
    print(
        f"{where}: {len(log)} requests in {elapsed:.1f} s; RSS {rss0 / 2**20:.0f} → {rss1 / 2**20:.0f} MiB; {by_kind}"
    )
    bad = [entry for entry in log if not entry[3]]
    assert not bad, f"requests without a result or a clear error: {bad[:5]}"
    statuses = {status for _, status, _, _ in log}
    assert statuses <= {200, 400, 429, None}, statuses
    assert 429 in statuses and any(k == "cut" for k, *_ in log) and any(k == "gave_up" for k, *_ in log)
    assert elapsed < SOAK_S + 15  # it stopped by itself
    # the server counted every sequence it was sent (malformed bodies never became sequences)
    sent = sum(n for kind, _, n, _ in log if kind != "malformed")
    counted = sum(v for k, v in m.items() if k.startswith("course_requests_total{")) - warm
    assert counted == sent, (counted, sent)
    for gauge in ("kv_cache_bytes_used", "kv_cache_bytes_reserved", "kv_cache_usage_perc", "requests_in_server",
                  "num_requests_running", "num_requests_waiting"):  # fmt: skip
        assert m[f"course_{gauge}"] == 0, gauge
    assert bookkeeping == (0, False) and core_left == (0, 0, 0)
    assert (rss1 - rss0) / 2**20 < RSS_GROWTH_MB


async def _warm(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        body = {"prompt": PROMPTS[0], "max_tokens": 4, "n": 2, "temperature": 0.8, "seed": 0}
        await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(3)))
