"""One streamed chat answer, as a user sees it: the ``openai`` client's chunks printed as they arrive, each
stamped with ``time.perf_counter()`` on arrival, so TTFT (send → first text) and the gaps between chunks
(ITL) come from the stream itself, network and server included. A chunk can carry more than one token (the
server holds back bytes that do not yet decode to text), so the time per output token (TPOT) divides the
stream's decode time by the token count the server reports in its usage chunk. Introduced in
06_batching_serving.ipynb.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StreamedChat:
    """What one streamed chat request returned: the text pieces, when each arrived (seconds after sending),
    how it finished and how many tokens the server counted."""

    pieces: tuple[str, ...]
    arrivals_s: tuple[float, ...]
    finish_reason: str | None
    completion_tokens: int | None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def ttft_s(self) -> float:
        """Send → first piece of text."""
        return self.arrivals_s[0] if self.arrivals_s else float("nan")

    @property
    def itl_s(self) -> np.ndarray:
        """The gaps between consecutive pieces."""
        return np.diff(np.asarray(self.arrivals_s, dtype=float))

    @property
    def tpot_s(self) -> float:
        """(last piece − first piece) / (tokens − 1): the decode time per token after the first."""
        n = self.completion_tokens if self.completion_tokens is not None else len(self.pieces)
        if n < 2 or len(self.arrivals_s) < 2:
            return float("nan")
        return (self.arrivals_s[-1] - self.arrivals_s[0]) / (n - 1)

    def describe(self) -> str:
        itl = self.itl_s
        gaps = f"ITL p50 {np.median(itl) * 1e3:.1f} ms, max {itl.max() * 1e3:.1f} ms" if itl.size else "no ITL"
        return (
            f"{len(self.pieces)} chunks, {self.completion_tokens} tokens, finish {self.finish_reason!r}: "
            f"TTFT {self.ttft_s * 1e3:.0f} ms, {gaps}, TPOT {self.tpot_s * 1e3:.1f} ms"
        )


def stream_chat(
    client,
    messages: list[dict],
    *,
    model: str,
    max_tokens: int = 64,
    temperature: float = 0.0,
    on_piece: Callable[[str], object] | None = None,
    **create_kwargs,
) -> StreamedChat:
    """Send ``messages`` with ``client.chat.completions.create(stream=True)`` (an ``openai.OpenAI``) and
    collect the stream; ``on_piece(text)`` is called on every piece as it arrives (``print`` with
    ``end=""``, ``flush=True`` shows the answer being written)."""
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) and "role" in m for m in messages)):
        raise ValueError(
            f"messages must be a non-empty list of {{'role': ..., 'content': ...}} dicts, got {messages!r}"
        )
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    if on_piece is not None and not callable(on_piece):
        raise ValueError(f"on_piece must be None or a callable taking the text of a chunk, got {on_piece!r}")
    pieces, arrivals, finish, tokens = [], [], None, None
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=temperature,
        stream=True,
        stream_options={"include_usage": True},
        **create_kwargs,
    )
    for chunk in stream:
        now = time.perf_counter() - t0
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        piece = choice.delta.content if choice.delta is not None else None
        if piece:
            pieces.append(piece)
            arrivals.append(now)
            if on_piece is not None:
                on_piece(piece)
        if choice.finish_reason is not None:
            finish = choice.finish_reason
    return StreamedChat(tuple(pieces), tuple(arrivals), finish, tokens)
