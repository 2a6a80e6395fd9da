"""Guardrails measured: false-positive and false-negative rates on a labelled set, the latency each check
adds, and the output side (JSON checked by ``jsonschema``, or made valid by constrained decoding).

A guardrail is a classifier: on ``data/system/guardrail_prompts.json`` (prompts labelled by hand per check)
``rates`` counts what each check flags against its label. The false-positive rate is the share of innocent
prompts it would block or rewrite; the false-negative rate the share of bad ones it lets through. Latency is
per prompt, timed over repeats with ``time.perf_counter`` (``latency``: p50 and p99 in µs), the figure to
set beside a TTFT. On the way out, ``json_answers`` asks the chat model for a JSON object unconstrained and
with the engine's grammar-constrained decoding (``SamplingParams.structured``, chapter 06), and validates each
answer against a schema. Introduced in 08_system_1_context_guardrails_gateway.ipynb.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import jsonschema
import numpy as np

from course_lib.core.paths import data_dir
from course_lib.engine import SamplingParams
from course_lib.system.guardrails import CHECKS, FINDERS


def load_prompts(path=None) -> list[dict]:
    """The labelled prompts: dicts with ``id``, ``text`` and one bool per check of ``CHECKS``."""
    path = path or data_dir() / "system" / "guardrail_prompts.json"
    prompts = json.loads(open(path, encoding="utf-8").read())["prompts"]
    for p in prompts:
        if not isinstance(p.get("text"), str) or any(not isinstance(p.get(c), bool) for c in CHECKS):
            raise ValueError(f"{path}: prompt {p!r} needs a text and a bool for each of {CHECKS}")
    return prompts


@dataclass(frozen=True)
class Rates:
    check: str
    tp: int
    fp: int
    fn: int
    tn: int
    missed: tuple[int, ...]  # ids of false negatives
    false_alarms: tuple[int, ...]  # ids of false positives

    @property
    def fp_rate(self) -> float:  # of the prompts labelled clean for this check
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else float("nan")

    @property
    def fn_rate(self) -> float:  # of the prompts labelled bad for this check
        return self.fn / (self.fn + self.tp) if self.fn + self.tp else float("nan")


def rates(prompts: list[dict], check: str, finder=None) -> Rates:
    """Confusion counts of ``check`` (or of ``finder``, a function text → findings, in its place)."""
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    if not prompts:
        raise ValueError("prompts must be a non-empty list (from load_prompts)")
    finder = finder or FINDERS[check]
    tp = fp = fn = tn = 0
    missed, alarms = [], []
    for p in prompts:
        flagged, label = bool(finder(p["text"])), p[check]
        tp += flagged and label
        fp += flagged and not label
        fn += label and not flagged
        tn += not flagged and not label
        if label and not flagged:
            missed.append(p["id"])
        if flagged and not label:
            alarms.append(p["id"])
    return Rates(check, tp, fp, fn, tn, tuple(missed), tuple(alarms))


def latency(fn, texts: list[str], repeats: int = 5) -> dict[str, float]:
    """p50 and p99 (µs) of ``fn(text)`` per call, over every text × ``repeats`` (one untimed call first)."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a non-empty list of str")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    fn(texts[0])
    times = []
    for _ in range(repeats):
        for t in texts:
            t0 = time.perf_counter()
            fn(t)
            times.append(time.perf_counter() - t0)
    us = np.array(times) * 1e6
    return {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)), "calls": len(times)}


#: What the chat model is asked to return on the way out: which function answers a question.
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"module": {"type": "string"}, "function": {"type": "string"}},
    "required": ["module", "function"],
    "additionalProperties": False,
}


def validate(text: str, schema: dict = ANSWER_SCHEMA) -> bool:
    """The output check: ``text`` parses as JSON and fits ``schema`` (``jsonschema``)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def json_prompt(tokenizer, question: str) -> str:
    msg = (
        "Which Python standard-library function answers this question? Reply with only a JSON object "
        f'{{"module": ..., "function": ...}}.\nQuestion: {question}'
    )
    return tokenizer.apply_chat_template([{"role": "user", "content": msg}], tokenize=False, add_generation_prompt=True)


@dataclass(frozen=True)
class JsonRun:
    mode: str  # "unconstrained" or "json_schema"
    valid: float  # share of answers that fit ANSWER_SCHEMA
    ended: float  # share that ended on their own (EOS or the grammar's end), not cut at max_new_tokens
    ended_valid: float  # among those that ended: the share that fit (1.0 is the grammar's promise); nan if none
    right_function: float  # share whose module.function is the question's source
    seconds: float  # wall time of the batch
    example: str


def json_answers(engine, questions: list[dict], mode: str, max_new_tokens: int = 32) -> JsonRun:
    """Greedy JSON answers to ``questions``, unconstrained or constrained to ``ANSWER_SCHEMA``."""
    if mode not in ("unconstrained", "json_schema"):
        raise ValueError(f"mode must be 'unconstrained' or 'json_schema', got {mode!r}")
    if not questions:
        raise ValueError("questions must be a non-empty list (from rag.load_questions)")
    structured = json.dumps(ANSWER_SCHEMA) if mode == "json_schema" else None
    params = SamplingParams(max_new_tokens=max_new_tokens, structured=structured)
    prompts = [json_prompt(engine.tokenizer, q["question"]) for q in questions]
    t0 = time.perf_counter()
    results = engine.generate(prompts, params)
    seconds = time.perf_counter() - t0
    texts = [r.text.strip() for r in results]
    ok = [validate(t) for t in texts]
    right = 0
    for t, good, q in zip(texts, ok, questions):
        if good:
            doc = json.loads(t)
            name = f"{doc['module']}.{doc['function']}"
            right += name == q["source"] or doc["function"] == q["source"]
    n = len(questions)
    ended = [good for good, r in zip(ok, results) if r.finish_reason != "length"]
    ended_valid = sum(ended) / len(ended) if ended else float("nan")
    return JsonRun(mode, sum(ok) / n, len(ended) / n, ended_valid, right / n, seconds, texts[0][:70])


__all__ = ["ANSWER_SCHEMA", "JsonRun", "Rates", "json_answers", "latency", "load_prompts", "rates", "validate"]
