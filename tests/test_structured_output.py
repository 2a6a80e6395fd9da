"""Structured output (``SamplingParams.structured``, xgrammar on the sampler seam): every answer that ends
parses (and fits its schema), forked samples keep their own grammar, bad specs are refused by name, and the
server's ``response_format`` (json_object, json_schema) reaches it."""

import json

import pytest

xgr = pytest.importorskip("xgrammar")

from course_lib.engine import Engine, SamplingParams  # noqa: E402
from course_lib.engine.parallel_sampling import sample_ids  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PROMPT = "person = "


@pytest.fixture(scope="module")
def engine():
    return Engine("tiny-target")


def run(engine, params, prompt=PROMPT, rid="r"):
    engine.add_request(prompt, params, request_id=rid)
    out, reasons = {}, {}
    while engine.has_unfinished():
        for ev in engine.step():
            out.setdefault(ev.request, []).append(ev.token_id)
            if ev.finished:
                reasons[ev.request] = ev.finish_reason
    return {k: engine.tokenizer.decode(v, skip_special_tokens=True) for k, v in out.items()}, reasons


def fits(doc) -> bool:
    return (
        isinstance(doc, dict)
        and set(doc) == {"name", "age"}
        and isinstance(doc["name"], str)
        and type(doc["age"]) is int
    )


def test_every_finished_answer_fits_its_schema(engine):
    spec = json.dumps(SCHEMA)
    ended, before = 0, engine.grammars.masked_tokens
    for seed in range(6):
        texts, reasons = run(engine, SamplingParams(temperature=0.8, seed=seed, max_new_tokens=120, structured=spec))
        if reasons["r"] == "eos":  # the grammar was complete: only EOS was allowed
            ended += 1
            assert fits(json.loads(texts["r"])), texts["r"]
    assert ended >= 2
    assert engine.grammars.masked_tokens > before and engine.grammars.seconds_per_token > 0
    free, _ = run(engine, SamplingParams(temperature=0.8, seed=0, max_new_tokens=40))
    with pytest.raises(ValueError):
        json.loads(free["r"])  # unconstrained, the code model writes code


def test_json_object_and_forked_samples(engine):
    texts, reasons = run(engine, SamplingParams(temperature=0.8, seed=3, max_new_tokens=120, structured="json", n=3))
    assert sorted(texts) == sorted(sample_ids("r", 3))
    for sid, text in texts.items():  # each sample follows its own matcher from the start
        assert text.lstrip().startswith("{")
        if reasons[sid] == "eos":
            assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"structured": "{"}, "structured must be"),
        ({"structured": "[1, 2]"}, "structured must be"),
        ({"structured": "json", "ignore_eos": True}, "ignore_eos"),
        ({"structured": "json", "min_tokens": 2}, "min_tokens"),
    ],
)
def test_bad_specs_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def test_a_schema_that_does_not_compile_is_refused_before_any_work(engine):
    with pytest.raises(ValueError, match="does not compile"):
        engine.add_request(PROMPT, SamplingParams(structured=json.dumps({"type": "object", "required": 5})))
    assert not engine.has_unfinished()


