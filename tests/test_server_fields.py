"""The server as an `openai` user meets it: every request field honoured (n, best_of, logprobs, echo, list
prompts, list chat content, penalties, logit bias, vLLM's top_k / min_p / repetition_penalty / min_tokens,
max_tokens absent) or refused by name, each bad value a 400 naming its field. tiny-target on 127.0.0.1."""

import math

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from course_lib.engine import Engine, SamplingParams, SchedulerConfig  # noqa: E402
from course_lib.engine.parallel_sampling import sample_ids  # noqa: E402
from course_lib.serving.server import render_chat, serve  # noqa: E402

PROMPT = "def fibonacci(n):"
OTHER = "import os\nimport"
N = 6
MAX_QUEUE = 8
HOT = {"ignore_eos": True}  # vLLM's extension, through the client's extra_body


def alone(engine, prompt, params) -> list[dict]:
    """Each sample of ``prompt`` run in-process: its ids, text, summed log-prob and events."""
    engine.add_request(prompt, params, request_id="ref")
    out = {sid: {"ids": [], "events": [], "logprob": 0.0} for sid in sample_ids("ref", params.n)}
    while engine.has_unfinished():
        for ev in engine.step():
            s = out[ev.request]
            s["ids"].append(ev.token_id)
            s["events"].append(ev)
            s["logprob"] += ev.logprob or 0.0
    for s in out.values():
        s["text"] = engine.tokenizer.decode(s["ids"], skip_special_tokens=True)
    return list(out.values())


@pytest.fixture(scope="module")
def engine():
    return Engine("tiny-target")


@pytest.fixture(scope="module")
def refs(engine):
    hot = dict(temperature=1.0, max_new_tokens=N, ignore_eos=True)
    chat = render_chat([{"role": "user", "content": "Write a loop"}])
    knobs = dict(
        temperature=0.9, seed=5, top_k=20, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.3,
        repetition_penalty=1.2, max_new_tokens=N, ignore_eos=True,
    )  # fmt: skip
    return {
        "greedy": alone(engine, PROMPT, SamplingParams(max_new_tokens=N, logprobs=2))[0],
        "other": alone(engine, OTHER, SamplingParams(max_new_tokens=N))[0],
        "chat": alone(engine, chat, SamplingParams(max_new_tokens=N, logprobs=2))[0],
        "seeded": [alone(engine, PROMPT, SamplingParams(seed=11 + j, logprobs=0, **hot))[0] for j in range(3)],
        "other_seeded": [alone(engine, OTHER, SamplingParams(seed=11 + j, **hot))[0] for j in range(2)],
        "knobs": alone(engine, PROMPT, SamplingParams(**knobs))[0],
        "ids": [engine.encode([p])[0] for p in (PROMPT, OTHER)],
        "eos": next(iter(engine.eos_ids)),
    }


@pytest.fixture(scope="module")
def server(engine, refs):
    with serve(engine, max_queue=MAX_QUEUE, request_timeout_s=60) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.openai_base_url, api_key="-", max_retries=0, timeout=60)
    yield c
    c.close()


def complete(client, **kw):
    return client.completions.create(model="tiny-target", prompt=kw.pop("prompt", PROMPT), max_tokens=N, **kw)


def test_n_forks_one_prompt_into_seeded_choices(client, refs):
    out = complete(client, n=3, seed=11, extra_body=HOT)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [r["text"] for r in refs["seeded"]]  # sample j draws with seed + j
    assert out.usage.completion_tokens == 3 * N and out.usage.prompt_tokens == len(refs["ids"][0])
    texts: dict[int, str] = {}
    for chunk in complete(client, n=3, seed=11, stream=True, extra_body=HOT):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert [texts[i] for i in range(3)] == [r["text"] for r in refs["seeded"]]
    chat = client.chat.completions.create(
        model="tiny-target", messages=[{"role": "user", "content": "Write a loop"}], max_tokens=N, n=2, seed=3
    )
    assert [c.index for c in chat.choices] == [0, 1]


def test_best_of_returns_the_most_likely_samples(client, refs):
    out = complete(client, n=1, best_of=3, seed=11, extra_body=HOT)
    best = max(refs["seeded"], key=lambda r: r["logprob"])
    assert [c.text for c in out.choices] == [best["text"]] and out.choices[0].logprobs is None
    assert out.usage.completion_tokens == 3 * N  # every sample was generated


