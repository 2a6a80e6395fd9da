"""One proposer at one γ against plain greedy: α and c measured in the same run as the speed-up, the
formula beside the stopwatch; the γ sweep, its table, its plot and its best row.

Every speed-up is against the same engine's plain ``generate`` on the same prompts, timed in the same
rounds (a burst of load slows both), and every run checks that greedy output is token-identical. At
batch 1 both sides are bandwidth- or overhead-bound decode steps, which is why verifying γ drafts
costs about one step. The decoder is ``course_lib.engine.speculative``; this module only times and counts.

    base = baseline(target, GROUNDED_PROMPTS[:1], new_tokens=48)
    rows = gamma_sweep(target, lambda: DraftProposer(Engine("tiny-draft")), base, [1, 2, 4])
    rows[0].alpha, rows[0].c, rows[0].speedup, rows[0].predicted

Introduced in 04_decoding.ipynb; the speed goals are ``benchmarks/speculative.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative.theory import expected_speedup
from course_lib.engine.speculative.verifier import SpeculativeDecoder


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """The smallest wall time of ``repeats`` calls of ``fn`` (the least disturbed run), in seconds:
    ``bench.benchmark``'s best sample, without warm-up (the callers warm up themselves)."""
    from course_lib.measure.bench import benchmark

    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be an int ≥ 1, got {repeats!r}")
    return benchmark(fn, warmup=0, repeats=repeats, label="best of").best_s


def encode_prompts(target, prompts) -> list[list[int]]:
    """``prompts`` (a non-empty list of strings or token-id lists) as the target's token ids."""
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings or token-id lists")
    return target.encode(list(prompts))


def _new_tokens(n) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ValueError(f"new_tokens must be an int ≥ 2, got {n!r}")
    return n


@dataclass
class SpecRow:
    """One proposer at one γ, batch of prompts, greedy: what was counted and what was timed."""

    method: str
    gamma: int
    batch: int
    new_tokens: int
    alpha: float  # accepted / examined: the formula's α
    effective_alpha: float  # the α whose E(α, γ) equals the measured tokens per forward
    acceptance_at: list[float]  # per draft position, given the earlier ones were accepted
    tokens_per_forward: float
    c: float  # proposer seconds per draft token / seconds per verify forward
    verify_over_plain: float  # one verify forward / one plain decode step (the formula assumes 1)
    seconds: float
    plain_seconds: float
    identical: bool  # greedy output token-identical to plain greedy
    mean_drafts: float = math.nan  # drafts proposed per step (< γ when a proposer finds nothing)
    expected_as_proposed: float = math.nan  # E(α, k) averaged over the k actually proposed at each step
    round_speedups: tuple = ()  # plain ÷ speculative in each timing round (same round, back to back)

    @property
    def spread(self) -> float:
        """The speed-up's relative run-to-run spread over the timing rounds (0.1 = ±10%); nan with one round."""
        from course_lib.measure.claims import relative_spread

        return relative_spread(self.round_speedups) if len(self.round_speedups) >= 2 else math.nan

    @property
    def speedup(self) -> float:
        """Measured wall-clock speed-up over the engine's plain greedy ``generate``."""
        return self.plain_seconds / self.seconds

    @property
    def predicted(self) -> float:
        """The textbook formula (1 − α^(γ+1)) / ((1 − α)(γc + 1)) with α and c from this run."""
        if not (self.alpha == self.alpha and self.c == self.c):
            return math.nan
        return expected_speedup(min(max(self.alpha, 0.0), 1.0), self.gamma, max(self.c, 0.0))

    @property
    def predicted_refined(self) -> float:
        """The formula with the two things it assumes away measured instead: the drafts actually proposed
        per step (not always γ) and a verify forward that costs ``verify_over_plain`` plain steps."""
        e = self.expected_as_proposed
        if not (e == e and self.c == self.c and self.mean_drafts == self.mean_drafts):
            return math.nan
        return e / ((self.mean_drafts * max(self.c, 0.0) + 1.0) * self.verify_over_plain)

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(
            speedup=self.speedup,
            predicted=self.predicted,
            predicted_refined=self.predicted_refined,
            spread=self.spread,
            round_speedups=list(self.round_speedups),
        )
        return d


@dataclass
class Baseline:
    """Plain greedy on the same prompts: the reference output and the time to beat."""

    ids: list[list[int]]
    params: SamplingParams
    outputs: list[list[int]]
    seconds: float
    step_seconds: float  # one plain decode step (seconds / new tokens)


def baseline(target, prompts, new_tokens: int = 48, repeats: int = 3, ignore_eos: bool = True) -> Baseline:
    """Time the engine's plain greedy ``generate`` on ``prompts`` (strings or ids), ``new_tokens`` each
    (``ignore_eos=False``: a chat answer stops at its end-of-turn token, and a step is the longest row's)."""
    ids = encode_prompts(target, prompts)
    if not isinstance(ignore_eos, bool):
        raise ValueError(f"ignore_eos must be a bool, got {ignore_eos!r}")
    params = SamplingParams(max_new_tokens=_new_tokens(new_tokens), ignore_eos=ignore_eos)
    outputs = [r.output_ids for r in target.generate(ids, params)]  # also the warm-up
    seconds = best_of(lambda: target.generate(ids, params), repeats)
    return Baseline(ids, params, outputs, seconds, seconds / _steps(outputs))


def _steps(outputs: list[list[int]]) -> int:
    """Decode steps a batch took: its longest row's tokens."""
    return max(1, max(len(o) for o in outputs))


