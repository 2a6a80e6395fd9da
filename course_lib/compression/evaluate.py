"""Quality and speed of a *compressed engine*, measured through the engine's own forward.

Pruning and quantization replace or edit the engine's linear layers (``engine.model.linears()``),
and after structured pruning or a quantized layer the ``transformers`` model no longer computes the
same thing. So everything here runs ``engine.model.dense_logits``: the layers that were compressed
are the layers that are evaluated, never the untouched HF module.
- ``perplexity`` / ``evaluate``: next-token loss on consecutive windows of the validation split
  (the same windows and maths as ``course_lib.models.evaluation.evaluate``, which runs the HF model);
- ``greedy_agreement``: teacher-forced top-1 agreement of two engines on the same windows, i.e. the
  fraction of positions where both would pick the same greedy next token given the same prefix;
- ``decode_step_time``: seconds per decode step of ``engine.generate`` at a given batch.
Quick on purpose: the tiny model on 16k tokens takes about a second on two cores.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def validation_tokens(engine) -> np.ndarray:
    """The validation split as token ids of ``engine.tokenizer`` (cached on disk after the first call)."""
    from course_lib.models.tokenizer import token_ids

    return token_ids(engine.tokenizer, "val")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _windows(engine, data, seq_len: int, max_tokens: int) -> list[np.ndarray]:
    """Consecutive ``seq_len + 1`` windows of ``data`` (the validation split if None), as in evaluation.evaluate."""
    from course_lib.models.evaluation import _windows

    _check_int("seq_len", seq_len, 1)
    _check_int("max_tokens", max_tokens, 1)
    if seq_len > engine.model.max_position:
        raise ValueError(f"seq_len={seq_len} exceeds the model's context window of {engine.model.max_position}")
    if data is None:
        data = validation_tokens(engine)
    data = np.asarray(data)
    if data.ndim != 1 or not np.issubdtype(data.dtype, np.integer):
        raise ValueError(f"data must be a 1-D array of token ids, got shape {data.shape} dtype {data.dtype}")
    if len(data) and (data.min() < 0 or data.max() >= engine.model.vocab_size):
        raise ValueError(f"data holds token ids outside [0, {engine.model.vocab_size})")
    return _windows(data, seq_len, max_tokens)


def _batches(windows: list[np.ndarray], batch: int, device):
    for first in range(0, len(windows), batch):
        yield torch.from_numpy(np.stack(windows[first : first + batch])).to(device)  # (B, T+1)


@torch.no_grad()
def evaluate(engine, data=None, seq_len: int = 256, max_tokens: int = 16_384, batch: int = 8) -> dict[str, float]:
    """Mean next-token loss, perplexity and top-1 accuracy of ``engine.model`` over consecutive windows
    of ``data`` (default: the validation split); ``max_tokens`` caps how many tokens are scored."""
    _check_int("batch", batch, 1)
    windows = _windows(engine, data, seq_len, max_tokens)
    total_loss, correct, total = 0.0, 0, 0
    for x in _batches(windows, batch, engine.device):
        logits = engine.model.dense_logits(x[:, :-1]).float()  # (B, T, V)
        target = x[:, 1:]
        total_loss += torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum").item()
        correct += (logits.argmax(-1) == target).sum().item()
        total += target.numel()
    mean = total_loss / total
    return {"loss": mean, "perplexity": math.exp(mean), "top1": correct / total, "tokens": total}


def perplexity(engine, data=None, seq_len: int = 256, max_tokens: int = 16_384) -> float:
    """exp(mean next-token loss) of the engine's model on the validation split (or ``data``)."""
    return evaluate(engine, data, seq_len=seq_len, max_tokens=max_tokens)["perplexity"]


@torch.no_grad()
def greedy_agreement(
    engine_a, engine_b, data=None, seq_len: int = 256, max_tokens: int = 4096, batch: int = 8
) -> float:
    """Teacher-forced top-1 agreement: over the same validation windows (both models see the same
    true prefix at every position), the fraction of positions where ``engine_a`` and ``engine_b`` pick
    the same argmax next token. 1.0 means greedy decoding would never diverge at the first step from
    any prefix; it is not the fraction of identical tokens of two free-running generations (those
    diverge for good after the first difference)."""
    _check_int("batch", batch, 1)
    if engine_a.model.vocab_size != engine_b.model.vocab_size:
        raise ValueError(
            f"the engines have different vocabularies ({engine_a.model.vocab_size} vs {engine_b.model.vocab_size})"
        )
    windows = _windows(engine_a, data, seq_len, max_tokens)
    agree, total = 0, 0
    for x in _batches(windows, batch, engine_a.device):
        ids = x[:, :-1]
        a = engine_a.model.dense_logits(ids).argmax(-1)
        b = engine_b.model.dense_logits(ids.to(engine_b.device)).argmax(-1).to(a.device)
        agree += (a == b).sum().item()
        total += ids.numel()
    return agree / total


def decode_step_time(
    engine, batch: int = 1, new_tokens: int = 32, repeats: int = 3, prompt: str = "import os\n"
) -> float:
    """Seconds per decode step of ``engine.generate`` for ``batch`` copies of ``prompt``:
    (median time for ``new_tokens`` − median time for 1) / (``new_tokens`` − 1), so prefill and
    set-up cancel."""
    from course_lib.bottlenecks.engine_vs_hf import step_time
    from course_lib.engine.sampling import SamplingParams

    _check_int("batch", batch, 1)
    _check_int("new_tokens", new_tokens, 2)
    _check_int("repeats", repeats, 1)
    prompts = [prompt] * batch

    @torch.inference_mode()
    def run(n: int) -> None:
        engine.generate(prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))

    return step_time(run, new_tokens, repeats, engine.device.type)
