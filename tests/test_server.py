"""The OpenAI-compatible server and the load generator (chapter 06), against tiny-target on 127.0.0.1."""

import asyncio
import concurrent.futures
import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from course_lib.engine import Engine, SamplingParams, SchedulerConfig  # noqa: E402
from course_lib.measure.metrics import SLO  # noqa: E402
from course_lib.serving.loadgen import (  # noqa: E402
    TimedRequest,
    measure_engine,
    run_load,
    schedule,
    server_overhead,
)
from course_lib.serving.server import EngineProcess, render_chat, serve  # noqa: E402

PROMPT = "def fibonacci(n):"
N = 8  # tokens per request: enough to stream, few enough to stay fast


@pytest.fixture(scope="module")
def engine():
    return Engine("tiny-target")


@pytest.fixture(scope="module")
def refs(engine):
    """Greedy outputs of the engine itself, computed before any server owns it."""
    chat = render_chat([{"role": "user", "content": "Write a loop"}])
    stop = SamplingParams(max_new_tokens=N, stop=("number",))
    greedy = SamplingParams(max_new_tokens=N)
    # on a worker thread, like the server's engine loop (on a loaded CPU torch's OpenMP pool is far slower on
    # the main thread); the outputs are the same
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        out = pool.submit(engine.generate, [PROMPT, chat], greedy).result()
        out_stop = pool.submit(engine.generate, [PROMPT], stop).result()[0]
    return {"text": out[0].text, "chat": out[1].text, "stop": out_stop.text, "stop_reason": out_stop.finish_reason}


@pytest.fixture
def server(engine, refs):
    with serve(engine, max_queue=8, request_timeout_s=30) as handle:
        yield handle


@pytest.fixture
def slow_engine(engine, monkeypatch):
    """The engine with every step held 5 ms longer: a test of aborts needs a request still running when the
    client gives up, whatever the machine (the default C decode step runs tiny-target's 400 tokens in ~0.2 s)."""
    real = engine.step

    def step(*args, **kwargs):
        time.sleep(0.005)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "step", step)
    return engine


def sse(lines) -> list:
    """The data payloads of a server-sent event stream: dicts, and the final "[DONE]"."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def kv_state(e) -> tuple[bool, int]:
    """Module-level (picklable): an EngineProcess runs it in its child."""
    return e.has_unfinished(), e.backend.bytes_used()


def kv_idle(handle, timeout: float = 10.0) -> bool:
    """Poll the engine (on its own thread or process) until nothing is live and no KV byte is held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy, used = handle.engine_loop.call(kv_state)
        if not busy and used == 0:
            return True
        time.sleep(0.05)
    return False


