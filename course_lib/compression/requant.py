"""Quality of re-quantizing the chat model, against the weights it ships with.

SmolLM2-135M-Instruct reaches the course as llama.cpp Q4_1 (``models.gguf``), so its "fp32" weights are the
dequantized Q4_1 blocks: that model is the reference here, and every other format rounds *those* weights
again. Three measures, all through the engine's own forward (``engine.model.dense_logits``):
- perplexity on held text (the course corpus's validation split: Python stdlib source), windows of 256
  tokens, batch 2 (a window's logits are 256 × 49,152 floats, 50 MB);
- teacher-forced agreement: the share of positions where a format's argmax equals the reference's;
- chat agreement: greedy answers to chat prompts (chat template applied), token by token against the
  reference's answer: how many answers are identical, and the mean share of tokens before the first
  difference.
The formats go into one engine through its linear seam and the float layers come back after each
(``swap``), so the model is held once. The LM head is int8 per channel in every quantized format, as in
the speed table. GPTQ over all 30 layers needs every layer's Hessian (~400 MB) and minutes on 2 cores:
``python -m course_lib.compression.requant_record`` records it. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from course_lib.compression.decode_formats import INT8, quantize_chunked
from course_lib.compression.linear import WeightOnlyLinear
from course_lib.compression.quantize import QuantConfig
from course_lib.core.memory import trim_heap

INT4_G64 = QuantConfig(4, False, "group", 64)  # 128 does not divide the hidden size 576 = 9·64
INT4_G32 = QuantConfig(4, False, "group", 32)
CHAT_PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Give me three tips for a good night's sleep.",
    "In one sentence, why is decoding a language model limited by memory bandwidth?",
)


def held_windows(engine, n_windows: int, seq_len: int = 256) -> list[np.ndarray]:
    """The first ``n_windows`` consecutive windows of ``seq_len + 1`` tokens of the validation split."""
    from course_lib.compression.evaluate import _windows

    if isinstance(n_windows, bool) or not isinstance(n_windows, int) or n_windows < 1:
        raise ValueError(f"n_windows must be an int >= 1, got {n_windows!r}")
    return _windows(engine, None, seq_len, n_windows * seq_len)


@dataclass(frozen=True)
class Scored:
    """One model on the held windows: mean loss, perplexity, and its argmax at every position."""

    loss: float
    tokens: int
    argmax: torch.Tensor  # (positions,)
    losses: torch.Tensor | None = None  # (positions,) each token's loss, for paired comparisons

    @property
    def perplexity(self) -> float:
        return float(np.exp(self.loss))

    def agreement(self, reference: Scored) -> float:
        """Share of positions where this model's argmax equals ``reference``'s."""
        if self.argmax.shape != reference.argmax.shape:
            raise ValueError(f"scored on different windows: {self.argmax.shape} vs {reference.argmax.shape}")
        return float((self.argmax == reference.argmax).float().mean())


def _dense_hidden(model, input_ids: torch.Tensor) -> torch.Tensor:
    """``model.dense_logits`` without the head: (B, T) ids → (B·T, D) last hidden states."""
    from course_lib.engine.attention import NoCacheBackend

    B, T = input_ids.shape
    backend = NoCacheBackend(max(T, 1))
    positions = torch.arange(T, device=input_ids.device).repeat(B)
    meta = backend.prepare([backend.allocate() for _ in range(B)], [T] * B, positions)
    return model.run_layers(model.embed(input_ids.reshape(-1)), positions, meta, backend)


@torch.no_grad()
def score(engine, windows, batch: int = 2, rows: int = 64) -> Scored:
    """Mean next-token loss and argmax of ``engine.model`` over ``windows`` (from ``held_windows``). The
    head runs on ``rows`` positions at a time, so a 256-token window never holds its whole 256 × 49,152
    logits (50 MB, and as much again for the log-softmax): the same numbers, a fraction of the memory."""
    for name, v in (("batch", batch), ("rows", rows)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if not windows:
        raise ValueError("windows is empty")
    total, n, argmax, losses = 0.0, 0, [], []
    for first in range(0, len(windows), batch):
        x = torch.from_numpy(np.stack(windows[first : first + batch])).to(engine.device)  # (B, T+1)
        hidden = _dense_hidden(engine.model, x[:, :-1])  # (B·T, D)
        target = x[:, 1:].flatten()
        for i in range(0, hidden.shape[0], rows):
            logits = engine.model.head(hidden[i : i + rows]).float()  # (rows, V)
            per = torch.nn.functional.cross_entropy(logits, target[i : i + rows], reduction="none")
            total += per.sum().item()
            losses.append(per)
            argmax.append(logits.argmax(-1))
            del logits
        n += target.numel()
    return Scored(total / n, n, torch.cat(argmax), torch.cat(losses))


def chat_ids(tokenizer, prompts=CHAT_PROMPTS) -> list[list[int]]:
    """Each prompt as one user message through the tokenizer's chat template, ready for generation."""
    if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty strings")
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for p in prompts
    ]


def answers(engine, ids: list[list[int]], max_new_tokens: int = 32) -> list[list[int]]:
    """Greedy answers (token ids, stopping at the end-of-turn token) to every prompt of ``ids``, batched."""
    from course_lib.engine.sampling import SamplingParams

    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    with torch.inference_mode():
        outs = engine.generate(ids, SamplingParams(max_new_tokens=max_new_tokens))
    return [list(o.output_ids) for o in outs]


