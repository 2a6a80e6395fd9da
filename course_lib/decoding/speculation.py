"""Chapter 04's measurements of speculative decoding: what a verify forward costs, α and c measured in
the same run as the speed-up, the formula beside the stopwatch, acceptance by kind of text, the batch
size where it stops paying, and ``transformers``' assisted generation on the same models.

The decoder itself is ``engine.speculative`` (and ``engine.medusa`` / ``engine.jacobi`` for the
draft-free proposers); this module only times and counts. Every speed-up is against the same engine's
plain ``generate`` on the same prompts, and every run checks that greedy output is token-identical.

    rows = gamma_sweep(target, lambda: DraftProposer(Engine("tiny-draft")), ids, [1, 2, 4], new_tokens=48)
    rows[0].alpha, rows[0].c, rows[0].speedup, rows[0].predicted

Introduced in 04_decoding.ipynb; the speed goals are ``benchmarks/speculative.py``.
"""

from __future__ import annotations

import io
import math
import tokenize
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from course_lib.engine.sampling import SamplingParams
from course_lib.engine.speculative import SpeculativeDecoder, best_gamma, expected_speedup, expected_tokens
from course_lib.measure.plots import DPI, FIGSIZE, as_outputs

# Prompts. "grounded": the answer copies the prompt (continue or edit code that is in the context), the
# case prompt lookup is made for; "free": nothing to copy from.
GROUNDED_PROMPTS = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n\n\n"
    "class Size:\n    def __init__(self, width, height):",
    "import os\nimport sys\n\n\ndef read_file(path):\n    with open(path) as f:\n        return f.read()\n\n\n"
    "def write_file(path, text):",
]
FREE_PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):", "import json\n\n\ndef load(path):"]


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """The smallest wall time of ``repeats`` calls of ``fn`` (the least disturbed run), in seconds:
    ``bench.benchmark``'s best sample, without warm-up (the callers warm up themselves)."""
    from course_lib.measure.bench import benchmark

    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be an int ≥ 1, got {repeats!r}")
    return benchmark(fn, warmup=0, repeats=repeats, label="best of").best_s


def _ids(target, prompts) -> list[list[int]]:
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings or token-id lists")
    return target.encode(list(prompts))


def _new_tokens(n) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ValueError(f"new_tokens must be an int ≥ 2, got {n!r}")
    return n


# ---------------------------------------------------------------------------------------------- verify cost
@dataclass(frozen=True)
class VerifyCost:
    tokens: int  # new tokens in the forward (1 = a plain decode step; γ + 1 = a verify step)
    seconds: float  # one target forward, batch 1, after ``context`` cached tokens


@torch.inference_mode()
def verify_cost(target, context: int = 64, tokens: Sequence[int] = (1, 2, 3, 5, 9, 17), repeats: int = 5):
    """Time one forward of the target over k new tokens after ``context`` cached ones, for each k: the
    price of verifying k − 1 drafts. On a bandwidth- or overhead-bound machine it hardly grows with k."""
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        raise ValueError(f"context must be an int ≥ 1, got {context!r}")
    ks = list(tokens)
    if not ks or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in ks):
        raise ValueError(f"tokens must be a non-empty list of ints ≥ 1, got {tokens!r}")
    if context + max(ks) > target.backend.max_tokens_per_seq():
        raise ValueError(f"context + max(tokens) = {context + max(ks)} does not fit the target's KV")
    kv, model, dev = target.backend, target.model, target.device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (context + max(ks),), generator=gen).to(dev)
    h = kv.allocate()
    try:
        kv.append(h, context)
        pos = torch.arange(context, device=dev)
        model(ids[:context], pos, kv.prepare([h], [context], pos), kv, logits_indices=torch.tensor([context - 1]))
        out = []
        for k in ks:

            def step(k=k):
                kv.append(h, k)
                p = torch.arange(context, context + k, device=dev)
                model(ids[context : context + k], p, kv.prepare([h], [k], p), kv)  # logits at all k positions
                kv.truncate(h, context)

            step()  # warm-up
            out.append(VerifyCost(k, best_of(step, repeats)))
        return out
    finally:
        kv.free(h)


