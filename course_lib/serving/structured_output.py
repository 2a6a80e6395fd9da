"""Constrained decoding, measured: what a grammar on the sampler seam costs per token, and what it buys.

A server that promises JSON (OpenAI's ``response_format``) either hopes the model writes it, or constrains
it: before each sampled token, a grammar matcher (xgrammar, as vLLM and SGLang use) marks the tokens that
keep the output a valid prefix, and the rest of the vocabulary is masked to −∞ (``engine/structured.py``).
The forward pass does not change, so the cost is the mask: CPU work per row per step, beside a decode step
that on a GPU takes milliseconds. What it buys is every answer that *ends* parsing; an answer cut by
``max_tokens`` is still an unfinished prefix. ``compare_modes`` runs the same seeded requests unconstrained,
as a JSON object and against a schema, and counts both: on a code model with code prompts (``PROMPTS``), or
on a chat model with chat prompts that ask for the record (``chat_prompts``). Introduced in
06_batching_serving.ipynb.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jsonschema

from course_lib.engine import SamplingParams

#: The schema the constrained answers must fit: a small user record.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
#: Prompts that invite JSON from a code model (tiny-target has no instruction tuning).
PROMPTS = ('config = {"name": ', "# a user record as JSON\nuser = ", "data = json.loads('{\"", "person = ")
#: People a chat model is asked to write as a SCHEMA record (``chat_prompts``).
PEOPLE = (
    "Alice is 31 and likes chess and hiking.",
    "Bob, aged 45, enjoys cooking.",
    "Chen is a 27-year-old who plays the violin and the piano.",
    "Dana (age 52) collects stamps.",
)
#: The user message around each person: it names SCHEMA's keys and types, as a client without a grammar must.
CHAT_REQUEST = (
    'Reply with only a JSON object with the keys "name" (a string), "age" (an integer) and "tags" '
    "(a list of strings) for this person: {person}"
)
#: mode name → ``SamplingParams.structured`` (None: no constraint)
MODES = {"unconstrained": None, "json_object": "json", "json_schema": json.dumps(SCHEMA)}


def chat_prompts(tokenizer, people: Sequence[str] = PEOPLE) -> tuple[str, ...]:
    """One chat prompt per person, ``CHAT_REQUEST`` as the user's message, rendered by the tokenizer's chat
    template with the assistant's turn opened (``render_chat``, as the server renders ``/v1/chat/completions``)."""
    from course_lib.serving.server.protocol import render_chat

    if isinstance(people, str) or not people or not all(isinstance(p, str) and p.strip() for p in people):
        raise ValueError(f"people must be a non-empty sequence of non-empty strings, got {people!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("tokenizer must have a chat template (a chat model's tokenizer), e.g. Engine(...).tokenizer")
    return tuple(render_chat([{"role": "user", "content": CHAT_REQUEST.format(person=p)}], tokenizer) for p in people)


def _check_prompts(prompts) -> tuple[str, ...]:
    if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError(f"prompts must be a non-empty sequence of non-empty strings, got {prompts!r}")
    return tuple(prompts)


def fits(text: str, schema: dict | None = None) -> bool:
    """Does ``text`` parse as one JSON object (and, with ``schema``, validate against it, by ``jsonschema``)?"""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    if schema is None:
        return True
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError:
        return False
    return True


def embedded_object(text: str) -> dict | None:
    """The first complete JSON object anywhere inside ``text`` (in a Markdown code fence, after a sentence),
    or None: what a lenient client digs out of an answer that ``json.loads`` refuses whole."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            doc, _ = decoder.raw_decode(text, start)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            return doc
        start = text.find("{", start + 1)
    return None


@dataclass(frozen=True)
class ConstrainedRun:
    """One mode over the same requests: shares of answers that parse / fit the schema / ended on their own."""

    mode: str
    requests: int
    parse: float  # share of answers that parse as a JSON object
    found: float  # share with a complete JSON object somewhere inside (``embedded_object``), e.g. in a fence
    schema: float  # share that also fit SCHEMA
    ended: float  # share that ended on their own (EOS or the grammar's end), not at max_tokens
    ended_parse: float  # among those that ended: the share that parse (1.0 is the grammar's promise)
    tokens: float  # mean tokens per answer
    mask_us: float  # mean cost of the mask per row per step (µs); 0 unconstrained
    mask_share: float  # the mask's share of the run's wall time
    example: str

    def row(self) -> str:
        return (
            f"{self.mode:<14} {self.parse:>6.0%} {self.found:>6.0%} {self.schema:>7.0%} {self.ended:>6.0%} "
            f"{f'{self.ended_parse:.0%}' if self.ended else '—':>11} "
            f"{self.tokens:>8.1f} {self.mask_us:>9.1f} {self.mask_share:>7.1%}   {self.example!r}"
        )


def run_constrained(
    engine, mode: str, requests: int = 8, max_tokens: int = 64, seed: int = 0, prompts: Sequence[str] = PROMPTS
) -> ConstrainedRun:
    """The same ``requests`` seeded, sampled (temperature 0.8) requests on ``engine``, batched, in ``mode``;
    request ``i`` sends ``prompts[i % len(prompts)]``."""
    prompts = _check_prompts(prompts)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    for name, value in (("requests", requests), ("max_tokens", max_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if engine.has_unfinished():
        raise ValueError("engine must be idle (no unfinished requests) before a timed run")
    grammars = engine.grammars
    mask_s0, masked0 = grammars.mask_seconds, grammars.masked_tokens
    out: dict[int, list[int]] = {i: [] for i in range(requests)}
    reasons: dict[int, str] = {}
    t0 = time.perf_counter()
    for i in range(requests):
        params = SamplingParams(temperature=0.8, seed=seed + i, max_new_tokens=max_tokens, structured=MODES[mode])
        engine.add_request(prompts[i % len(prompts)], params, request_id=i)
    while engine.has_unfinished():
        for ev in engine.step():
            out[ev.request].append(ev.token_id)
            if ev.finished:
                reasons[ev.request] = ev.finish_reason
    wall = time.perf_counter() - t0
    texts = [engine.tokenizer.decode(out[i], skip_special_tokens=True) for i in range(requests)]
    ended = [i for i in range(requests) if reasons.get(i) != "length"]
    masked = grammars.masked_tokens - masked0
    mask_s = grammars.mask_seconds - mask_s0
    return ConstrainedRun(
        mode=mode,
        requests=requests,
        parse=sum(fits(t) for t in texts) / requests,
        found=sum(embedded_object(t) is not None for t in texts) / requests,
        schema=sum(fits(t, SCHEMA) for t in texts) / requests,
        ended=len(ended) / requests,
        ended_parse=sum(fits(texts[i]) for i in ended) / len(ended) if ended else float("nan"),
        tokens=sum(len(o) for o in out.values()) / requests,
        mask_us=mask_s / masked * 1e6 if masked else 0.0,
        mask_share=mask_s / wall if wall > 0 else 0.0,
        example=texts[0][:60],
    )


def compare_modes(
    engine, requests: int = 8, max_tokens: int = 64, prompts: Sequence[str] = PROMPTS, threads: int | None = None
) -> list[ConstrainedRun]:
    """Every mode of ``MODES`` over the same requests, after an untimed warm-up (grammar compilation).
    A module-level function: ``EngineProcess.call(functools.partial(compare_modes, ...))`` runs it in a
    server's engine process. ``threads``: torch's intra-op threads for the run (restored after), e.g. every
    core for a server's engine process that was started with one while nothing else runs."""
    import torch

    prompts = _check_prompts(prompts)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be None or an int >= 1, got {threads!r}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        run_constrained(engine, "json_object", requests=2, max_tokens=4, prompts=prompts)  # compile, shapes: untimed
        return [run_constrained(engine, mode, requests, max_tokens, prompts=prompts) for mode in MODES]
    finally:
        torch.set_num_threads(before)


def unconstrained_gain(runs: list[ConstrainedRun], baseline: list[ConstrainedRun], share: str = "parse") -> float:
    """How much larger a ``share`` ("parse": the whole answer is a JSON object; "found": one is inside it) of
    ``runs``' unconstrained answers is than of ``baseline``'s (each from ``compare_modes``): > 0 when the first
    model writes JSON more often without a grammar."""
    if share not in ("parse", "found"):
        raise ValueError(f"share must be 'parse' or 'found', got {share!r}")
    shares = []
    for name, rs in (("runs", runs), ("baseline", baseline)):
        free = [r for r in rs if isinstance(r, ConstrainedRun) and r.mode == "unconstrained"] if rs else []
        if not isinstance(rs, list) or len(free) != 1:
            raise ValueError(f"{name} must be a list of ConstrainedRun from compare_modes with one unconstrained run")
        shares.append(getattr(free[0], share))
    return shares[0] - shares[1]


def format_runs(runs: list[ConstrainedRun]) -> str:
    if not runs:
        raise ValueError("runs must be a non-empty list of ConstrainedRun (from compare_modes)")
    head = (
        f"{'mode':<14} {'parse':>6} {'found':>6} {'schema':>7} {'ended':>6} {'ended→parse':>11} {'tok/ans':>8} "
        f"{'mask µs':>9} {'of wall':>7}"
    )
    return "\n".join([head, "-" * len(head), *(r.row() for r in runs)])
