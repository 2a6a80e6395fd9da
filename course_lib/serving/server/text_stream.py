"""Token ids → the text deltas a streaming response sends: what the HTTP side does per generated token
(one decode of the whole output, a hold-back of a possible stop-string prefix or split character).
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations


class TextStream:
    """Token ids → text deltas. Decodes the whole output each token (as ``Engine.stream``), so the deltas
    add up to exactly ``Engine.generate``'s text; holds back a possible stop-string prefix and a split
    multi-byte character, and cuts the text before the stop string as the OpenAI API does."""

    def __init__(self, tokenizer, stop: tuple[str, ...]) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""
        self.shown = 0
        self.offsets: list[int] = []  # per token: where its text starts in the output text (OpenAI's text_offset)
        self._decoded = ""

    def push(self, token_id: int, finish_reason: str | None) -> str:
        self.ids.append(token_id)
        self.offsets.append(len(self._decoded.rstrip("\ufffd")))
        text = self._decoded = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if finish_reason is not None:
            if finish_reason == "stop":
                text = text[: min((text.find(s) for s in self.stop if s in text), default=len(text))]
            self.text = text
            piece, self.shown = text[self.shown :], max(self.shown, len(text))
            return piece
        if text.endswith("\ufffd"):
            return ""  # a multi-byte character is split across tokens: wait for its other bytes
        limit = len(text) - self.hold
        if limit <= self.shown:
            return ""
        piece, self.shown = text[self.shown : limit], limit
        return piece