# ---------------------------------------------------------------------------------------------- one method, γ sweep
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
        d.update(speedup=self.speedup, predicted=self.predicted, predicted_refined=self.predicted_refined)
        return d


@dataclass
class Baseline:
    """Plain greedy on the same prompts: the reference output and the time to beat."""

    ids: list[list[int]]
    params: SamplingParams
    outputs: list[list[int]]
    seconds: float
    step_seconds: float  # one plain decode step (seconds / new tokens)


def baseline(target, prompts, new_tokens: int = 48, repeats: int = 3) -> Baseline:
    """Time the engine's plain greedy ``generate`` on ``prompts`` (strings or ids), ``new_tokens`` each."""
    ids = _ids(target, prompts)
    params = SamplingParams(max_new_tokens=_new_tokens(new_tokens), ignore_eos=True)
    outputs = [r.output_ids for r in target.generate(ids, params)]  # also the warm-up
    seconds = best_of(lambda: target.generate(ids, params), repeats)
    return Baseline(ids, params, outputs, seconds, seconds / new_tokens)


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
    plain, seconds = math.inf, math.inf
    for _ in range(repeats):
        plain = min(plain, best_of(lambda: target.generate(base.ids, base.params), 1))
        seconds = min(seconds, best_of(lambda: dec.generate(base.ids, base.params), 1))
    step_seconds = plain / base.params.max_new_tokens
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
        f"{'measured':>10}{'formula':>9}{'refined':>9}{'same':>6}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.method:<24}{r.gamma:>3}{r.alpha:>6.2f}{r.tokens_per_forward:>8.2f}{r.c:>7.3f}"
            f"{r.verify_over_plain:>13.2f}{r.speedup:>9.2f}x{r.predicted:>8.2f}x{r.predicted_refined:>8.2f}x"
            f"{('yes' if r.identical else 'NO'):>6}"
        )
    return "\n".join(lines)


def plot_gamma_sweep(rows: Sequence[SpecRow], ax=None, title: str = ""):
    """Measured speed-up vs γ for each method, with the formula (α, c of each row) as lines."""
    from course_lib.measure.plots import new_axes

    fig, ax = new_axes(ax)
    methods = list(dict.fromkeys(r.method for r in rows))
    for i, m in enumerate(methods):
        rs = sorted((r for r in rows if r.method == m), key=lambda r: r.gamma)
        color = f"C{i}"
        ax.plot([r.gamma for r in rs], [r.speedup for r in rs], "o-", color=color, label=f"{m}: measured")
        ax.plot([r.gamma for r in rs], [r.predicted for r in rs], "x--", color=color, alpha=0.7, label=f"{m}: formula")
        b = best_row(rs)
        ax.annotate("best", (b.gamma, b.speedup), textcoords="offset points", xytext=(4, 6), color=color)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("γ (draft tokens per step)")
    ax.set_ylabel("speed-up over plain greedy")
    ax.set_title(title or "speculative decoding: measured vs formula")
    ax.legend(fontsize=7)
    return fig, ax


# ---------------------------------------------------------------------------------------------- batch size
@dataclass(frozen=True)
class BatchRow:
    batch: int
    plain_seconds: float
    spec_seconds: float
    tokens_per_forward: float
    verify_over_plain: float

    @property
    def speedup(self) -> float:
        return self.plain_seconds / self.spec_seconds


def batch_sweep(
    target, make_proposer: Callable[[], object], gamma: int, prompts, batches: Sequence[int], new_tokens=32, repeats=2
) -> list[BatchRow]:
    """Speculative vs plain greedy at each batch size (prompts cycled to fill the batch). As the batch
    grows, a verify forward over B·(γ+1) tokens stops costing the same as one over B tokens: the spare
    FLOPs that paid for the drafts are gone."""
    if not batches or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in batches):
        raise ValueError(f"batches must be a non-empty list of ints ≥ 1, got {batches!r}")
    pool = _ids(target, prompts)
    out = []
    for b in batches:
        base = baseline(target, [pool[i % len(pool)] for i in range(b)], new_tokens, repeats)
        row = run_method(target, make_proposer(), gamma, base, repeats=repeats)
        out.append(BatchRow(b, row.plain_seconds, row.seconds, row.tokens_per_forward, row.verify_over_plain))
    return out


