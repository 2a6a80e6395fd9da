"""Per-request sampling, vectorised across the batch: each row has its own params and its own generator.

``sampling.py`` holds the reference functions (one ``SamplingParams`` for a whole batch, spelled out
step by step). The engine batches sequences that each carry different params, so the sampler turns the
per-row temperature, top-k, top-p and min-p into (B, 1) tensors and applies each filter to all rows in
one pass; penalties use the reference function row by row (they need that row's token counts).
Draws use the exponential race, ``argmax(p / E)`` with ``E ~ Exp(1)``, which picks token i with
probability p_i (as vLLM does): each seeded row draws its ``E`` from its own generator, so a row gives
the same tokens whatever else is in the batch. ``return_probs`` also returns the distribution each
token was drawn from, which chapter 04's speculative rejection rule needs. Before the penalties come
a structured request's grammar mask (``structured.py``), OpenAI's ``logit_bias`` (added to the logits) and
vLLM's ``min_tokens`` (EOS masked until that many tokens
are out); rows with ``params.logprobs`` set also get the log-probability of their token and of the top
``logprobs`` alternatives, taken from the raw logits before any of these steps (vLLM's default, "raw
logprobs"): what the model believed, not what the filters left. Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.engine.sampling import SamplingParams, apply_penalties
from course_lib.engine.structured import mask_rows


def is_penalised(params: SamplingParams) -> bool:
    return params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0


def token_counts(ids: list[int], vocab_size: int, device) -> torch.Tensor:
    """(1, V) int64 occurrence counts of ``ids``."""
    counts = torch.zeros(1, vocab_size, dtype=torch.int64, device=device)
    if ids:
        counts[0].index_add_(
            0, torch.tensor(ids, device=device), torch.ones(len(ids), dtype=torch.int64, device=device)
        )
    return counts


@dataclass
class SamplerOutput:
    ids: torch.Tensor  # (B,) int64, the next token of each row
    probs: torch.Tensor | None = None  # (B, V) fp32: what each row drew from (one-hot for greedy rows)
    # per row: None, or (log-prob of the drawn token, ((token id, log-prob), ...) of the top params.logprobs)
    logprobs: list | None = None


def _row_tensor(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]  # (S, 1)


def filter_rows(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature → top-k → top-p → min-p with per-row values, all rows at once. (S, V) fp32 → (S, V).

    Row for row, this equals ``sampling.process_logits`` after penalties (a test checks it exactly)."""
    V = logits.shape[-1]
    x = logits / _row_tensor([p.temperature for p in params], logits)
    ks = [p.top_k if 0 < p.top_k < V else V for p in params]
    if any(k < V for k in ks):
        desc = x.sort(dim=-1, descending=True).values  # (S, V)
        kth = desc.gather(-1, torch.tensor(ks, device=x.device)[:, None] - 1)  # (S, 1) the k-th largest
        x = x.masked_fill(x < kth, -math.inf)
    ps = [p.top_p for p in params]
    if any(p < 1 for p in ps):
        asc = x.sort(dim=-1, stable=True).values  # (S, V) ascending
        tail_mass = asc.softmax(dim=-1).cumsum(dim=-1)  # mass of this token and every less likely one
        p = _row_tensor(ps, x)
        n_drop = (tail_mass <= 1 - p).sum(dim=-1, keepdim=True).clamp(max=V - 1)  # (S, 1)
        n_drop = torch.where(p >= 1, torch.zeros_like(n_drop), n_drop)  # top_p = 1: off for that row
        x = x.masked_fill(x < asc.gather(-1, n_drop), -math.inf)
    mins = [p.min_p for p in params]
    if any(m > 0 for m in mins):
        probs = x.softmax(dim=-1)
        x = x.masked_fill(probs < _row_tensor(mins, x) * probs.amax(dim=-1, keepdim=True), -math.inf)
    return x


