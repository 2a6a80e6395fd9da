"""Chapter 06's chat model behind the server: a streamed chat answer measured from the stream (``stream_chat``),
a process's peak RSS (``peak_rss_mib``), the chat prompts and verdict of the structured-output comparison, and
(slow) SmolLM2-135M-Instruct answering through ``EngineProcess`` with a small KV cache."""

import functools
import math
import subprocess
import sys

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from course_lib.engine import Engine, SchedulerConfig  # noqa: E402
from course_lib.serving import structured_output as so  # noqa: E402
from course_lib.serving.loadgen.chat_stream import StreamedChat, stream_chat  # noqa: E402
from course_lib.serving.server import EngineProcess, serve  # noqa: E402
from course_lib.serving.server.process_memory import peak_rss_mib, rss_mib  # noqa: E402

CHAT = [{"role": "user", "content": "Write a loop"}]
N = 8


def test_stream_chat_matches_the_whole_answer_and_times_every_piece():
    with serve(Engine("tiny-target"), max_queue=4) as h:
        client = openai.OpenAI(base_url=h.openai_base_url, api_key="-", max_retries=0, timeout=60)
        whole = client.chat.completions.create(model="tiny-target", messages=CHAT, max_tokens=N, temperature=0)
        seen = []
        s = stream_chat(client, CHAT, model="tiny-target", max_tokens=N, on_piece=seen.append)
        client.close()
    assert s.text == whole.choices[0].message.content and "".join(seen) == s.text
    assert s.completion_tokens == whole.usage.completion_tokens == N and s.finish_reason == "length"
    assert len(s.arrivals_s) == len(s.pieces) >= 2
    assert all(b >= a for a, b in zip(s.arrivals_s, s.arrivals_s[1:])) and s.ttft_s > 0
    assert s.itl_s.shape == (len(s.pieces) - 1,) and (s.itl_s >= 0).all()
    assert "TTFT" in s.describe()


def test_streamed_chat_arithmetic():
    s = StreamedChat(("a", "b", "c"), (0.5, 0.6, 0.9), "stop", 5)
    assert s.text == "abc" and s.ttft_s == 0.5
    assert s.itl_s.tolist() == pytest.approx([0.1, 0.3])
    assert s.tpot_s == pytest.approx(0.4 / 4)  # 5 tokens in 3 chunks: the usage count divides
    assert math.isnan(StreamedChat(("a",), (0.2,), "stop", 1).tpot_s)
    assert math.isnan(StreamedChat((), (), None, None).ttft_s)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(messages=[]), "messages must be"),
        (dict(messages="hi"), "messages must be"),
        (dict(max_tokens=0), "max_tokens must be"),
        (dict(on_piece="print"), "on_piece must be"),
    ],
)
def test_stream_chat_refuses_bad_input_before_sending(kwargs, words):
    class NoClient:  # any call to it would fail differently
        pass

    args = {"messages": CHAT, **kwargs}
    with pytest.raises(ValueError, match=words):
        stream_chat(NoClient(), args.pop("messages"), model="m", **args)


def test_peak_rss_of_this_process_and_a_child():
    psutil = pytest.importorskip("psutil")
    assert peak_rss_mib() >= rss_mib() * 0.99  # the high-water mark is at least the now
    assert rss_mib() == pytest.approx(psutil.Process().memory_info().rss / 2**20, rel=0.1)
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(200 * 2**20); input()"], stdin=subprocess.PIPE)
    try:
        for _ in range(200):  # until the child has touched its 200 MiB
            if peak_rss_mib(child.pid) > 200:
                break
            __import__("time").sleep(0.05)
        assert peak_rss_mib(child.pid) > 200
    finally:
        child.communicate(b"\n", timeout=10)
    with pytest.raises(ProcessLookupError):
        peak_rss_mib(child.pid)  # reaped: gone
    for bad in (0, -3, "1", True, 1.5):
        with pytest.raises(ValueError, match="pid must be"):
            peak_rss_mib(bad)
        with pytest.raises(ValueError, match="pid must be"):
            rss_mib(bad)


def run(mode, parse, found=None):
    return so.ConstrainedRun(
        mode, 4, parse, parse if found is None else found, 0.0, 0.0, float("nan"), 10.0, 0.0, 0.0, ""
    )