def metric_values(handle) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(handle.url + "/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            values[key] = s.value
    return values


def test_completions_match_engine_greedy(server, refs):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.get("/health").json() == {"status": "ok"}
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["tiny-target"]
        body = {"model": "tiny-target", "prompt": PROMPT, "max_tokens": N, "temperature": 0}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["object"] == "text_completion"
        assert out["choices"][0]["text"] == refs["text"]
        assert out["choices"][0]["finish_reason"] == "length"
        assert out["usage"]["completion_tokens"] == N
        assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + N

        body |= {"stream": True, "stream_options": {"include_usage": True}}
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse(r.iter_lines())
        assert events[-1] == "[DONE]"
        chunks = [e for e in events[:-1] if e["choices"]]
        assert len(chunks) == N  # one chunk per generated token
        assert "".join(e["choices"][0]["text"] for e in chunks) == refs["text"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert events[-2]["usage"]["completion_tokens"] == N

        # a stop string: streamed pieces and the whole text both end before it, as Engine.generate's text
        body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "stop": "number"}
        whole = c.post("/v1/completions", json=body).json()["choices"][0]
        with c.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
            streamed = "".join(e["choices"][0]["text"] for e in sse(r.iter_lines())[:-1])
        assert whole["text"] == streamed == refs["stop"]
        assert whole["finish_reason"] == ("stop" if refs["stop_reason"] in ("stop", "eos") else "length")

        # chat with the documented fallback template
        chat = {"messages": [{"role": "user", "content": "Write a loop"}], "max_tokens": N, "temperature": 0}
        out = c.post("/v1/chat/completions", json=chat).json()
        assert out["object"] == "chat.completion"
        assert out["choices"][0]["message"] == {"role": "assistant", "content": refs["chat"]}
    assert kv_idle(server)


def test_openai_client(server, refs):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0, timeout=60)
    out = client.completions.create(model="tiny-target", prompt=PROMPT, max_tokens=N, temperature=0)
    assert out.choices[0].text == refs["text"]
    assert out.usage.completion_tokens == N
    stream = client.completions.create(model="tiny-target", prompt=PROMPT, max_tokens=N, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream) == refs["text"]
    chat = client.chat.completions.create(
        model="tiny-target", messages=[{"role": "user", "content": "Write a loop"}], max_tokens=N, temperature=0,
        stream=True,
    )  # fmt: skip
    assert "".join(ch.choices[0].delta.content or "" for ch in chat) == refs["chat"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=N)
    client.close()


@pytest.mark.parametrize(
    "body, status, words",
    [
        ("{not json", 400, "not valid JSON"),
        ({}, 400, "prompt"),
        ({"prompt": 3}, 400, "prompt"),
        ({"prompt": ["a", 2]}, 400, "prompt"),
        ({"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": PROMPT, "temperature": -1}, 400, "temperature"),
        ({"prompt": PROMPT, "top_p": 0}, 400, "top_p"),
        ({"prompt": PROMPT, "n": 0}, 400, "n must be"),
        ({"prompt": PROMPT, "model": "gpt-4"}, 404, "gpt-4"),
        ({"prompt": [5] * 1020, "max_tokens": 16}, 400, "context window"),
        ({"prompt": [10**9]}, 400, "token ids"),
    ],
)
def test_malformed_bodies_are_4xx(server, body, status, words):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        if isinstance(body, str):
            r = c.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        else:
            r = c.post("/v1/completions", json=body)
            if status == 400 and "prompt" in body:  # the same refusal when streaming: before any event
                assert c.post("/v1/completions", json=body | {"stream": True}).status_code == status
        assert r.status_code == status, r.text
        assert words in r.json()["error"]["message"]
        assert c.post("/v1/chat/completions", json={"messages": []}).status_code == 400
        assert c.get("/health").status_code == 200
    assert metric_values(server)["course_requests_in_server"] == 0


def is_openai_error(body: dict, status_type: str) -> bool:
    err = body["error"]
    return (
        set(err) == {"message", "type", "param", "code"}
        and err["type"] == status_type
        and isinstance(err["code"], str)
        and isinstance(err["message"], str)
        and (err["param"] is None or isinstance(err["param"], str))
    )


@pytest.mark.parametrize(
    "method, path, body, status, kind, code, param",
    [
        ("POST", "/v1/completions", "{oops", 400, "invalid_request_error", "invalid_json", None),
        ("POST", "/v1/completions", {}, 400, "invalid_request_error", "missing_required_parameter", "prompt"),
        ("POST", "/v1/completions", {"prompt": PROMPT, "top_p": "x"}, 400, "invalid_request_error", "invalid_type", "top_p"),
        ("POST", "/v1/completions", {"prompt": PROMPT, "top_p": 0}, 400, "invalid_request_error", "invalid_value", "top_p"),
        ("POST", "/v1/completions", {"prompt": PROMPT, "functions": []}, 400, "invalid_request_error", "unsupported_parameter", "functions"),
        ("POST", "/v1/completions", {"prompt": [5] * 1020}, 400, "invalid_request_error", "context_length_exceeded", "max_tokens"),
        ("POST", "/v1/completions", {"prompt": PROMPT, "model": "gpt-4"}, 404, "invalid_request_error", "model_not_found", "model"),
        ("POST", "/v1/nothing", {}, 404, "invalid_request_error", "not_found", None),
        ("GET", "/v1/completions", None, 405, "invalid_request_error", "method_not_allowed", None),
    ],
)  # fmt: skip
def test_error_bodies_have_openai_shape(server, method, path, body, status, kind, code, param):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        if isinstance(body, str):
            r = c.request(method, path, content=body, headers={"content-type": "application/json"})
        else:
            r = c.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert is_openai_error(r.json(), kind), r.json()
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param)


