"""Chapter 04's measurements of decoding strategies: what greedy, beam, top-k/top-p, temperature and
penalties do to a model's output, in numbers.

The strategies themselves live in the engine (``engine.sampling``: the reference functions, and the
vectorised ``engine.sampler``). This module measures their effect: the log-likelihood of a sequence
under the model (greedy vs beam), the cut-off top-k and top-p draw on one real next-token distribution,
diversity (distinct n-grams) against quality (perplexity of the generated text under the model), and
repetition with and without penalties. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course_lib.engine.sampling import SamplingParams, apply_temperature, top_k_filter, top_p_filter


def _ids_list(name: str, seqs) -> list[list[int]]:
    if not isinstance(seqs, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in seqs):
        raise ValueError(f"{name} must be a list of token-id lists, got {type(seqs).__name__}")
    return [list(s) for s in seqs]


def distinct_n(seqs: Sequence[Sequence[int]], n: int = 2) -> float:
    """Distinct-n (Li et al., 2016): unique n-grams ÷ all n-grams over ``seqs``; 1.0 = nothing repeats."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    grams = [tuple(s[i : i + n]) for s in _ids_list("seqs", seqs) for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_rate(ids: Sequence[int], n: int = 4) -> float:
    """Share of a sequence's n-grams that already occurred earlier in it: loops score high."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    seen, repeats, total = set(), 0, 0
    ids = list(ids)
    for i in range(len(ids) - n + 1):
        gram = tuple(ids[i : i + n])
        repeats += gram in seen
        total += 1
        seen.add(gram)
    return repeats / total if total else 0.0


@torch.inference_mode()
def sequence_logprob(engine, prompt: Sequence[int], output: Sequence[int]) -> float:
    """Sum of log p(output_t | prompt, output_<t) under ``engine``'s model (teacher-forced, one forward)."""
    prompt, output = list(prompt), list(output)
    if not prompt or not output:
        raise ValueError("prompt and output must both hold at least one token")
    ids = torch.tensor([prompt + output], device=engine.device)  # (1, T)
    logits = engine.model.dense_logits(ids)[0, len(prompt) - 1 : -1].float()  # (len(output), V)
    logp = torch.log_softmax(logits, dim=-1)
    return float(logp.gather(1, torch.tensor(output, device=logp.device)[:, None]).sum())


@torch.inference_mode()
def perplexity_of(engine, prompt: Sequence[int], output: Sequence[int]) -> float:
    """exp(−mean log p) of ``output`` under the model: how likely the model finds text it (or another) wrote."""
    return float(torch.exp(torch.tensor(-sequence_logprob(engine, prompt, output) / max(len(output), 1))))


@dataclass(frozen=True)
class Cutoff:
    """How many tokens a filter keeps on one distribution, and the probability mass they hold."""

    name: str
    kept: int
    mass: float


@torch.inference_mode()
def next_token_probs(engine, prompt: Sequence[int]) -> torch.Tensor:
    """The model's next-token distribution after ``prompt``: (V,) probabilities."""
    ids = torch.tensor([list(prompt)], device=engine.device)
    return torch.softmax(engine.model.dense_logits(ids)[0, -1].float(), dim=-1)


def cutoffs(probs: torch.Tensor, top_ks=(1, 10, 50), top_ps=(0.5, 0.9, 0.95)) -> list[Cutoff]:
    """What top-k and top-p keep of one distribution (using the engine's reference filters)."""
    if probs.dim() != 1 or not torch.isclose(probs.sum(), torch.tensor(1.0, dtype=probs.dtype), atol=1e-3):
        raise ValueError("probs must be one probability vector (V,) that sums to 1")
    logits = probs.clamp(min=1e-30).log()[None]  # (1, V)
    rows = []
    for k in top_ks:
        keep = torch.isfinite(top_k_filter(logits, k))[0]
        rows.append(Cutoff(f"top-k {k}", int(keep.sum()), float(probs[keep].sum())))
    for p in top_ps:
        keep = torch.isfinite(top_p_filter(logits, p))[0]
        rows.append(Cutoff(f"top-p {p}", int(keep.sum()), float(probs[keep].sum())))
    return rows


def tempered(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """The distribution sampling sees at ``temperature`` (the engine's ``apply_temperature``)."""
    return torch.softmax(apply_temperature(probs.clamp(min=1e-30).log()[None], temperature)[0], dim=-1)


@dataclass(frozen=True)
class StrategyRow:
    """One decoding setting run over a set of prompts."""

    name: str
    distinct2: float
    repetition4: float
    perplexity: float  # of the generated text under the model itself


def run_strategies(engine, prompts: Sequence[Sequence[int]], settings: dict[str, SamplingParams]) -> list[StrategyRow]:
    """Generate from every prompt with each named ``SamplingParams`` and measure diversity, repetition
    and the model's own perplexity of what it wrote."""
    prompts = _ids_list("prompts", prompts)
    rows = []
    for name, params in settings.items():
        results = engine.generate(prompts, params)
        outs = [r.output_ids for r in results]
        ppl = [perplexity_of(engine, p, o) for p, o in zip(prompts, outs) if o]
        rep = [repetition_rate(o) for o in outs]
        rows.append(StrategyRow(name, distinct_n(outs, 2), sum(rep) / len(rep), sum(ppl) / max(len(ppl), 1)))
    return rows


_VISIBLE = {"\n": "↵", "\t": "⇥", " ": "␣"}


def visible(text: str) -> str:
    """``text`` for a plot label: newlines, tabs and spaces drawn as ↵ ⇥ ␣ (a ``repr`` puts a backslash and
    quotes in the label, and a raw newline breaks it across lines); an empty string as ∅."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if not text:
        return "∅"
    if text.strip() == text:  # inner spaces stay spaces; only newlines and tabs are drawn
        return "".join(_VISIBLE[c] if c in "\n\t" else c for c in text)
    return "".join(_VISIBLE.get(c, c) for c in text)


__all__ = [
    "Cutoff",
    "StrategyRow",
    "cutoffs",
    "distinct_n",
    "next_token_probs",
    "perplexity_of",
    "repetition_rate",
    "run_strategies",
    "sequence_logprob",
    "tempered",
    "visible",
]