def test_unconstrained_gain_compares_the_unconstrained_rows_only():
    chat = [run("unconstrained", 0.75), run("json_object", 1.0)]
    code = [run("unconstrained", 0.0), run("json_object", 1.0)]
    assert so.unconstrained_gain(chat, code) == 0.75
    assert so.unconstrained_gain(code, chat) == -0.75  # the counter-example: the chapter's claim fails on it
    from course_lib.measure.claims import claim

    assert not claim("chat beats code", so.unconstrained_gain(code, chat), at_least=0.25).held
    fenced = [run("unconstrained", 0.0, found=0.5)]  # JSON inside a code fence: found, but not parsed whole
    assert so.unconstrained_gain(fenced, code) == 0.0 and so.unconstrained_gain(fenced, code, share="found") == 0.5
    with pytest.raises(ValueError, match="share must be"):
        so.unconstrained_gain(chat, code, share="schema")
    for bad in ([], [run("json_object", 1.0)], [run("unconstrained", 1.0)] * 2, "runs"):
        with pytest.raises(ValueError, match="runs must be a list"):
            so.unconstrained_gain(bad, code)


def test_embedded_object_digs_the_first_object_out_of_prose_and_fences():
    assert so.embedded_object('Here it is:\n```json\n{"name": "A", "age": 3}\n```') == {"name": "A", "age": 3}
    assert so.embedded_object('{"a": {"b": 1}} and {"c": 2}') == {"a": {"b": 1}}  # the outer object, first
    assert so.embedded_object('a set {1, 2} then {"ok": true}') == {"ok": True}  # skips what does not parse
    assert so.embedded_object('[{"a": 1}]') == {"a": 1}
    for none in ("", "no braces", '{"cut": ', "[1, 2]"):
        assert so.embedded_object(none) is None
    with pytest.raises(ValueError, match="text must be a str"):
        so.embedded_object(b"{}")


def test_prompts_and_chat_prompts_are_checked():
    engine = Engine("tiny-target")
    for bad in ("person = ", [], ["ok", ""], [3]):
        with pytest.raises(ValueError, match="prompts must be"):
            so.compare_modes(engine, requests=1, max_tokens=1, prompts=bad)
    with pytest.raises(ValueError, match="chat template"):
        so.chat_prompts(engine.tokenizer)  # the code model has none
    with pytest.raises(ValueError, match="people must be"):
        so.chat_prompts(engine.tokenizer, people=[])
    assert not engine.has_unfinished()


@pytest.mark.slow
def test_smollm2_answers_a_chat_request_from_its_own_process(smollm2_cache, monkeypatch):
    """Slow (minutes on a loaded 2-core machine): the chat model in an EngineProcess with a small KV cache answers, streamed and whole
    alike; its process holds at least its weights; compare_modes runs there through ``call``."""
    monkeypatch.setenv("COURSE_CACHE_DIR", str(smollm2_cache))  # the spawned child inherits it
    name = "smollm2-135m-instruct"
    proc = EngineProcess(name, threads=2, config=SchedulerConfig(max_model_len=256, max_num_seqs=2))
    question = [{"role": "user", "content": "What is the capital of France?"}]
    with serve(proc, max_queue=4, model_name=name) as h:
        client = openai.OpenAI(base_url=h.openai_base_url, api_key="-", max_retries=0, timeout=120)
        whole = client.chat.completions.create(model=name, messages=question, max_tokens=12, temperature=0)
        s = stream_chat(client, question, model=name, max_tokens=12)
        client.close()
        assert "Paris" in s.text and s.text == whole.choices[0].message.content
        assert h.engine_loop.max_model_len == 256
        assert peak_rss_mib(h.engine_loop.pid) > 538e6 / 2**20  # fp32 weights, copied out of the file
        prompts = so.chat_prompts(h.engine_loop.tokenizer, people=so.PEOPLE[:1])
        assert "<|im_start|>assistant" in prompts[0] and "Alice" in prompts[0]
        runs = h.engine_loop.call(
            functools.partial(so.compare_modes, requests=1, max_tokens=40, prompts=prompts), timeout=900
        )
    assert [r.mode for r in runs] == list(so.MODES)
    for r in runs[1:]:
        assert r.ended == 0 or r.ended_parse == 1.0, r
