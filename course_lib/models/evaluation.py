"""Held-out quality of a causal LM: next-token loss, perplexity, top-1 accuracy, draft–target agreement.

Each is computed over consecutive ``seq_len + 1`` windows of a token array (the validation split), so
every caller (training's periodic evaluation, ``quality``'s model card, distillation, the compressed
models of chapter 03) scores on the same windows. The draft's greedy top-1 agreement with the target
is the α of chapter 04: the probability that the target accepts a drafted token.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def _windows(data: np.ndarray, seq_len: int, max_tokens: int) -> list[np.ndarray]:
    if len(data) < seq_len + 1:
        raise ValueError(f"split has {len(data)} tokens, fewer than seq_len+1={seq_len + 1}")
    n = max(1, min(max_tokens, len(data) - 1) // seq_len)
    return [data[i * seq_len : i * seq_len + seq_len + 1].astype(np.int64) for i in range(n)]


@torch.no_grad()
def evaluate(model, data: np.ndarray, seq_len: int = 256, max_tokens: int = 65_536, batch: int = 8) -> dict[str, float]:
    """Mean next-token loss, perplexity and top-1 accuracy over consecutive windows of ``data``."""
    was_training = model.training
    model.eval()
    windows = _windows(data, seq_len, max_tokens)
    total_loss, correct, total = 0.0, 0, 0
    for first in range(0, len(windows), batch):
        x = torch.from_numpy(np.stack(windows[first : first + batch]))  # (B, T+1)
        logits = model(input_ids=x[:, :-1]).logits.float()  # (B, T, V)
        target = x[:, 1:]
        total_loss += torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum").item()
        correct += (logits.argmax(-1) == target).sum().item()
        total += target.numel()
    model.train(was_training)
    mean = total_loss / total
    return {"loss": mean, "perplexity": math.exp(mean), "top1": correct / total, "tokens": total}


@torch.no_grad()
def top1_agreement(target, draft, data: np.ndarray, seq_len: int = 256, max_tokens: int = 65_536) -> float:
    """Fraction of positions where draft and target pick the same greedy next token (chapter 04's α)."""
    agree, total = 0, 0
    for w in _windows(data, seq_len, max_tokens):
        x = torch.from_numpy(w[None, :-1])
        agree += (target(input_ids=x).logits.argmax(-1) == draft(input_ids=x).logits.argmax(-1)).sum().item()
        total += x.numel()
    return agree / total