def test_list_prompts_one_choice_per_prompt_and_sample(client, refs):
    out = complete(client, prompt=[PROMPT, OTHER], temperature=0)
    assert [(c.index, c.text) for c in out.choices] == [(0, refs["greedy"]["text"]), (1, refs["other"]["text"])]
    assert out.usage.prompt_tokens == sum(map(len, refs["ids"]))
    by_ids = complete(client, prompt=refs["ids"], temperature=0)  # token-id prompts
    assert [c.text for c in by_ids.choices] == [c.text for c in out.choices]
    both = complete(client, prompt=[PROMPT, OTHER], n=2, seed=11, extra_body=HOT)
    expected = [r["text"] for r in refs["seeded"][:2]] + [r["text"] for r in refs["other_seeded"]]
    assert [c.index for c in both.choices] == [0, 1, 2, 3]  # OpenAI's index: prompt_index * n + sample
    assert [c.text for c in both.choices] == expected


def test_completion_logprobs_and_echo(client, refs):
    ref = refs["greedy"]
    out = complete(client, temperature=0, logprobs=2).choices[0]
    lp = out.logprobs
    assert out.text == ref["text"] and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == N
    for got, ev, top in zip(lp.token_logprobs, ref["events"], lp.top_logprobs):
        assert math.isclose(got, ev.logprob, abs_tol=1e-4)
        assert len(top) <= 3 and max(top.values()) == pytest.approx(got, abs=1e-4)  # greedy: the top one
    assert "".join(lp.tokens) == out.text and lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-1] < len(out.text)
    streamed = [c.choices[0] for c in complete(client, temperature=0, logprobs=1, stream=True)]
    assert [c.logprobs.token_logprobs[0] for c in streamed] == pytest.approx(lp.token_logprobs, abs=1e-5)
    echo = complete(client, temperature=0, echo=True).choices[0]
    assert echo.text == PROMPT + ref["text"]
    chunks = [c.choices[0].text for c in complete(client, temperature=0, echo=True, stream=True)]
    assert chunks[0] == PROMPT and "".join(chunks) == PROMPT + ref["text"]


def test_chat_logprobs_and_list_content(client, refs):
    ref = refs["chat"]
    message = [{"role": "user", "content": [{"type": "text", "text": "Write a loop"}]}]
    out = client.chat.completions.create(
        model="tiny-target", messages=message, max_tokens=N, temperature=0, logprobs=True, top_logprobs=2
    )
    c = out.choices[0]
    assert c.message.content == ref["text"]  # list-form content is the same prompt
    assert len(c.logprobs.content) == N
    for entry, ev in zip(c.logprobs.content, ref["events"]):
        assert math.isclose(entry.logprob, ev.logprob, abs_tol=1e-4) and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token and entry.bytes == list(entry.token.encode())
    plain = client.chat.completions.create(model="tiny-target", messages=message, max_tokens=N, temperature=0)
    assert plain.choices[0].logprobs is None
    two = [{"role": "user", "content": [{"type": "text", "text": "Write a"}, {"type": "text", "text": "loop"}]}]
    joined = [{"role": "user", "content": "Write a\nloop"}]  # parts join with newlines, as vLLM's
    a, b = (
        client.chat.completions.create(model="tiny-target", messages=m, max_tokens=N, temperature=0)
        for m in (two, joined)
    )
    assert a.choices[0].message.content == b.choices[0].message.content


def test_sampling_knobs_match_the_engine(client, refs):
    out = complete(
        client, temperature=0.9, seed=5, presence_penalty=0.5, frequency_penalty=0.3,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2, "ignore_eos": True},
    )  # fmt: skip
    assert out.choices[0].text == refs["knobs"]["text"]


def test_logit_bias_min_tokens_and_stop(client, refs, engine):
    forced = complete(client, temperature=0, logit_bias={"42": 100}, extra_body=HOT)
    assert forced.choices[0].text == engine.tokenizer.decode([42] * N)
    eos = {str(refs["eos"]): 100}
    at_once = complete(client, temperature=0, logit_bias=eos)
    assert at_once.usage.completion_tokens == 1 and at_once.choices[0].finish_reason == "stop"
    later = complete(client, temperature=0, logit_bias=eos, extra_body={"min_tokens": 3})
    assert later.usage.completion_tokens == 4 and later.choices[0].finish_reason == "stop"


def test_max_tokens_absent_runs_to_the_end_of_the_context(engine):
    short = Engine(engine.hf_model, engine.tokenizer, config=SchedulerConfig(max_model_len=48))
    with serve(short) as h, httpx.Client(base_url=h.url, timeout=60) as c:
        body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "ignore_eos": True}
        out = c.post("/v1/chat/completions", json=body).json()
        assert out["choices"][0]["finish_reason"] == "length" and out["usage"]["total_tokens"] == 48
        completion = c.post("/v1/completions", json={"prompt": PROMPT, "ignore_eos": True}).json()
        assert completion["usage"]["completion_tokens"] == 16  # completions keep OpenAI's (and vLLM's) 16