def test_openai_client_sees_429_with_retry_after(engine):
    openai = pytest.importorskip("openai")
    long = {"prompt": PROMPT, "max_tokens": 300, "temperature": 0, "ignore_eos": True, "stream": True}
    with serve(engine, max_queue=1) as h, httpx.Client(base_url=h.url, timeout=60) as c:
        client = openai.OpenAI(base_url=h.openai_base_url, api_key="-", max_retries=0, timeout=60)
        with c.stream("POST", "/v1/completions", json=long) as r:
            lines = r.iter_lines()  # kept: dropping the iterator would close the stream
            next(lines)  # the one place is taken
            with pytest.raises(openai.RateLimitError) as info:
                client.completions.create(model="tiny-target", prompt=PROMPT, max_tokens=N)
        assert int(info.value.response.headers["retry-after"]) >= 1
        assert info.value.body["code"] == "rate_limit_exceeded" and info.value.body["type"] == "rate_limit_error"
        client.close()
        assert kv_idle(h)


def test_loadgen_reads_string_and_int_error_codes():
    from course_lib.serving.loadgen.http_client import _status

    assert _status("timeout", 200) == 504 and _status("service_unavailable", 200) == 503
    assert _status(500, 200) == 500 and _status(None, 200) == 200 and _status("something_else", 200) == 500


def test_burst_above_the_queue_gets_429_and_every_request_is_accounted(engine, refs):
    n_burst, max_queue = 12, 3

    async def burst(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True}
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(n_burst)))

    with serve(engine, max_queue=max_queue) as h:
        replies = asyncio.run(burst(h.url))
        ok = [r for r in replies if r.status_code == 200]
        rejected = [r for r in replies if r.status_code == 429]
        assert len(ok) + len(rejected) == n_burst, [r.status_code for r in replies]  # nothing lost, nothing else
        assert 1 <= len(ok) and len(rejected) >= 1
        assert all(r.json()["choices"][0]["text"] == refs["text"] for r in ok)
        assert all("max_queue=3" in r.json()["error"]["message"] for r in rejected)
        assert all(r.json()["error"]["code"] == "rate_limit_exceeded" for r in rejected)
        assert all(int(r.headers["retry-after"]) >= 1 for r in rejected)  # about one request's latency
        m = metric_values(h)
        assert m["course_requests_total{finish_reason=rejected}"] == len(rejected)
        assert m["course_requests_total{finish_reason=length}"] == len(ok)
        assert kv_idle(h)


def test_client_disconnect_aborts_and_frees_kv(slow_engine, refs):
    body = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
    with (
        serve(slow_engine, max_queue=8, request_timeout_s=30) as server,
        httpx.Client(base_url=server.url, timeout=60) as c,
    ):
        with c.stream("POST", "/v1/completions", json=body) as r:
            lines, seen = r.iter_lines(), 0  # keep the iterator: dropping it would close the connection
            for line in lines:
                seen += line.startswith("data: ")
                if seen == 3:
                    break
            live = metric_values(server)
            assert live["course_num_requests_running"] == 1 and live["course_kv_cache_bytes_used"] > 0
        # leaving the block closed the connection mid-stream
        assert kv_idle(server)
        # a non-streaming client that gives up (read timeout) is aborted too
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/completions", json=body | {"stream": False}, timeout=httpx.Timeout(60, read=0.5))
        assert kv_idle(server)
        m = metric_values(server)
        assert m["course_requests_total{finish_reason=abort}"] == 2
        assert m["course_generation_tokens_total"] < 2 * 400
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": N, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == refs["text"]


