"""Speculative decoding in sampling mode: a timed run, and the identity α = 1 − TV(p, q) measured.

Every other timing in chapter 04 is greedy. ``sampled_run`` times speculative vs plain *sampling* on one
prompt (same temperature, same seed policy, back to back in the same rounds); its output is checked in
distribution by ``distribution.first_token_check`` with the same proposer, γ and temperature (sampled
output cannot be compared token for token).

The rejection rule accepts a draft x ~ q with probability min(1, p(x)/q(x)), so the chance of accepting
the first draft at a context is Σ_x q(x)·min(1, p(x)/q(x)) = Σ_x min(p(x), q(x)) = 1 − TV(p, q) (Leviathan
et al. 2023, their β). ``alpha_tv_identity`` checks it on the engine: it runs speculative sampling over many
seeds, recovers the context at which every step judged its first draft, computes 1 − TV(p, q) there with
both models' own logits (teacher forcing), and compares the number of first drafts accepted with the sum
of those probabilities, in standard deviations of a sum of Bernoulli trials. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative.verifier import SpeculativeDecoder


@dataclass(frozen=True)
class SampledRun:
    temperature: float
    gamma: int
    plain_seconds: float  # best of the rounds
    seconds: float
    round_speedups: tuple
    alpha: float
    tokens_per_forward: float

    @property
    def speedup(self) -> float:
        return self.plain_seconds / self.seconds

    @property
    def spread(self) -> float:
        from course_lib.measure.claims import relative_spread

        return relative_spread(self.round_speedups) if len(self.round_speedups) >= 2 else math.nan


def _check(name: str, value, low: float = 0.0, kind=int):
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value <= low:
        raise ValueError(f"{name} must be {'a number' if kind is float else 'an int'} > {low:g}, got {value!r}")
    return value


def sampled_run(target, proposer, gamma: int, prompt: str, temperature: float = 1.0, new_tokens: int = 48, repeats=3):
    """Speculative vs plain sampling (seed 0, ``new_tokens`` each, batch 1): the best of ``repeats`` rounds."""
    from course_lib.decoding.speedup import best_of

    _check("gamma", gamma)
    _check("temperature", temperature, kind=float)
    _check("new_tokens", new_tokens, 1)
    _check("repeats", repeats)
    ids = target.encode([prompt])
    params = SamplingParams(temperature=temperature, max_new_tokens=new_tokens, seed=0, ignore_eos=True)
    dec = SpeculativeDecoder(target, proposer, gamma)
    s = dec.generate(ids, params).stats  # also the warm-up
    target.generate(ids, params)
    plain, spec, rounds = math.inf, math.inf, []
    for _ in range(repeats):
        p_i = best_of(lambda: target.generate(ids, params), 1)
        s_i = best_of(lambda: dec.generate(ids, params), 1)
        plain, spec = min(plain, p_i), min(spec, s_i)
        rounds.append(p_i / s_i)
    return SampledRun(temperature, gamma, plain, spec, tuple(rounds), s.acceptance_rate, s.tokens_per_forward)


@dataclass(frozen=True)
class Identity:
    """First drafts judged and accepted, against Σ (1 − TV(p, q)) over the same contexts."""

    judged: int
    accepted: int
    expected: float  # Σ over judged contexts of 1 − TV(p, q)
    variance: float  # Σ o(1 − o): the variance of the accepted count if each acceptance is Bernoulli(o)

    @property
    def measured_alpha(self) -> float:
        return self.accepted / self.judged

    @property
    def predicted_alpha(self) -> float:
        return self.expected / self.judged

    @property
    def z(self) -> float:
        """(accepted − expected) / standard deviation: |z| ≲ 3 if the identity holds."""
        return (self.accepted - self.expected) / math.sqrt(max(self.variance, 1e-12))


@torch.inference_mode()
def overlap(target, draft, seq: list[int], positions: list[int], temperature: float) -> torch.Tensor:
    """1 − TV(p, q) = Σ min(p, q) for the token at each of ``positions`` of ``seq`` (teacher forcing)."""
    x = torch.tensor([seq])
    lp = target.model.dense_logits(x.to(target.device))[0].float().cpu()
    lq = draft.model.dense_logits(x.to(draft.device))[0].float().cpu()
    idx = torch.tensor(positions) - 1  # the logits at position i − 1 predict the token at i
    p = torch.softmax(lp[idx] / temperature, dim=-1)
    q = torch.softmax(lq[idx] / temperature, dim=-1)
    return torch.minimum(p, q).sum(-1)


def alpha_tv_identity(target, draft, prompt: str, gamma: int = 3, temperature: float = 1.0, rows=16, new_tokens=32):
    """Speculative sampling with ``draft`` (an Engine) over ``rows`` seeds; each step's first draft, judged
    at a context the run recorded, against 1 − TV(p, q) at that context. The last two steps of each row are
    left out (near ``new_tokens`` a step may offer fewer drafts)."""
    from course_lib.engine.speculative import DraftProposer

    _check("gamma", gamma)
    _check("temperature", temperature, kind=float)
    _check("rows", rows)
    _check("new_tokens", new_tokens, 3)
    ids = target.encode([prompt])[0]
    dec = SpeculativeDecoder(target, DraftProposer(draft), gamma)
    judged = accepted = 0
    expected = variance = 0.0
    for a in range(0, rows, 16):  # 16 rows at a time: bounded KV rows
        n_rows = min(16, rows - a)
        plist = [
            SamplingParams(temperature=temperature, max_new_tokens=new_tokens, seed=100 + a + i, ignore_eos=True)
            for i in range(n_rows)
        ]
        for r in dec.generate([ids] * n_rows, plist):
            pos, starts = len(ids), []
            for n in r.accepted_per_step[:-2]:
                starts.append(pos)
                accepted += n >= 1
                pos += n + 1
            if not starts:
                continue
            o = overlap(target, draft, ids + list(r.output_ids), starts, temperature)
            judged += len(starts)
            expected += float(o.sum())
            variance += float((o * (1 - o)).sum())
    if judged == 0:
        raise ValueError("no step judged a first draft: raise new_tokens or rows")
    return Identity(judged, accepted, expected, variance)
