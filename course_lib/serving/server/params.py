"""From an OpenAI request body to what the engine runs: the prompts, one ``SamplingParams`` and the answer's
shape (choices per prompt, ``best_of``, log-probs, echo), each field checked before any work and refused by
name (``param``) when its value is bad or the server does not implement it. Introduced in
06_batching_serving.ipynb."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from course_lib.engine.sampling import SamplingParams
from course_lib.serving.server.protocol import (
    DEFAULT_MAX_TOKENS,
    MAX_LOGPROBS,
    ChatRequest,
    CompletionRequest,
    RequestFailure,
    message_text,
    render_chat,
    unsupported_fields,
)


@dataclass
class Plan:
    """One request, ready for the engine: ``prompts`` (strings or token ids) each run with ``params``
    (``params.n`` = ``best_of`` samples per prompt), of which the ``n`` most likely are answered."""

    prompts: list
    params: SamplingParams
    n: int
    logprobs: int | None  # top alternatives to answer per token; None = no log-probs in the answer
    echo: bool
    stream: bool
    include_usage: bool

    @property
    def best_of(self) -> int:
        return self.params.n

    @property
    def num_seqs(self) -> int:
        """Sequences the engine runs for this request: what it counts against ``max_queue``."""
        return len(self.prompts) * self.params.n


def bad(message: str, param: str | None, status: int = 400, code: str | None = None) -> RequestFailure:
    return RequestFailure(status, message, "", param, code)


def _count(name: str, value, lo: int, hi: int | None = None) -> int:
    if value is None:
        return lo
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        span = f"an int in [{lo}, {hi}]" if hi is not None else f"an int ≥ {lo}"
        raise bad(f"{name} must be {span}, got {value!r}", name)
    return value


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    if not bias:
        return {}
    out = {}
    for key, value in bias.items():
        if not re.fullmatch(r"\d+", key.strip()):
            raise bad(f'logit_bias keys must be token ids (e.g. "50256"), got {key!r}', "logit_bias")
        out[int(key)] = value
    return out


def _structured(rf) -> str | None:
    """``response_format`` → ``SamplingParams.structured``: None (text), "json" (json_object) or the schema."""
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return "json"
    if rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise bad("response_format of type 'json_schema' needs json_schema.schema", "response_format")
        return json.dumps(rf.json_schema.schema_)
    raise bad(
        f"response_format type {rf.type!r} is not supported; use 'text', 'json_object' or 'json_schema'",
        "response_format",
    )


def _prompts(body: CompletionRequest) -> list:
    p = body.prompt
    if isinstance(p, str) or (p and isinstance(p[0], int)):
        p = [p]
    if not p:
        raise bad("prompt must be a non-empty string, list of token ids, or list of those", "prompt")
    for i, one in enumerate(p):
        if not one:
            raise bad(f"prompt[{i}] is empty; give at least one character or token id", "prompt")
    return list(p)


def plan(body, tokenizer, model_name: str, *, max_queue: int) -> Plan:
    """Check ``body`` (a ``CompletionRequest`` or ``ChatRequest``) field by field and build its ``Plan``.
    Raises ``RequestFailure`` naming the field (400; 404 for an unknown model)."""
    chat = isinstance(body, ChatRequest)
    if chat:  # a message's own errors first: an image part is refused as an image, not as a stray field
        if not body.messages:
            raise bad("messages must hold at least one message", "messages")
        messages = [{"role": m.role, "content": message_text(m, i)} for i, m in enumerate(body.messages)]
    extra = unsupported_fields(body)
    if extra:
        raise bad(
            f"unsupported field '{extra[0]}': this server does not implement it", extra[0], 400, "unsupported_parameter"
        )
    if body.model is not None and body.model != model_name:
        raise bad(
            f"the model `{body.model}` does not exist; this server serves `{model_name}`",
            "model",
            404,
            "model_not_found",
        )
    stream = bool(body.stream)
    if body.stream_options is not None and not stream:
        raise bad("stream_options is only allowed with stream=true", "stream_options")
    if chat:
        prompts = [render_chat(messages, tokenizer)]
        structured = _structured(body.response_format)
        if body.top_logprobs is not None and not body.logprobs:
            raise bad("top_logprobs needs logprobs=true", "top_logprobs")
        logprobs = _count("top_logprobs", body.top_logprobs, 0, MAX_LOGPROBS) if body.logprobs else None
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        max_name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        echo, best_of = False, None
    else:
        structured = None
        prompts = _prompts(body)
        logprobs = None if body.logprobs is None else _count("logprobs", body.logprobs, 0, MAX_LOGPROBS)
        max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        max_name = "max_tokens"
        echo, best_of = bool(body.echo), body.best_of
        if echo and logprobs is not None:
            raise bad(
                "echo with logprobs would need the prompt tokens' log-probs, which this server does not compute; "
                "ask for one or the other",
                "echo",
            )
    n = _count("n", body.n, 1)
    if best_of is not None:
        best_of = _count("best_of", best_of, 1)
        if best_of < n:
            raise bad(f"best_of={best_of} must be ≥ n={n}", "best_of")
        if stream and best_of > n:
            raise bad("best_of > n cannot be streamed: the best samples are known only at the end", "best_of")
    samples = best_of or n
    if len(prompts) * samples > max_queue:
        name = "best_of" if best_of and best_of > n else "n"
        raise bad(
            f"{len(prompts)} prompt(s) × {samples} samples = {len(prompts) * samples} sequences, more than this "
            f"server's max_queue={max_queue} ever holds",
            name,
        )
    if max_tokens is not None and not (isinstance(max_tokens, int) and max_tokens >= 1):
        default = "the rest of the context" if chat else DEFAULT_MAX_TOKENS
        raise bad(f"{max_name} must be an int ≥ 1 (or null: {default}), got {max_tokens!r}", max_name)
    top_k = -1 if body.top_k is None else body.top_k
    if top_k == -1:
        top_k = 0  # vLLM's "off"
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    fields = dict(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=top_k,
        min_p=0.0 if body.min_p is None else body.min_p,
        presence_penalty=0.0 if body.presence_penalty is None else body.presence_penalty,
        frequency_penalty=0.0 if body.frequency_penalty is None else body.frequency_penalty,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        min_tokens=0 if body.min_tokens is None else body.min_tokens,
        logit_bias=_logit_bias(body.logit_bias),
        seed=body.seed,
        stop=stop,
        max_new_tokens=max_tokens,
        ignore_eos=bool(body.ignore_eos),
        n=samples,
        structured=structured,
        # best_of ranks the samples by their summed log-prob, so the engine keeps it even if not answered
        logprobs=logprobs if logprobs is not None else (0 if samples > n else None),
    )
    try:
        params = SamplingParams(**fields)
    except ValueError as exc:
        raise bad(*_engine_message(str(exc), max_name)) from None
    usage = stream and body.stream_options is not None and bool(body.stream_options.include_usage)
    return Plan(prompts, params, n, logprobs, echo, stream, usage)


def _engine_message(message: str, max_name: str) -> tuple[str, str | None]:
    """A ``SamplingParams`` error in the API's words, and the field it names."""
    m = re.match(r"SamplingParams\.(\w+)", message)
    name = m.group(1) if m else None
    message = message.replace("SamplingParams.", "")
    if name == "max_new_tokens":
        return message.replace("max_new_tokens", max_name), max_name
    if name == "min_tokens":
        message = message.replace("max_new_tokens", max_name)
    if name == "structured":
        return message.replace("structured", "response_format"), "response_format"
    return message, name


def engine_param(message: str) -> str | None:
    """The request field an engine's ``add_request`` refusal is about (its message names it)."""
    for words, name in (
        ("logit_bias", "logit_bias"),
        ("response_format", "response_format"),
        ("structured", "response_format"),
        ("xgrammar", "response_format"),
        ("context window", "max_tokens"),
        ("KV storage", "max_tokens"),
        ("could never run", "prompt"),
        ("token ids outside", "prompt"),
        ("min_tokens", "min_tokens"),
        ("logprobs", "logprobs"),
    ):
        if words in message:
            return name
    return None