def test_null_fields_mean_the_default(server, refs):
    body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "tools": None, "suffix": None, "user": None,
            "n": None, "logprobs": None, "stream_options": None, "top_k": None, "logit_bias": None}  # fmt: skip
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == refs["greedy"]["text"]


CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "path, body, param, words",
    [
        ("c", {"tools": [{"type": "function"}]}, "tools", "unsupported field 'tools'"),
        ("c", {"suffix": "x"}, "suffix", "unsupported field 'suffix'"),
        ("c", {"user": "me"}, "user", "unsupported field 'user'"),
        (
            "c",
            {"stream": True, "stream_options": {"include_usage": True, "extra": 1}},
            "stream_options.extra",
            "unsupported",
        ),
        ("chat", {"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages[0].name", "unsupported"),
        ("chat", {"messages": CHAT, "tool_choice": "auto"}, "tool_choice", "unsupported field"),
        ("chat", {"messages": CHAT, "response_format": {"type": "xml"}}, "response_format", "'xml' is not supported"),
        ("chat", {"messages": CHAT, "best_of": 2}, "best_of", "unsupported field"),
        ("c", {"n": 0}, "n", "n must be an int ≥ 1"),
        ("c", {"n": "two"}, "n", "n"),
        ("c", {"n": MAX_QUEUE + 1}, "n", "max_queue"),
        ("c", {"prompt": [PROMPT] * 3, "n": 3}, "n", "9 sequences"),
        ("c", {"best_of": 0}, "best_of", "best_of must be"),
        ("c", {"n": 2, "best_of": 1}, "best_of", "≥ n=2"),
        ("c", {"best_of": 2, "stream": True}, "best_of", "cannot be streamed"),
        ("c", {"logprobs": -1}, "logprobs", "logprobs must be an int in [0, 20]"),
        ("c", {"logprobs": 21}, "logprobs", "[0, 20]"),
        ("c", {"logprobs": 1, "echo": True}, "echo", "prompt tokens' log-probs"),
        ("c", {"echo": "yes"}, "echo", "echo"),
        ("chat", {"messages": CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
        ("chat", {"messages": CHAT, "top_logprobs": 2}, "top_logprobs", "needs logprobs=true"),
        ("c", {"prompt": []}, "prompt", "non-empty"),
        ("c", {"prompt": [PROMPT, ""]}, "prompt", "prompt[1] is empty"),
        ("c", {"prompt": [[1, 2], []]}, "prompt", "prompt[1] is empty"),
        ("c", {"prompt": ["a", 1]}, "prompt", "allowed forms"),
        ("c", {"prompt": [[10**9]]}, "prompt", "token ids"),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]",
            "only text parts",
        ),  # fmt: skip
        ("chat", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "not supported"),
        ("chat", {"messages": [{"role": "user", "content": None}]}, "messages[0].content", "required"),
        ("chat", {"messages": []}, "messages", "at least one"),
        ("c", {"presence_penalty": 3}, "presence_penalty", "[-2, 2]"),
        ("c", {"frequency_penalty": -2.5}, "frequency_penalty", "[-2, 2]"),
        ("c", {"logit_bias": {"x": 1}}, "logit_bias", "token ids"),
        ("c", {"logit_bias": {"5": 200}}, "logit_bias", "[-100, 100]"),
        ("c", {"logit_bias": {"99999": 1}}, "logit_bias", "outside the vocabulary"),
        ("c", {"top_k": -2}, "top_k", "top_k must be"),
        ("c", {"min_p": 1.5}, "min_p", "min_p must be"),
        ("c", {"repetition_penalty": 0}, "repetition_penalty", "repetition_penalty must be"),
        ("c", {"min_tokens": -1}, "min_tokens", "min_tokens must be"),
        ("c", {"min_tokens": 9, "max_tokens": 4}, "min_tokens", "must not exceed max_tokens=4"),
        ("c", {"max_tokens": 0}, "max_tokens", "max_tokens must be"),
        ("chat", {"messages": CHAT, "max_completion_tokens": 0}, "max_completion_tokens", "max_completion_tokens"),
        ("c", {"stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
        ("c", {"temperature": -1}, "temperature", "temperature"),
        ("c", {"seed": -3}, "seed", "seed"),
        ("c", {"stop": ["ok", ""]}, "stop", "stop"),
        ("c", {"prompt": [5] * 1020, "max_tokens": 16}, "max_tokens", "context window"),
    ],
)
def test_bad_fields_get_a_400_naming_them(server, path, body, param, words):
    url = server.url + ("/v1/completions" if path == "c" else "/v1/chat/completions")
    if path == "c":
        body = {"prompt": PROMPT, "max_tokens": N} | body
    r = httpx.post(url, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert err["type"] == "invalid_request_error"