# ---------------------------------------------------------------------------------------------- acceptance by domain
DOMAINS = ("code", "comment", "docstring", "string")


def char_domains(source: str) -> list[str]:
    """A label per character of Python source: comment, docstring (a string that is a whole statement),
    string (any other literal) or code. Uses the standard ``tokenize`` module; unparsable text is code."""
    if not isinstance(source, str):
        raise ValueError(f"source must be a str, got {type(source).__name__}")
    labels = ["code"] * len(source)
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))

    def offset(rc):
        return line_starts[rc[0] - 1] + rc[1]

    prev = tokenize.NEWLINE
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            kind = None
            if tok.type == tokenize.COMMENT:
                kind = "comment"
            elif tok.type == tokenize.STRING:
                kind = (
                    "docstring"
                    if prev in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL)
                    else "string"
                )
            if kind:
                for i in range(offset(tok.start), min(offset(tok.end), len(source))):
                    labels[i] = kind
            if tok.type not in (tokenize.COMMENT,):
                prev = tok.type
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a truncated file: what was labelled stays labelled
    return labels


@dataclass
class DomainAgreement:
    """Teacher-forced top-1 agreement of draft and target, per kind of text (greedy α per domain)."""

    agree: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DOMAINS, 0))
    total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DOMAINS, 0))

    def rate(self, domain: str) -> float:
        return self.agree[domain] / self.total[domain] if self.total[domain] else math.nan

    def __str__(self) -> str:
        return "\n".join(f"{d:<10}{self.rate(d):>7.3f}   ({self.total[d]:,} tokens)" for d in DOMAINS)