def run_method(target, proposer, gamma: int, base: Baseline, method: str = "", repeats: int = 3) -> SpecRow:
    """Speculative greedy decoding of ``base``'s prompts with ``proposer`` at ``gamma``: the counters of
    one run, then ``repeats`` rounds that each time plain greedy and then speculative decoding, back to
    back; the best of each is kept. Timing both in the same rounds means a burst of load from another
    program slows both, instead of making one of them look faster."""
    dec = SpeculativeDecoder(target, proposer, gamma)
    res = dec.generate(base.ids, base.params)
    s = res.stats
    identical = [r.output_ids for r in res] == base.outputs
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be an int ≥ 1, got {repeats!r}")
    plain, seconds, rounds = math.inf, math.inf, []
    for _ in range(repeats):
        p_i = best_of(lambda: target.generate(base.ids, base.params), 1)
        s_i = best_of(lambda: dec.generate(base.ids, base.params), 1)
        plain, seconds = min(plain, p_i), min(seconds, s_i)
        rounds.append(p_i / s_i)
    step_seconds = plain / _steps(base.outputs)
    steps = max(s.target_forwards - 1, 1)
    return SpecRow(
        method=method or type(proposer).__name__,
        gamma=gamma,
        batch=len(base.ids),
        new_tokens=base.params.max_new_tokens,
        alpha=s.acceptance_rate,
        effective_alpha=s.effective_alpha,
        acceptance_at=s.acceptance_at,
        tokens_per_forward=s.tokens_per_forward,
        c=s.cost_ratio,
        verify_over_plain=s.verify_time / step_seconds if s.verify_time == s.verify_time else math.nan,
        seconds=seconds,
        plain_seconds=plain,
        identical=identical,
        mean_drafts=s.proposed / (steps * len(base.ids)) if s.proposed else 0.0,
        expected_as_proposed=s.expected_tokens_as_proposed(),
        round_speedups=tuple(rounds),
    )


def gamma_sweep(
    target, make_proposer: Callable[[], object], base: Baseline, gammas: Sequence[int], method: str = "", repeats=3
) -> list[SpecRow]:
    """``run_method`` for each γ, with a fresh proposer each time (no state carried between runs)."""
    if not gammas:
        raise ValueError("gammas must be a non-empty list of ints ≥ 1")
    return [run_method(target, make_proposer(), g, base, method, repeats) for g in gammas]


def best_row(rows: Sequence[SpecRow]) -> SpecRow:
    """The row with the highest measured speed-up."""
    return max(rows, key=lambda r: r.speedup)


def table(rows: Sequence[SpecRow]) -> str:
    """The rows as a fixed-width text table."""
    head = (
        f"{'method':<24}{'γ':>3}{'α':>6}{'tok/fwd':>8}{'c':>7}{'verify/plain':>13}"
        f"{'measured':>10}{'±':>6}{'formula':>9}{'refined':>9}{'same':>6}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.method:<24}{r.gamma:>3}{r.alpha:>6.2f}{r.tokens_per_forward:>8.2f}{r.c:>7.3f}"
            f"{r.verify_over_plain:>13.2f}{r.speedup:>9.2f}x{_pct(r.spread):>6}{r.predicted:>8.2f}x{r.predicted_refined:>8.2f}x"
            f"{('yes' if r.identical else 'NO'):>6}"
        )
    return "\n".join(lines)


def _pct(x: float) -> str:
    return f"{x:.0%}" if x == x else "–"


def near_best(rows: Sequence[SpecRow]) -> list[int]:
    """The γs this run cannot tell from the best: those whose speed-up interval, ± its run-to-run spread,
    overlaps the best row's. One γ means the best is clear; several mean "best γ" is a pick among noise
    (the winner's curse), and the formula's best γ should be judged against the whole set."""
    if not rows:
        raise ValueError("rows must be a non-empty list of SpecRow")
    b = best_row(rows)

    def lo_hi(r):
        s = r.spread if r.spread == r.spread else 0.0
        return r.speedup * (1 - s), r.speedup * (1 + s)

    b_lo = lo_hi(b)[0]
    return sorted({r.gamma for r in rows if lo_hi(r)[1] >= b_lo})


def plot_gamma_sweep(rows: Sequence[SpecRow], ax=None, title: str = ""):
    """Measured speed-up vs γ for each method, with the formula (α, c of each row) as lines."""
    from course_lib.measure.plots import new_axes

    fig, ax = new_axes(ax)
    methods = list(dict.fromkeys(r.method for r in rows))
    for i, m in enumerate(methods):
        rs = sorted((r for r in rows if r.method == m), key=lambda r: r.gamma)
        color = f"C{i}"
        err = [r.speedup * (r.spread if r.spread == r.spread else 0.0) for r in rs]
        ax.errorbar(
            [r.gamma for r in rs],
            [r.speedup for r in rs],
            yerr=err,
            fmt="o-",
            color=color,
            capsize=3,
            label=f"{m}: measured (± run-to-run spread)",
        )
        ax.plot([r.gamma for r in rs], [r.predicted for r in rs], "x--", color=color, alpha=0.7, label=f"{m}: formula")
        b = best_row(rs)
        ax.annotate("best", (b.gamma, b.speedup), textcoords="offset points", xytext=(4, 6), color=color)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("γ (draft tokens per step)")
    ax.set_ylabel("speed-up over plain greedy (×)")
    ax.set_title(title or "speculative decoding: measured vs formula")
    ax.legend(fontsize=7)
    return fig, ax