def chat_agreement(reference: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    """{"identical": answers equal token for token, "prefix": mean share of the reference's tokens before
    the first difference, "answers": how many}."""
    if len(reference) != len(other) or not reference:
        raise ValueError(f"need the same non-zero number of answers, got {len(reference)} and {len(other)}")
    shares, same = [], 0
    for a, b in zip(reference, other):
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same += int(a == b)
        shares.append(1.0 if a == b else k / max(len(a), 1))
    return {"identical": same, "prefix": float(np.mean(shares)), "answers": len(reference)}


def int8_head(engine):
    """The engine's LM head alone, int8 per channel on the layer's fast path (as ``quantized_layers`` builds
    it): for a section that needs only the head, without quantizing every other layer too."""
    lin = engine.model.lm_head
    if isinstance(lin, WeightOnlyLinear):
        raise ValueError("the LM head is already quantized: give the float engine")
    return WeightOnlyLinear(quantize_chunked(lin.weight, INT8), lin.bias, max_rows=1 << 30)


def quantized_layers(engine, config: QuantConfig, qweights=None, head: bool = True) -> dict:
    """{name: WeightOnlyLinear} for the engine's float layers: ``qweights`` where given (GPTQ), else round
    to nearest in ``config``; the LM head int8 per channel if ``head``. Every input, a 256-token window
    too, takes the layer's fast path (on a CPU the packed kernel, bf16 activations, as decode does), so
    no layer builds a float copy of its weight per call (the head's would be 113 MB)."""
    rows = 1 << 30  # every input through the CPU kernel, as in decode (no float copy of the weight per call)
    out = {}
    for name, lin in engine.model.linears():
        if isinstance(lin, WeightOnlyLinear):
            raise ValueError(f"layer {name!r} is already quantized: give the float engine")
        if name == "lm_head":
            if head:
                out[name] = int8_head(engine)
            continue
        qw = (qweights or {}).get(name) or quantize_chunked(lin.weight, config)
        out[name] = WeightOnlyLinear(qw, lin.bias, max_rows=rows)
    return out


@contextmanager
def swap(engine, layers: dict):
    """Put ``layers`` ({name: layer}) into ``engine`` for the ``with`` block, then give the old ones back."""
    old = dict(engine.model.linears())
    unknown = [n for n in layers if n not in old]
    if unknown:
        raise ValueError(f"layers has unknown names {unknown}; names look like 'layers.0.qkv' or 'lm_head'")
    try:
        for name, lin in layers.items():
            engine.model.set_linear(name, lin)
        yield engine
    finally:
        for name in layers:
            engine.model.set_linear(name, old[name])
        trim_heap()


def compare_formats(engine, windows, ids, formats: dict, max_new_tokens: int = 32, batch: int = 2) -> list[dict]:
    """The reference (``engine`` as it is) and each of ``formats`` ({label: callable(engine) → layers for
    ``swap``}) scored on ``windows`` and answering ``ids``: one dict per row with "format", "perplexity",
    "ppl_rel" (vs the reference), "agreement" (teacher-forced) and "chat" (``chat_agreement``)."""
    if not isinstance(formats, dict) or not all(callable(f) for f in formats.values()):
        raise ValueError("formats must be a dict {label: callable(engine) -> {layer name: layer}}")
    ref = score(engine, windows, batch)
    ref_answers = answers(engine, ids, max_new_tokens)
    rows = [
        {
            "format": "reference",
            "perplexity": ref.perplexity,
            "ppl_rel": 0.0,
            "agreement": 1.0,
            "chat": chat_agreement(ref_answers, ref_answers),
            "tokens": ref.tokens,
            "losses": ref.losses,
        }
    ]
    for label, make in formats.items():
        with swap(engine, make(engine)):
            s = score(engine, windows, batch)
            a = answers(engine, ids, max_new_tokens)
        rows.append(
            {
                "format": label,
                "perplexity": s.perplexity,
                "ppl_rel": s.perplexity / ref.perplexity - 1,
                "agreement": s.agreement(ref),
                "chat": chat_agreement(ref_answers, a),
                "tokens": s.tokens,
                "losses": s.losses,
            }
        )
    return rows


def paired_z(losses_a: torch.Tensor, losses_b: torch.Tensor) -> float:
    """How many standard errors the mean per-token loss of a sits above b's on the same tokens:
    mean(a − b) / (std(a − b) / √n). Above ~2, the held text says a is worse, beyond its sampling noise."""
    if losses_a is None or losses_b is None or losses_a.shape != losses_b.shape or losses_a.numel() < 2:
        raise ValueError("need two per-token loss tensors of the same shape, at least 2 tokens (Scored.losses)")
    d = (losses_a - losses_b).double()
    se = d.std() / d.numel() ** 0.5
    return float(d.mean() / se) if se > 0 else (0.0 if d.mean() == 0 else float("inf") * float(d.mean().sign()))


def quality_table(rows: list[dict]) -> str:
    """``compare_formats``' rows (or a recorded run's) as a text table."""
    lines = [f"{'format':<28}{'perplexity':>11}{'vs ref':>9}{'agreement':>10}{'chat identical':>15}{'chat prefix':>12}"]
    for r in rows:
        c = r["chat"]
        lines.append(
            f"{r['format']:<28}{r['perplexity']:>11.3f}{r['ppl_rel']:>+9.2%}{r['agreement']:>10.1%}"
            f"{c['identical']:>11}/{c['answers']:<3}{c['prefix']:>12.1%}"
        )
    return "\n".join(lines)


__all__ = [
    "paired_z",
    "quality_table",
    "compare_formats",
    "CHAT_PROMPTS",
    "INT4_G64",
    "INT4_G32",
    "Scored",
    "answers",
    "chat_agreement",
    "chat_ids",
    "held_windows",
    "int8_head",
    "quantized_layers",
    "score",
    "swap",
]
