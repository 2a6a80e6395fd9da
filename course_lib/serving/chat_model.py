"""Chapter 02 on the course's real chat model: a memory-safe engine, a chat prompt, one timed answer.

SmolLM2-135M-Instruct's fp32 weights (538 MB) are far larger than a CPU's last-level cache, so its decode
streams them from DRAM every step (bandwidth-bound) and its prefill is compute-bound from a few dozen
tokens on: the regime the latency lesson is about, where the 5M tiny model is overhead-bound.
``chat_engine`` builds the engine with a small KV cache (the default reserves 64 × 8,192 slots of 46 KB,
far over a 1.5 GB budget) and, on a CPU in fp32, with ``linear="packed"``: oneDNN's packed weights, the
plain ones freed (the default ``"auto"`` would keep both copies of the 538 MB), ``chat_ids`` applies the model's own chat template, and ``chat_answer``
generates a greedy answer that stops at the end-of-turn token, keeping every token's timestamp (TTFT,
TPOT, and each inter-token latency). Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.measure.costs import check_positive_int
from course_lib.measure.metrics import RequestTrace, percentiles

CHAT_MODEL = "smollm2-135m-instruct"


def chat_engine(
    model: str = CHAT_MODEL,
    *,
    max_model_len: int = 1024,
    max_num_seqs: int = 1,
    max_num_batched_tokens: int | None = None,
    device: str = "cpu",
    dtype: str = "fp32",
    linear: str | None = None,
) -> Engine:
    """An ``Engine`` of ``model`` whose contiguous KV cache holds only ``max_num_seqs`` × ``max_model_len``
    tokens (SmolLM2 fp32: 46 KB each). ``max_num_batched_tokens`` (default: enough for the longest prompt
    in one step, so a prefill is one forward pass, not chunks) caps the tokens of one step. ``linear``:
    the engine's linear seam (default: the engine's own, "auto", with its ``decode="auto"`` step: on a CPU
    in fp32 the native C step for 1-4 sequences and the course's GEMV, oneDNN on a packed copy made when a
    5..16-row product first comes, +538 MB for this model). "packed" keeps one copy of the weights, packed
    (oneDNN for every shape, no native step: for a small-memory machine); "reference" is ``F.linear``."""
    check_positive_int("max_model_len", max_model_len)
    check_positive_int("max_num_seqs", max_num_seqs)
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2 (a prompt token and an output token), got {max_model_len}")
    budget = max(2048, max_model_len * max_num_seqs) if max_num_batched_tokens is None else max_num_batched_tokens
    check_positive_int("max_num_batched_tokens", budget)
    config = SchedulerConfig(max_model_len=max_model_len, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    linear = "auto" if linear is None else linear
    return Engine(model, device=device, dtype=dtype, config=config, linear=linear)


def chat_ids(tokenizer, message: str, system: str | None = None) -> list[int]:
    """The token ids of a one-turn chat, the model's chat template applied and the assistant's turn opened
    (``add_generation_prompt=True``): what a chat server feeds the engine."""
    if not isinstance(message, str) or not message.strip():
        raise ValueError(f"message must be a non-empty string, got {message!r}")
    if system is not None and not isinstance(system, str):
        raise ValueError(f"system must be None or a string, got {type(system).__name__}")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the tokenizer has no chat template: use the chat model (serving.chat_model.CHAT_MODEL)")
    turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


@dataclass(frozen=True)
class ChatAnswer:
    """A generated answer with its per-token timestamps."""

    message: str
    prompt_ids: tuple[int, ...]
    text: str
    output_ids: tuple[int, ...]
    finish_reason: str
    trace: RequestTrace

    @property
    def itl_percentiles(self) -> dict[int, float]:
        """p50/p90/p99 of the inter-token latencies (s): every gap, not their mean (the TPOT)."""
        if len(self.trace.itl) < 1:
            raise ValueError("an answer of one token has no inter-token gap")
        return percentiles(self.trace.itl, (50, 90, 99))


def chat_answer(engine, message: str, *, max_new_tokens: int = 64, system: str | None = None) -> ChatAnswer:
    """Greedy answer to ``message`` through ``engine``, stopping at the end-of-turn token or after
    ``max_new_tokens``; the trace holds every token's arrival time on the host."""
    check_positive_int("max_new_tokens", max_new_tokens)
    ids = chat_ids(engine.tokenizer, message, system)
    [res] = engine.generate([ids], SamplingParams(max_new_tokens=max_new_tokens))
    return ChatAnswer(message, tuple(ids), res.text, tuple(res.output_ids), res.finish_reason, res.trace)


__all__ = ["CHAT_MODEL", "ChatAnswer", "chat_answer", "chat_engine", "chat_ids"]
