"""What a speculative run counted: ``SpecStats`` (all rows), ``SpeculativeResult`` (one row), the output.

The counters are the measured side of the formula in ``theory``: α is accepted / *judged* drafts (the
maximum-likelihood α of the i.i.d. model), tokens per forward is what E(α, γ) predicts, and the
proposer's and the target's seconds give c. Bookkeeping only, no tensors. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from course_lib.engine.speculative.theory import alpha_from_tokens, expected_tokens


@dataclass
class SpecStats:
    """Counters of one ``generate`` call (all rows together)."""

    gamma: int
    target_forwards: int = 0
    row_steps: int = 0  # Σ over target forwards of the rows in it
    generated: int = 0  # tokens emitted (all rows)
    proposed: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted
    examined: int = 0  # draft tokens the target actually judged: up to and including the first rejection
    proposed_at: list[int] = field(default_factory=list)  # [j-1]: drafts proposed at position j (1..γ)
    examined_at: list[int] = field(default_factory=list)  # [j-1]: drafts judged at position j (all before accepted)
    accepted_at: list[int] = field(default_factory=list)  # [j-1]: drafts accepted at position j
    proposer_time: float = 0.0  # seconds in the proposer
    target_time: float = 0.0  # seconds in target forwards (+ acceptance), the first (prefill) one included
    first_forward_time: float = 0.0  # the first target forward, which also prefills the prompts
    history: list[list[int | None]] = field(default_factory=list)  # per step, per row: drafts accepted (None: done)
    drafts_per_row_step: list[int] = field(default_factory=list)  # k of every row at every step (≤ γ; 0: none)

    def __post_init__(self) -> None:
        self.proposed_at = self.proposed_at or [0] * self.gamma
        self.examined_at = self.examined_at or [0] * self.gamma
        self.accepted_at = self.accepted_at or [0] * self.gamma

    def record_step(self, result: SpeculativeResult, k: int, n: int) -> None:
        """Book one row-step that offered ``k`` drafts (positions 1..k) and accepted the first ``n``: the
        target judged drafts 1..min(n + 1, k), up to and including the first rejection."""
        self.proposed += k
        self.accepted += n
        self.drafts_per_row_step.append(k)
        self.examined += min(n + 1, k)
        for j in range(k):
            self.proposed_at[j] += 1
        for j in range(min(n + 1, k)):
            self.examined_at[j] += 1
        for j in range(n):
            self.accepted_at[j] += 1
        result.proposed += k
        result.accepted += n
        result.accepted_per_step.append(n)

    @property
    def acceptance_rate(self) -> float:
        """α, the chance that the target accepts a draft token it looks at: accepted / examined. Drafts
        after the first rejection are never judged, so they do not count (dividing by *proposed* would
        give (α + α² + … + α^γ)/γ, not α, and make the formula under-predict). This is the maximum-
        likelihood α of the i.i.d. model behind E = (1 − α^(γ+1))/(1 − α). nan when nothing was judged."""
        return self.accepted / self.examined if self.examined else math.nan

    @property
    def accepted_fraction(self) -> float:
        """accepted / proposed: the share of the draft's work that was kept (its cost, not its α)."""
        return self.accepted / self.proposed if self.proposed else math.nan

    @property
    def acceptance_at(self) -> list[float]:
        """Per draft position j = 1..γ: the chance draft j is accepted given drafts 1..j−1 were (the
        i.i.d. model says α at every j; a rising curve means acceptances come in runs)."""
        return [a / e if e else math.nan for a, e in zip(self.accepted_at, self.examined_at)]

    def expected_tokens_as_proposed(self, alpha: float | None = None) -> float:
        """E(α, k) averaged over the drafts actually proposed at every row-step (k = 0 gives 1 token):
        the formula's tokens per forward when a proposer does not always offer γ drafts."""
        a = self.acceptance_rate if alpha is None else alpha
        ks = self.drafts_per_row_step
        if not ks or not a == a:
            return math.nan
        a = min(max(a, 0.0), 1.0)
        return sum(expected_tokens(a, k) if k > 0 else 1.0 for k in ks) / len(ks)

    @property
    def effective_alpha(self) -> float:
        """The α for which the formula's E(α, γ) equals the measured tokens per forward (bisection)."""
        return alpha_from_tokens(self.tokens_per_forward, self.gamma)  # nan when no row-step was made

    @property
    def tokens_per_forward(self) -> float:
        """Tokens a row gains per target forward (1 for plain decoding; γ + 1 at most)."""
        return self.generated / self.row_steps if self.row_steps else math.nan

    @property
    def verify_time(self) -> float:
        """Mean seconds of one target forward after the first (the decode-time verify step)."""
        n = self.target_forwards - 1
        return (self.target_time - self.first_forward_time) / n if n > 0 else math.nan

    @property
    def cost_ratio(self) -> float:
        """c: proposer seconds per draft token / seconds per target verify forward."""
        if not self.proposed or not self.verify_time > 0:
            return math.nan
        return (self.proposer_time / self.proposed) / self.verify_time


@dataclass
class SpeculativeResult:
    prompt_ids: list[int]
    output_ids: list[int]  # generated ids; ends with EOS when finish_reason == "eos"
    finish_reason: str  # "eos" or "length"
    proposed: int = 0
    accepted: int = 0
    accepted_per_step: list[int] = field(default_factory=list)  # drafts accepted at each of this row's steps
    kv_length: int | None = None  # the target KV handle's length just before it was freed
    draft_kv_length: int | None = None  # the draft's (DraftProposer only), after its final rollback


@dataclass
class SpeculativeOutput:
    results: list[SpeculativeResult]
    stats: SpecStats

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> SpeculativeResult:
        return self.results[i]

    def __iter__(self):
        return iter(self.results)
