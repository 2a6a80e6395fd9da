"""The answers' bodies in OpenAI's formats: a completion or chat choice, a streamed chunk's choice, and
log-probs as the completions API gives them (``tokens`` / ``token_logprobs`` / ``top_logprobs`` /
``text_offset``) or as chat gives them (``content``: token, logprob, bytes, top_logprobs). A token's text
is the token decoded alone (as vLLM reports it): a byte-level token that holds part of a character
shows as U+FFFD, its ``bytes`` as that text's UTF-8. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from course_lib.serving.server.protocol import OPENAI_REASON


class TokenStrings:
    """Token id → its text decoded alone, cached (the same ids recur)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.cache = tokenizer, {}

    def __call__(self, token_id: int) -> str:
        text = self.cache.get(token_id)
        if text is None:
            text = self.cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text


def completion_logprobs(entries: list, offsets: list[int], strings: TokenStrings, shift: int = 0) -> dict:
    """The completions API's ``logprobs`` for ``entries`` ((token id, log-prob, top) per token); ``offsets``
    are the tokens' character offsets in the output text, ``shift`` the echoed prompt's length before it."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for (tok, lp, top), off in zip(entries, offsets):
        out["tokens"].append(strings(tok))
        out["token_logprobs"].append(lp)
        alternatives = {strings(t): v for t, v in top}
        alternatives.setdefault(strings(tok), lp)  # "up to logprobs + 1": the sampled token is always there
        out["top_logprobs"].append(alternatives)
        out["text_offset"].append(off + shift)
    return out


def chat_logprobs(entries: list, strings: TokenStrings) -> dict:
    """The chat API's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}, ...]}``."""

    def one(tok: int, lp: float) -> dict:
        text = strings(tok)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {"content": [one(tok, lp) | {"top_logprobs": [one(t, v) for t, v in top]} for tok, lp, top in entries]}


def choice_body(index: int, choice, chat: bool, strings: TokenStrings, want_logprobs: bool, echo: str = "") -> dict:
    """One choice of a whole (non-streamed) answer."""
    reason = OPENAI_REASON.get(choice.finish_reason)
    logprobs = None
    if want_logprobs and chat:
        logprobs = chat_logprobs(choice.logprobs, strings)
    elif want_logprobs:
        logprobs = completion_logprobs(choice.logprobs, choice.text.offsets, strings, len(echo))
    if chat:
        message = {"role": "assistant", "content": choice.text.text}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason}
    return {"index": index, "text": echo + choice.text.text, "logprobs": logprobs, "finish_reason": reason}


def chunk_choice(
    index: int, piece: str, choice, chat: bool, strings: TokenStrings, want_logprobs: bool, shift: int = 0
) -> dict:
    """One streamed chunk's choice: the text delta of the choice's latest token (and that token's log-probs)."""
    reason = OPENAI_REASON.get(choice.finish_reason)
    logprobs = None
    if want_logprobs:
        entry = choice.logprobs[-1:]
        if chat:
            logprobs = chat_logprobs(entry, strings)
        else:
            logprobs = completion_logprobs(entry, choice.text.offsets[-1:], strings, shift)
    if chat:
        delta = {"content": piece} if piece or reason is None else {}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
    return {"index": index, "text": piece, "logprobs": logprobs, "finish_reason": reason}