def _quiet(fn, *args, **kwargs):
    """Call a ``transformers`` function with its warnings off (e.g. "sequence longer than the model's
    maximum" when tokenizing a whole file that is then cut into windows)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return fn(*args, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)


@torch.inference_mode()
def acceptance_by_domain(target, draft, sources: Sequence[str], window: int = 256) -> DomainAgreement:
    """For each token of each source text, whether the draft's argmax equals the target's, given the same
    true prefix; bucketed by the domain of the token being predicted. Greedy speculative decoding accepts
    a draft exactly when they agree, so this is α by domain (on real text, not the model's own output)."""
    if isinstance(sources, str) or not sources:
        raise ValueError("sources must be a non-empty list of Python source strings")
    if target.model.vocab_size != draft.model.vocab_size:
        raise ValueError("draft and target must share one vocabulary")
    out = DomainAgreement()
    for src in sources:
        labels = char_domains(src)
        enc = _quiet(target.tokenizer, src, return_offsets_mapping=True, add_special_tokens=False)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        tok_dom = []
        for a, b in offsets:
            span = [labels[i] for i in range(a, min(b, len(labels))) if not src[i].isspace()]
            tok_dom.append(span[0] if span else (labels[a] if a < len(labels) else "code"))
        for s in range(0, max(len(ids) - 1, 0), window):
            chunk = ids[s : s + window + 1]
            if len(chunk) < 2:
                break
            x = torch.tensor([chunk[:-1]], device=target.device)
            t = target.model.dense_logits(x)[0].argmax(-1)
            d = draft.model.dense_logits(x.to(draft.device))[0].argmax(-1).to(t.device)
            same = (t == d).tolist()
            for j, ok in enumerate(same):
                dom = tok_dom[s + j + 1]
                out.total[dom] += 1
                out.agree[dom] += int(ok)
    return out


def validation_sources(max_files: int = 4, max_chars: int = 6000) -> list[str]:
    """Held-out Python files (the validation split of the embedded models' corpus), each cut to ``max_chars``."""
    from course_lib.models.corpus import iter_files

    files = [f.text[:max_chars] for f in iter_files() if f.split == "val" and len(f.text) > 2000]
    return files[:max_files]


# ---------------------------------------------------------------------------------------------- transformers
@torch.inference_mode()
def hf_assisted(target, draft, base: Baseline, repeats: int = 3) -> dict:
    """``transformers``' own assisted generation (its speculative decoding) on the same models and the first
    prompt of ``base``: its plain and assisted times, and whether its tokens equal our greedy output."""
    hf_t, hf_d = target.hf_model, draft.hf_model
    ids = base.ids[0]
    new = base.params.max_new_tokens
    x = torch.tensor([ids], device=target.device)
    kw = dict(
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        pad_token_id=target.tokenizer.pad_token_id,
        attention_mask=torch.ones_like(x),
    )
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its notices about generation_config defaults are not for the learner
    try:
        hf_t.generate(x, **kw)  # warm-up
        plain = best_of(lambda: hf_t.generate(x, **kw), repeats)
        tokens = hf_t.generate(x, assistant_model=hf_d, **kw)[0, len(ids) :].tolist()
        assisted = best_of(lambda: hf_t.generate(x, assistant_model=hf_d, **kw), repeats)
    finally:
        hf_logging.set_verbosity(verbosity)
    return dict(plain_s=plain, assisted_s=assisted, identical=tokens == base.outputs[0])


# ---------------------------------------------------------------------------------------------- the calculator
def draw_speedup(alpha: float, c: float, max_gamma: int = 10, points: Sequence[SpecRow] = ()) -> tuple[Figure, str]:
    """The calculator's picture: E(α, γ) and the speed-up E/(γc + 1) for γ = 1..max_gamma, the best γ
    marked, and measured rows (if any) as points at their own γ. A ``Figure`` of its own (thread-safe)."""
    g_best = best_gamma(alpha, c, max_gamma)
    gs = list(range(1, max_gamma + 1))
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(gs, [expected_tokens(alpha, g) for g in gs], ":", color="grey", label="E: tokens per target forward")
    ax.plot(
        gs, [expected_speedup(alpha, g, c) for g in gs], "-", color="C0", label=f"speed-up, α={alpha:.2f}, c={c:.2f}"
    )
    ax.plot([g_best], [expected_speedup(alpha, g_best, c)], "*", ms=14, color="C0", label=f"best γ = {g_best}")
    for i, m in enumerate(dict.fromkeys(r.method for r in points)):
        rs = [r for r in points if r.method == m and r.gamma <= max_gamma]
        ax.plot([r.gamma for r in rs], [r.speedup for r in rs], "o", color=f"C{i + 1}", label=f"measured: {m}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("γ")
    ax.set_ylabel("× plain decoding")
    ax.legend(fontsize=7)
    text = (
        f"α = {alpha:.2f}, c = {c:.2f}: best γ = {g_best}, E = {expected_tokens(alpha, g_best):.2f} tokens per "
        f"target forward, predicted speed-up {expected_speedup(alpha, g_best, c):.2f}×"
        + ("  (a slowdown: the drafts cost more than they save)" if expected_speedup(alpha, g_best, c) < 1 else "")
    )
    return fig, text


def speedup_explorer(points: Sequence[SpecRow] = (), alpha: float = 0.6, c: float = 0.2):
    """An ipywidgets calculator: α and c sliders → expected speed-up vs γ, with measured points on it."""
    import ipywidgets as widgets

    controls = {
        "alpha": widgets.FloatSlider(value=alpha, min=0.0, max=0.99, step=0.01, description="α"),
        "c": widgets.FloatSlider(value=c, min=0.0, max=1.0, step=0.01, description="c"),
        "max_gamma": widgets.IntSlider(value=10, min=2, max=16, description="max γ"),
    }
    out = widgets.Output()

    def refresh(_change=None) -> None:
        fig, text = draw_speedup(**{k: w.value for k, w in controls.items()}, points=points)
        out.outputs = as_outputs(fig, text)

    for w in controls.values():
        w.observe(refresh, names="value")
    refresh()
    return widgets.VBox([*controls.values(), out])


__all__ = [
    "DOMAINS",
    "FREE_PROMPTS",
    "GROUNDED_PROMPTS",
    "Baseline",
    "BatchRow",
    "DomainAgreement",
    "SpecRow",
    "VerifyCost",
    "acceptance_by_domain",
    "baseline",
    "batch_sweep",
    "best_of",
    "best_row",
    "char_domains",
    "draw_speedup",
    "gamma_sweep",
    "hf_assisted",
    "plot_gamma_sweep",
    "run_method",
    "speedup_explorer",
    "table",
    "validation_sources",
    "verify_cost",
]


# ---------------------------------------------------------------------------------------------- sampling mode
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
