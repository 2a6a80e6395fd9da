"""The OpenAI wire format of the course server: the request bodies (pydantic models), the fields the server
refuses by name, the error body ``{"error": {"message", "type", "param", "code"}}``, OpenAI's finish-reason
names and the chat prompt's fallback rendering. The error ``type`` and ``code`` are strings, as OpenAI's
(vLLM puts the status in ``code``); ``STATUS_OF_CODE`` maps a code back to its HTTP status. No engine and no HTTP here: ``app`` parses with these
models, ``params`` turns them into the engine's ``SamplingParams``, ``responses`` builds the answers.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# OpenAI names two finish reasons; the engine's "eos" (end of sequence) is OpenAI's "stop"
OPENAI_REASON = {"eos": "stop", "stop": "stop", "length": "length"}
DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions; chat's default is the rest of the context
MAX_LOGPROBS = 20  # top alternatives per token, at most (OpenAI's top_logprobs limit, vLLM's max_logprobs)
CHAT_ROLES = ("system", "developer", "user", "assistant")


class _Body(BaseModel):
    """Fields outside the model are kept (``extra="allow"``) so that ``unsupported_fields`` can refuse them
    by name: a field the server does not implement must never be accepted in silence. Types are strict, as
    OpenAI's are: ``"yes"`` is not a bool nor ``"2"`` an int (an int is a float, as in JSON)."""

    model_config = ConfigDict(extra="allow", strict=True)  # strict: "yes" is not a bool, "2" not an int


class StreamOptions(_Body):
    include_usage: bool | None = None


class _CommonRequest(_Body):
    # every field may be null: null means the default, as in OpenAI's API
    model: str | None = None
    max_tokens: int | None = None  # None → DEFAULT_MAX_TOKENS (completions) or the rest of the context (chat)
    temperature: float | None = None  # None → 1.0, OpenAI's default; pass 0 for greedy
    top_p: float | None = None
    n: int | None = None  # choices per prompt
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string, OpenAI's JSON) → bias in [-100, 100]
    # vLLM's extensions
    top_k: int | None = None  # 0 or -1 = off
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None  # generate exactly max_tokens (benchmarks)


class CompletionRequest(_CommonRequest):
    """The body of ``POST /v1/completions``: a prompt (a string or token ids) or a list of them."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
    logprobs: int | None = None  # top alternatives per token, 0..MAX_LOGPROBS
    best_of: int | None = None  # samples per prompt, the n most likely returned


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None


class JsonSchemaFormat(_Body):
    name: str | None = None
    schema_: dict | None = Field(None, alias="schema")  # "schema" would shadow BaseModel.schema
    description: str | None = None
    strict: bool | None = None  # the schema is always enforced here: strict or not


class ResponseFormat(_Body):
    type: str  # "text", "json_object" or "json_schema"
    json_schema: JsonSchemaFormat | None = None


class ChatRequest(_CommonRequest):
    """The body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None


def unsupported_fields(body: BaseModel, where: str = "") -> list[str]:
    """Every field of ``body`` (nested models and lists too) that the models do not declare and that is not
    null, as dotted names: ``["tools", "messages[0].name"]``."""
    names = [f"{where}{k}" for k, v in (body.model_extra or {}).items() if v is not None]
    for name in type(body).model_fields:
        value = getattr(body, name)
        if isinstance(value, BaseModel):
            names += unsupported_fields(value, f"{where}{name}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    names += unsupported_fields(item, f"{where}{name}[{i}].")
    return names


def message_text(message: ChatMessage, i: int) -> str:
    """A chat message's text: a string, or its text parts joined by newlines (as vLLM joins them)."""
    if message.role not in CHAT_ROLES:
        raise RequestFailure(
            400,
            f"messages[{i}].role={message.role!r} is not supported; use one of {CHAT_ROLES}",
            "",
            f"messages[{i}].role",
        )
    content = message.content
    if content is None:
        raise RequestFailure(400, f"messages[{i}].content is required", "", f"messages[{i}].content")
    if isinstance(content, str):
        return content
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if part.type != "text":
            raise RequestFailure(400, f"{where}: only text parts are supported, got type {part.type!r}", "", where)
        if part.text is None:
            raise RequestFailure(400, f"{where}.text is required in a text part", "", f"{where}.text")
    return "\n".join(part.text for part in content)


def render_chat(messages: list[dict], tokenizer=None) -> str:
    """The prompt for chat ``messages``: the tokenizer's chat template if it has one, else one
    "role: content" line per message followed by "assistant:" (the course's tiny models have no template)."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


class RequestFailure(Exception):
    """A request that ends with an HTTP error: its status, message, the finish reason it is counted under,
    the request field it is about (``param``, None if none) and OpenAI's ``code`` (None: the status's)."""

    def __init__(self, status: int, message: str, reason: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.reason, self.param, self.code = status, message, reason, param, code


# status → OpenAI's error ``type`` and the default ``code``, both strings (the openai client maps the status)
ERRORS = {
    400: ("invalid_request_error", "invalid_value"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", "engine_error"),
    503: ("server_error", "service_unavailable"),
    504: ("server_error", "timeout"),
}
STATUS_OF_CODE = {code: status for status, (_, code) in ERRORS.items()} | {
    "unsupported_parameter": 400,
    "context_length_exceeded": 400,
    "invalid_json": 400,
    "invalid_type": 400,
    "missing_required_parameter": 400,
    "model_not_found": 404,
}
RETRY_AFTER_UNAVAILABLE_S = 5  # 503: shutting down, or the engine is not running


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body for ``status``: ``{"error": {"message", "type", "param", "code"}}``, with string
    ``type`` and ``code`` (``code`` defaults to the status's, e.g. "rate_limit_exceeded" for 429)."""
    kind, default = ERRORS.get(status, ("server_error", "server_error"))
    return {"error": {"message": message, "type": kind, "param": param, "code": code or default}}
