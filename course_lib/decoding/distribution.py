"""Sampling mode, checked by counting: the first sampled token over many seeds, speculative vs plain.

The rejection rule promises that speculative sampling follows the target's p exactly. Draw the first
token n times each way and compare both histograms with p by total-variation distance; the noise
floor of n samples says how close "the same" can look. One batched run per side, no timing.
Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative.verifier import SpeculativeDecoder


@dataclass
class FirstTokenCheck:
    """The first sampled token over many seeds: speculative vs plain sampling vs the target's p."""

    p: torch.Tensor  # (V,) the target's distribution (after temperature)
    spec_counts: torch.Tensor  # (V,)
    plain_counts: torch.Tensor  # (V,)

    @staticmethod
    def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
        return 0.5 * float((counts / counts.sum() - p).abs().sum())

    @property
    def tv_spec(self) -> float:
        """Total-variation distance between the speculative samples' histogram and p."""
        return self._tv(self.spec_counts, self.p)

    @property
    def tv_noise(self) -> float:
        """The distance expected from sampling noise alone with this many samples: E|X/n − p| summed, with
        the normal approximation (an over-estimate for tokens with n·p ≪ 1, where it is capped at 2p)."""
        n = float(self.spec_counts.sum())
        p = self.p.double()
        per_token = torch.minimum(torch.sqrt(2 * p * (1 - p) / (math.pi * n)), 2 * p)
        return 0.5 * float(per_token.sum())

    @property
    def tv_plain(self) -> float:
        """The same for plain sampling: the noise floor of ``n`` samples."""
        return self._tv(self.plain_counts, self.p)


@torch.inference_mode()
def first_token_check(target, proposer, prompt: str, n: int = 400, temperature: float = 1.0, gamma: int = 3):
    """Sample the first token ``n`` times (one seed per row, all rows in one batch) with speculative
    decoding and with the plain engine, and compare both histograms with the target's own distribution.
    The rejection rule promises the same distribution: the two distances should be alike."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 10:
        raise ValueError(f"n must be an int ≥ 10, got {n!r}")
    ids = target.encode([prompt])[0]
    plist = [
        SamplingParams(temperature=temperature, max_new_tokens=gamma + 1, seed=i, ignore_eos=True) for i in range(n)
    ]
    dec, spec = SpeculativeDecoder(target, proposer, gamma), []
    for a in range(0, n, 32):  # 32 rows at a time: the KV caches hold a bounded number of sequences
        spec += list(dec.generate([ids] * len(plist[a : a + 32]), plist[a : a + 32]))
    plain = target.generate(
        [ids] * n, [SamplingParams(temperature=temperature, max_new_tokens=1, seed=10_000 + i) for i in range(n)]
    )
    V = target.model.vocab_size
    logits = target.model.dense_logits(torch.tensor([ids], device=target.device))[0, -1].float()
    p = torch.softmax(logits / temperature, dim=-1).cpu()
    sc = torch.bincount(torch.tensor([r.output_ids[0] for r in spec]), minlength=V).float()
    pc = torch.bincount(torch.tensor([r.output_ids[0] for r in plain]), minlength=V).float()
    return FirstTokenCheck(p, sc, pc)
