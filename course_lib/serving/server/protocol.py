"""The OpenAI wire format of the course server: the request bodies (pydantic models), the error body
``{"error": {"message", "type", "code"}}``, OpenAI's finish-reason names and the chat prompt's fallback
rendering. No engine and no HTTP here: ``app`` parses with these models and answers with these bodies.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# OpenAI names two finish reasons; the engine's "eos" (end of sequence) is OpenAI's "stop"
OPENAI_REASON = {"eos": "stop", "stop": "stop", "length": "length"}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _CommonRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI fields we do not implement are ignored

    model: str | None = None
    max_tokens: int | None = None  # None → DEFAULT_MAX_TOKENS
    temperature: float = 1.0  # OpenAI's default; pass 0 for greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens (benchmarks)


class CompletionRequest(_CommonRequest):
    """The body of ``POST /v1/completions``: one prompt, a string or token ids."""

    prompt: str | list[int]


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatRequest(_CommonRequest):
    """The body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def render_chat(messages: list[dict], tokenizer=None) -> str:
    """The prompt for chat ``messages``: the tokenizer's chat template if it has one, else one
    "role: content" line per message followed by "assistant:" (the course's tiny models have no template)."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


class RequestFailure(Exception):
    """A request that ends with an HTTP error: its status, message and the finish reason it is counted under."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def error_body(status: int, message: str) -> dict:
    """OpenAI's error body for ``status``: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 504: "timeout"}
    return {"error": {"message": message, "type": kind.get(status, "server_error"), "param": None, "code": status}}