def bias_rows(logits: torch.Tensor, seqs: list, eos_ids) -> torch.Tensor:
    """``logit_bias`` added, and EOS masked for rows still short of ``min_tokens``; (B, V) fp32 → (B, V)."""
    out = logits
    for b, s in enumerate(seqs):
        p = s.params
        short = p.min_tokens and not p.ignore_eos and eos_ids and s.num_output_tokens < p.min_tokens
        if not (p.logit_bias or short):
            continue
        if out is logits:
            out = logits.clone()
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias], device=out.device)
            out[b, ids] += torch.tensor([v for _, v in p.logit_bias], dtype=out.dtype, device=out.device)
        if short:
            out[b, list(eos_ids)] = -math.inf
    return out


def logprob_rows(raw: torch.Tensor, ids: torch.Tensor, params: list[SamplingParams]) -> list | None:
    """(log-prob of ``ids[b]``, top ``params[b].logprobs`` (id, log-prob) pairs) per row that asks, from ``raw``."""
    rows = [b for b, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return None
    idx = torch.tensor(rows, device=raw.device)
    logp = torch.log_softmax(raw[idx], dim=-1)  # (R, V)
    chosen = logp.gather(1, ids[idx][:, None])[:, 0].tolist()  # (R,)
    k = max(params[b].logprobs for b in rows)
    top = logp.topk(k, dim=-1) if k else None  # (R, k) values and ids, most likely first
    tv, ti = (top.values.tolist(), top.indices.tolist()) if k else ([[]] * len(rows), [[]] * len(rows))
    out: list = [None] * len(params)
    for r, b in enumerate(rows):
        kb = params[b].logprobs
        out[b] = (chosen[r], tuple(zip(ti[r][:kb], tv[r][:kb])))
    return out


class Sampler:
    """``sampler(logits (B, V), seqs)`` → ``SamplerOutput``; row b follows ``seqs[b].params`` and generator.
    ``eos_ids``: the tokens ``min_tokens`` masks (the engine passes its own)."""

    def __init__(self, eos_ids=()) -> None:
        self.eos_ids = tuple(eos_ids)

    def __call__(self, logits: torch.Tensor, seqs: list, return_probs: bool = False) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != len(seqs):
            raise ValueError(f"logits must be (B, V) with B = len(seqs) = {len(seqs)}, got {tuple(logits.shape)}")
        params = [s.params for s in seqs]
        raw = logits = logits.float()
        logits = bias_rows(mask_rows(logits, seqs), seqs, self.eos_ids)  # grammar first, then bias and min_tokens
        penalised = [b for b, p in enumerate(params) if is_penalised(p)]
        if penalised:
            logits = logits.clone() if logits is raw else logits
            V = logits.shape[-1]
            for b in penalised:
                s = seqs[b]
                logits[b] = apply_penalties(
                    logits[b : b + 1],
                    params[b],
                    token_counts(s.prompt_ids, V, logits.device),
                    token_counts(s.output_ids, V, logits.device),
                )[0]
        ids = logits.argmax(dim=-1)  # (B,) greedy rows: the first index among ties, as torch.argmax
        sampled = [b for b, p in enumerate(params) if not p.greedy]
        probs = None
        if return_probs:
            probs = torch.zeros_like(logits).scatter_(1, ids[:, None], 1.0)  # one-hot for greedy rows
        if not sampled:
            return SamplerOutput(ids, probs, logprob_rows(raw, ids, params))
        rows = torch.tensor(sampled, device=logits.device)
        p = filter_rows(logits[rows], [params[b] for b in sampled]).softmax(dim=-1)  # (S, V)
        race = torch.empty_like(p)
        unseeded = [i for i, b in enumerate(sampled) if seqs[b].generator is None]
        if unseeded:
            race[unseeded] = torch.empty(len(unseeded), p.shape[1], device=p.device).exponential_()
        for i, b in enumerate(sampled):
            if seqs[b].generator is not None:  # its own stream: batch-independent
                race[i].exponential_(generator=seqs[b].generator)
        ids[rows] = (p / race).argmax(dim=-1)  # token i wins with probability p_i
        if probs is not None:
            probs[rows] = p
        return SamplerOutput(ids, probs, logprob_rows(raw, ids, params))