def test_timeout_aborts_the_request(slow_engine):
    body = {"prompt": PROMPT, "max_tokens": 500, "temperature": 0, "ignore_eos": True}
    with serve(slow_engine, request_timeout_s=0.5) as h, httpx.Client(base_url=h.url, timeout=60) as c:
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 504 and "timed out" in r.json()["error"]["message"]
        with c.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
            if r.status_code == 200:  # timed out after the headers: an error event, then [DONE]
                events = sse(r.iter_lines())
                assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "timeout"
            else:  # timed out before the engine had even queued it
                r.read()
                assert r.status_code == 504
        assert kv_idle(h)
        assert metric_values(h)["course_requests_total{finish_reason=timeout}"] == 2


def test_engine_error_fails_the_request_not_the_loop(engine, refs, monkeypatch):
    calls = {"n": 0}
    real_step = engine.step

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected failure")
        return real_step()

    with serve(engine) as h, httpx.Client(base_url=h.url, timeout=60) as c:
        monkeypatch.setattr(engine, "step", flaky_step)
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": N, "temperature": 0})
        assert r.status_code == 500 and "injected failure" in r.json()["error"]["message"]
        assert kv_idle(h)
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": N, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == refs["text"]
        assert c.get("/health").status_code == 200
        assert h.engine_loop.step_errors == 1
        assert metric_values(h)["course_requests_total{finish_reason=error}"] == 1