def test_server_response_format(engine):
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")
    from course_lib.serving.server import serve

    with serve(engine) as h:
        client = openai.OpenAI(base_url=h.openai_base_url, api_key="-", max_retries=0, timeout=60)
        messages = [{"role": "user", "content": "Is it JSON?"}]
        short = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
                 "additionalProperties": False}  # fmt: skip
        for fmt, check in (
            ({"type": "json_object"}, lambda d: isinstance(d, dict)),
            ({"type": "json_schema", "json_schema": {"name": "answer", "schema": short, "strict": True}},
             lambda d: d in ({"answer": "yes"}, {"answer": "no"})),
        ):  # fmt: skip
            finished = 0
            for seed in range(3):
                c = client.chat.completions.create(
                    model="tiny-target",
                    messages=messages,
                    max_tokens=80,
                    temperature=0.8,
                    seed=seed,
                    response_format=fmt,
                ).choices[0]
                assert c.message.content.lstrip().startswith("{")  # constrained from the first token
                if c.finish_reason == "stop":  # the document was complete: it parses, and fits
                    finished += 1
                    assert check(json.loads(c.message.content)), c.message.content
            if fmt["type"] == "json_schema":
                assert finished == 3  # two keys' worth of freedom: it ends
        client.close()
        for fmt, words in (
            ({"type": "json_schema"}, "needs json_schema.schema"),
            ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": 5}}}, "does not compile"),
            ({"type": "json_object", "extra": 1}, "unsupported field 'response_format.extra'"),
        ):  # fmt: skip
            r = httpx.post(h.url + "/v1/chat/completions", json={"messages": messages, "response_format": fmt})
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
            assert r.json()["error"]["param"].startswith("response_format")
        r = httpx.post(
            h.url + "/v1/chat/completions",
            json={"messages": messages, "response_format": {"type": "json_object"}, "ignore_eos": True},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


def test_fits_checks_json_and_the_schema():
    from course_lib.serving.structured_output import SCHEMA as RECORD
    from course_lib.serving.structured_output import fits

    assert fits('{"name": "a", "age": 3}', RECORD) and fits('{"x": 1}')
    assert not fits('{"name": "a"}', RECORD)  # age is required
    assert not fits('{"name": "a", "age": "3"}', RECORD)  # wrong type
    assert not fits("[1, 2]") and not fits('{"name": ') and not fits("")
    with pytest.raises(ValueError, match="text must be a str"):
        fits(None)


def test_compare_modes_measures_what_the_chapter_claims(engine):
    import torch

    from course_lib.serving.structured_output import MODES, compare_modes, format_runs, run_constrained

    before = torch.get_num_threads()
    runs = compare_modes(engine, requests=4, max_tokens=32, threads=1)
    assert torch.get_num_threads() == before  # the threads asked for hold for the run only
    assert [r.mode for r in runs] == list(MODES)
    with pytest.raises(ValueError, match="threads"):
        compare_modes(engine, requests=1, max_tokens=1, threads=0)
    for r in runs[1:]:  # constrained: whatever ended, parsed (the grammar's promise)
        assert r.ended == 0 or r.ended_parse == 1.0, r
        assert r.mask_us > 0 and 0 < r.mask_share < 1
    assert runs[0].mask_us == 0.0
    assert runs[2].schema == runs[2].parse  # under the schema grammar, what parses fits
    assert "json_schema" in format_runs(runs)
    for kwargs, words in (
        (dict(mode="yaml"), "mode must be one of"),
        (dict(mode="json_object", requests=0), "requests must be an int"),
        (dict(mode="json_object", max_tokens=True), "max_tokens must be an int"),
    ):
        with pytest.raises(ValueError, match=words):
            run_constrained(engine, **kwargs)
    with pytest.raises(ValueError, match="non-empty list"):
        format_runs([])


def test_batched_mask_equals_row_by_row(engine):
    """Grammars.mask_batch (one bitmask fill over every matcher, one masked write) masks exactly what the
    row-by-row path does: two grammars at different states, and a free row left untouched."""
    import torch

    from course_lib.engine.structured import mask_rows

    class Row:  # what mask_rows reads of a sequence
        def __init__(self, grammar):
            self.grammar = grammar

    g = engine.grammars
    a, b = g.grammar("json"), g.grammar(json.dumps(SCHEMA))
    for tok in engine.tokenizer.encode('{"name": "x'):  # move one matcher past its start
        if not a.matcher.accept_token(tok):
            break
    seqs = [Row(a), Row(None), Row(b), Row(a.fresh())]
    logits = torch.randn(len(seqs), engine.model.vocab_size, generator=torch.Generator().manual_seed(0))
    batched, single = mask_rows(logits, seqs), mask_rows(logits, seqs, batched=False)
    assert torch.equal(batched, single) and torch.equal(batched[1], logits[1])
    assert torch.isinf(batched[0]).sum() > 0 and not torch.equal(torch.isinf(batched[0]), torch.isinf(batched[3]))
    assert mask_rows(logits, [Row(None)] * 4) is logits  # nothing structured: no copy
