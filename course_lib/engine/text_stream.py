"""Token ids → the text deltas a streaming response sends: what the HTTP side does per generated token.

Decoding the whole output again for every token (``FullDecodeTextStream``, the reference) costs O(n) per
token, O(n²) per answer. ``TextStream`` decodes incrementally, as vLLM's and text-generation-inference's
detokenizers do: it keeps two offsets into the ids, ``prefix`` and ``read``, decodes only the window
``ids[prefix:]`` and emits what it adds to the text of ``ids[prefix:read]``. Decoding from an earlier token
than the new one keeps what a tokenizer does at a boundary (SentencePiece drops the space of a first "▁",
byte-level BPE splits a character across tokens) and the window stays a few tokens long, so a token costs
O(1) amortised. A window whose text ends in U+FFFD holds an incomplete UTF-8 sequence: nothing is emitted
until the bytes complete it (or the answer ends). Stop strings: the last ``len(longest stop) − 1``
characters are held back, since a stop string that later tokens complete must never have been sent; the
text is cut before the stop string, as the OpenAI API does. Both classes produce the same deltas (a
property test checks it on random ids with multi-byte characters). ``Engine.stream`` and the server's jobs
both stream through ``TextStream``. Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not (yet) a whole UTF-8 character


def stop_cut(text: str, stop: tuple[str, ...], start: int = 0) -> int:
    """Where ``text`` is cut for the stop strings: the earliest occurrence of any of them that ends after
    ``start`` (an earlier one was ignored, e.g. under ``min_tokens``); ``len(text)`` if there is none."""
    cuts = []
    for s in stop:
        i = text.find(s, max(0, start - len(s) + 1))
        if i >= 0:
            cuts.append(i)
    return min(cuts, default=len(text))


class TextStream:
    """Token ids → text deltas in O(1) amortised per token; the deltas add up to the full decode (cut at a
    stop string). ``text`` is the whole answer once finished, ``offsets[i]`` where token i's text starts."""

    def __init__(self, tokenizer, stop: tuple[str, ...]) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.prefix = 0  # the window starts here: a token boundary at a character boundary
        self.read = 0  # ids[prefix:read] is already part of the text
        self.pending = ""  # decoded but not yet sent: a possible stop string's start
        self.sent: list[str] = []
        self.decoded = 0  # characters decoded so far (sent + pending)
        self.offsets: list[int] = []  # per token: where its text starts in the output (OpenAI's text_offset)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _advance(self, final: bool) -> str:
        """The characters ``ids[read:]`` add; moves the window on when they are complete (or ``final``)."""
        window = self.ids[self.prefix :]
        before = self._decode(self.ids[self.prefix : self.read]) if self.read > self.prefix else ""
        text = self._decode(window)
        if not final and (len(text) <= len(before) or text.endswith(REPLACEMENT)):
            return ""  # no new text yet, or a character split across tokens: wait for its other bytes
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before) :]

    def push(self, token_id: int, finish_reason: str | None) -> str:
        """The text delta of one more token (``finish_reason``: the engine's, on the last token)."""
        self.ids.append(token_id)
        self.offsets.append(self.decoded)
        new = self._advance(final=finish_reason is not None)
        self.decoded += len(new)
        start = len(self.pending)
        self.pending += new
        if finish_reason is None:
            n = len(self.pending) - self.hold
            if n <= 0:
                return ""
            piece, self.pending = self.pending[:n], self.pending[n:]
        else:
            piece = self.pending
            if finish_reason == "stop":  # the stop string ends in this token's text: cut before it
                piece = piece[: stop_cut(piece, self.stop, start)]
            self.pending = ""
        self.sent.append(piece)
        if finish_reason is not None:
            self.text = "".join(self.sent)
        return piece


class FullDecodeTextStream:
    """The reference: decodes the whole output each token, O(n) per token, so its
    deltas are exactly the full decode's; holds back a possible stop-string prefix and a split character."""

    def __init__(self, tokenizer, stop: tuple[str, ...]) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""
        self.shown = 0
        self._before = 0  # characters of the whole decode before the latest token

    def push(self, token_id: int, finish_reason: str | None) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        before, self._before = self._before, len(text.rstrip(REPLACEMENT))
        if finish_reason is not None:
            if finish_reason == "stop":
                text = text[: stop_cut(text, self.stop, before)]
            self.text = text
            piece, self.shown = text[self.shown :], max(self.shown, len(text))
            return piece
        if text.endswith(REPLACEMENT):
            return ""  # a multi-byte character is split across tokens: wait for its other bytes
        limit = len(text) - self.hold
        if limit <= self.shown:
            return ""
        piece, self.shown = text[self.shown : limit], limit
        return piece


def cost_per_token_us(cls, tokenizer, ids, repeats: int = 3, stop: tuple[str, ...] = ("\n\n\n",)) -> float:
    """Microseconds a stream class (``TextStream`` or ``FullDecodeTextStream``) spends per pushed token over
    ``ids``, the best of ``repeats`` passes: what detokenizing adds to each streamed token. It reads this
    thread's CPU time (``time.thread_time``), so a busy machine that preempts the loop does not inflate it."""
    import time

    ids = list(ids)
    if not ids:
        raise ValueError("ids must be a non-empty sequence of token ids")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    best = float("inf")
    for _ in range(repeats):
        stream = cls(tokenizer, stop)
        t0 = time.thread_time()
        for i, t in enumerate(ids):
            stream.push(t, "length" if i == len(ids) - 1 else None)
        best = min(best, time.thread_time() - t0)
    return best / len(ids) * 1e6