def test_metrics_after_requests(server):
    """vLLM's metric names (course_ for vllm:), per sequence and per token."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for i in range(3):  # plain, streamed, and two samples of one prompt: 4 sequences
            body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True, "stream": i == 1}
            if i == 2:
                body |= {"n": 2, "temperature": 1.0, "seed": 0}
            assert c.post("/v1/completions", json=body).status_code == 200
    m, seqs = metric_values(server), 4
    for name in ("time_to_first_token", "request_queue_time", "request_prefill_time", "e2e_request_latency",
                 "request_time_per_output_token", "request_decode_time", "request_inference_time"):  # fmt: skip
        assert m[f"course_{name}_seconds_count"] == seqs, name
        assert 0 <= m[f"course_{name}_seconds_sum"] / seqs < 30, name
    assert m["course_inter_token_latency_seconds_count"] == seqs * (N - 1)  # one per token after the first
    assert 0 < m["course_inter_token_latency_seconds_sum"] / (seqs * (N - 1)) < 5
    assert m["course_request_queue_time_seconds_sum"] < m["course_time_to_first_token_seconds_sum"]
    assert m["course_request_success_total{finished_reason=length}"] == seqs
    assert m["course_requests_total{finish_reason=length}"] == seqs
    assert m["course_generation_tokens_total"] == seqs * N == m["course_request_generation_tokens_sum"]
    assert m["course_prompt_tokens_total"] == m["course_request_prompt_tokens_sum"] > 0
    assert m["course_request_prompt_tokens_count"] == 3  # prompts, not samples
    for gauge in ("num_requests_waiting", "num_requests_running", "num_requests_swapped", "requests_in_server",
                  "kv_cache_bytes_used", "kv_cache_bytes_reserved", "kv_cache_usage_perc"):  # fmt: skip
        assert m[f"course_{gauge}"] == 0, gauge
    assert m["course_num_preemptions_total"] == 0 and m["course_prefix_cache_queries_total"] == 0


def test_kv_usage_preemption_and_prefix_cache_metrics(refs):
    """A paged engine with room for one long request at a time: its KV usage while it runs, the preemptions
    two of them force, and the prefix cache hits of a repeated prompt."""
    engine = Engine("tiny-target", kv_cache="paged", prefix_caching=True, config=SchedulerConfig(max_kv_tokens=160))
    prompt = list(range(20, 100))  # 80 tokens: 5 blocks of 16
    body = {"prompt": prompt, "max_tokens": 60, "temperature": 0, "ignore_eos": True}

    async def two(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(2)))

    with serve(engine) as h, httpx.Client(base_url=h.url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
            live = metric_values(h)
            assert 0 < live["course_kv_cache_usage_perc"] <= 1 and live["course_num_requests_running"] == 1
        assert kv_idle(h)
        assert all(r.status_code == 200 for r in asyncio.run(two(h.url)))  # 2 × 140 tokens > 160: preempted
        m = metric_values(h)
        assert m["course_num_preemptions_total"] >= 1
        assert m["course_prefix_cache_hits_total"] > 0  # the same prompt again: its full blocks are cached
        assert m["course_prefix_cache_queries_total"] >= m["course_prefix_cache_hits_total"]
        assert m["course_kv_cache_usage_perc"] == 0 and m["course_kv_cache_bytes_used"] == 0


def test_engine_core_counts_swapped_sequences(engine):
    from course_lib.serving.server.core import EngineCore

    swap = Engine(
        engine.hf_model, engine.tokenizer, kv_cache="paged", block_size=4,
        config=SchedulerConfig(max_kv_tokens=48, preemption="swap"),
    )  # fmt: skip
    core = EngineCore(swap)
    for i in range(3):
        core.add(f"r{i}", list(range(10 + i, 22 + i)), SamplingParams(max_new_tokens=20, ignore_eos=True))
    seen = 0
    while swap.has_unfinished():
        core.step()
        g = core.gauges()
        seen = max(seen, g["swapped"])
        assert g["waiting"] + g["running"] + g["swapped"] <= 3 and 0 <= g["kv_usage"] <= 1
    assert seen >= 1 and core.gauges()["preemptions"] >= 1


def test_clean_stop_and_engine_ownership(engine):
    before = {t.ident for t in threading.enumerate()}
    h = serve(engine)
    with pytest.raises(RuntimeError, match="already driven"):
        serve(engine)  # one engine, one loop thread
    body = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=h.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        next(lines)
        h.stop()  # with a stream still open: it ends with a 503 error event
        events = sse(lines)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "service_unavailable"
    assert not h.running and not h.engine_loop.alive
    assert {t.ident for t in threading.enumerate()} == before
    assert not engine.has_unfinished() and engine.backend.bytes_used() == 0
    with serve(engine) as again:  # the engine is free to serve again
        assert httpx.get(again.url + "/health").status_code == 200
    assert {t.ident for t in threading.enumerate()} == before


def test_loadgen_against_server_and_in_process(engine, refs):
    timed = schedule([(PROMPT, N)] * 3 + [(tuple(engine.tokenizer(PROMPT)["input_ids"]), N)], rate=50.0, seed=1)
    assert [t.arrival_s for t in timed] == sorted(t.arrival_s for t in timed) and timed[0].arrival_s == 0
    slo = SLO(ttft_s=60.0, tpot_s=10.0)
    base = measure_engine(engine, timed, slo=slo, ignore_eos=False)
    with serve(engine) as h:
        res = run_load(h.url, timed, slo=slo, ignore_eos=False)
        rejected = run_load(h.url, [TimedRequest(0.0, PROMPT, 2000)])  # past the context window: an error
    for result in (base, res):
        assert result.n_ok == 4 and result.errors == {}
        assert [r.text for r in result.results] == [refs["text"]] * 4
        assert all(len(r.token_times) == N and r.prompt_tokens > 0 for r in result.results)
        s = result.summary
        assert s.completed == 4 and s.slo_attainment == 1.0 and s.goodput_rps > 0
        assert 0 < result.p("ttft", 50) <= result.p("ttft", 99) and result.p("tpot") > 0 and result.p("itl", 90) > 0
        assert result.requests_per_s > 0 and result.output_tokens_per_s > 0
        assert "req/s" in result.table()
    assert rejected.n_ok == 0 and rejected.errors == {400: 1} and "context window" in rejected.results[0].error
    overhead = server_overhead(res, base)
    assert overhead.server_s > 0 and overhead.engine_s > 0 and "TPOT" in str(overhead)
    with pytest.raises(ValueError):
        schedule([(PROMPT, N)], rate=0)


# ----------------------------------------------------------------------------- the engine in its own process
def test_engine_process_bad_arguments():
    with pytest.raises(ValueError, match="threads must be"):
        EngineProcess("tiny-target", threads=0)
    with pytest.raises(ValueError, match="model must be a model name or folder"):
        EngineProcess(object())
    with pytest.raises(ValueError, match="startup_timeout_s"):
        EngineProcess("tiny-target", startup_timeout_s=0)
    for cpus in ({10_000}, set(), "0"):
        with pytest.raises(ValueError, match="cpus must be"):
            EngineProcess("tiny-target", cpus=cpus)


def test_engine_process_serves_the_same_text_and_stops_clean(refs):
    """Greedy text (plain, streamed, stop string, chat, the openai client), disconnect, metrics, then a clean
    stop: the child exits and no thread is left."""
    from openai import OpenAI

    before = {t.ident for t in threading.enumerate()}
    proc = EngineProcess("tiny-target", threads=1)
    with serve(proc, max_queue=8) as h:
        assert proc.alive and proc.pid is not None
        with httpx.Client(base_url=h.url, timeout=60) as c:
            body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0}
            assert c.post("/v1/completions", json=body).json()["choices"][0]["text"] == refs["text"]
            with c.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
                events = sse(r.iter_lines())
            assert events[-1] == "[DONE]" and len(events) == N + 1
            assert "".join(e["choices"][0]["text"] for e in events[:-1]) == refs["text"]
            stop = c.post("/v1/completions", json=body | {"stop": "number"}).json()["choices"][0]
            assert stop["text"] == refs["stop"]
            chat = {"messages": [{"role": "user", "content": "Write a loop"}], "max_tokens": N, "temperature": 0}
            assert c.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"] == refs["chat"]
            # two samples with log-probs: the TokenEvent's every field crosses the pipe
            two = c.post("/v1/completions", json=body | {"n": 2, "logprobs": 1, "temperature": 1, "seed": 1}).json()
            assert [ch["index"] for ch in two["choices"]] == [0, 1]
            assert all(len(ch["logprobs"]["token_logprobs"]) == N for ch in two["choices"])
            client = OpenAI(base_url=h.openai_base_url, api_key="-")
            pieces = [
                ch.choices[0].text
                for ch in client.completions.create(
                    model="tiny-target", prompt=PROMPT, max_tokens=N, temperature=0, stream=True
                )
            ]
            assert "".join(pieces) == refs["text"]
            long = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
            with c.stream("POST", "/v1/completions", json=long) as r:
                lines, seen = r.iter_lines(), 0
                for line in lines:
                    seen += line.startswith("data: ")
                    if seen == 3:
                        break
                assert metric_values(h)["course_num_requests_running"] == 1
            assert kv_idle(h)  # the disconnect aborted it in the child and freed its KV
        m = metric_values(h)
        assert m["course_requests_total{finish_reason=abort}"] == 1
        assert m["course_kv_cache_bytes_used"] == 0 and m["course_num_requests_running"] == 0
        assert proc.steps > 0 and proc.step_errors == 0
        with pytest.raises(ValueError, match="picklable"):
            proc.call(lambda e: 1)
    assert not proc.alive and proc._proc is None
    assert {t.ident for t in threading.enumerate()} == before


def test_engine_process_crash_fails_requests_without_hanging():
    import os
    import signal

    proc = EngineProcess("tiny-target", threads=1)
    with serve(proc) as h, httpx.Client(base_url=h.url, timeout=30) as c:
        body = {"prompt": PROMPT, "max_tokens": 500, "temperature": 0, "ignore_eos": True, "stream": True}
        with c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            os.kill(proc.pid, signal.SIGKILL)  # the engine dies mid-stream
            events = sse(lines)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_error"
        deadline = time.monotonic() + 10
        while proc.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not proc.alive
        health = c.get("/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "service_unavailable"
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": N})
        assert r.status_code == 503  # refused at once, not queued forever
        assert int(r.headers["retry-after"]) > 0 and int(health.headers["retry-after"]) > 0
    assert proc._proc is None


def test_engine_process_that_cannot_build_its_engine_says_why():
    proc = EngineProcess("no-such-model", startup_timeout_s=60)
    with pytest.raises(RuntimeError, match="failed to build its engine") as info:
        proc.start()
    assert "no-such-model" in str(info.value)
    assert not proc.alive


def test_scrape_reads_histograms_as_promql_would():
    import math

    import pytest

    from course_lib.serving.loadgen import scrape

    text = "\n".join(
        [
            "# HELP course_x_seconds x",
            "# TYPE course_x_seconds histogram",
            'course_x_seconds_bucket{le="0.001"} 0.0',
            'course_x_seconds_bucket{le="0.01"} 5.0',
            'course_x_seconds_bucket{le="0.1"} 10.0',
            'course_x_seconds_bucket{le="+Inf"} 10.0',
            "course_x_seconds_sum 0.3",
            "course_x_seconds_count 10.0",
            "",
        ]
    )
    h = scrape.histograms(text, "course_x_seconds")["course_x_seconds"]
    assert h.count == 10 and h.counts() == [0.0, 5.0, 5.0, 0.0]
    assert scrape.quantile(h, 0.5) == pytest.approx(0.01)  # the 5th observation closes the second bucket
    assert scrape.quantile(h, 0.75) == pytest.approx(0.01 + 0.09 * 0.5)  # halfway through the third
    assert math.isnan(scrape.quantile(scrape.Histogram("e", (math.inf,), (0.0,), 0.0, 0.0), 0.5))
    with pytest.raises(ValueError, match="no histogram named"):
        scrape.histograms(text, "course_y_seconds")
    with pytest.raises(ValueError, match="q must be"):
        scrape.quantile(h, 1.5)


def test_command_line_serves_the_same_text_in_both_layouts(refs):
    """``python -m course_lib.serving.server`` as its own process (``spawn``): the engine in a process of its
    own by default, on a thread with ``--engine thread``; both answer the engine's own greedy text."""
    from course_lib.serving.server import spawn

    for layout in ("process", "thread"):
        with spawn("tiny-target", engine=layout, threads=1) as srv:
            assert srv.running and f"--engine {layout}" in " ".join(srv.command)
            body = {"model": "tiny-target", "prompt": PROMPT, "max_tokens": N, "temperature": 0}
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == refs["text"]
        assert not srv.running


def test_spawn_and_command_line_bad_input():
    import subprocess
    import sys

    from course_lib.serving.server import spawn

    for kwargs, words in (
        ({"engine": "gpu"}, "engine must be 'process' or 'thread'"),
        ({"threads": 0}, "threads must be None or an int >= 1"),
        ({"port": 70000}, "port must be an int in 0..65535"),
    ):
        with pytest.raises(ValueError, match=words):
            spawn("tiny-target", **kwargs)
    with pytest.raises(RuntimeError, match="did not start"):  # the child exits on an unknown model
        spawn("no-such-model", startup_timeout_s=60)
    cmd = [sys.executable, "-m", "course_lib.serving.server", "--engine-process", "--engine", "thread"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "contradict" in out.stderr
