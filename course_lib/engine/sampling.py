"""Decoding strategies: turn one step's logits (B, V) into the next token ids (B,).

Greedy, temperature, top-k, top-p (nucleus), min-p, and the penalties that discourage repeats
(repetition: HF/CTRL; presence and frequency: OpenAI/vLLM). Sampling is a few elementwise passes
and one sort over V per row: memory-bound and tiny next to the forward pass, so we keep it plain
torch. Order, as in vLLM and HF: penalties → temperature → top-k → top-p → min-p → softmax → draw.
Inputs are checked on shape, dtype and device only: checking values (NaN, negative counts) would
force a device sync every decode step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from course_lib.engine.structured import check_spec


def _check_float(
    name: str,
    value,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    allowed: str,
) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        raise ValueError(f"SamplingParams.{name} must be {allowed}, got {value!r}")


def _check_int(name: str, value, *, lo: int, allowed: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"SamplingParams.{name} must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token, and when to stop; one per request. Validated on construction."""

    temperature: float = 0.0  # 0 → greedy (argmax); > 0 divides logits before softmax
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set with probability mass ≥ p; 1 = off
    min_p: float = 0.0  # drop tokens with prob < min_p · max prob; 0 = off
    repetition_penalty: float = 1.0  # HF/CTRL: seen tokens (prompt+output): logit>0 → /r, else ·r
    presence_penalty: float = 0.0  # OpenAI/vLLM, output tokens: logit -= presence · [count > 0]
    frequency_penalty: float = 0.0  # OpenAI/vLLM, output tokens: logit -= frequency · count
    max_new_tokens: int | None = 32  # None: until the context window (or the KV room) ends; Engine resolves it
    min_tokens: int = 0  # EOS is masked and stop strings ignored until this many tokens are out (vLLM)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs added to the logits (OpenAI); a dict works
    logprobs: int | None = None  # report the sampled token's log-prob and this many top alternatives (0 = none)
    n: int = 1  # independent samples of the prompt: Engine forks the sequence once its prompt is done
    structured: str | None = None  # "json" or a JSON schema (a JSON string): grammar-constrained (structured.py)
    seed: int | None = None  # build ONE generator per request: make_generator(seed)
    ignore_eos: bool = False
    num_beams: int = 1  # > 1 = beam search, deterministic only (temperature 0)
    length_penalty: float = 1.0  # beam score = sum logprob / length ** length_penalty
    stop: tuple[str, ...] = ()  # finish when the output text contains one of these strings

    def __post_init__(self) -> None:
        _check_float("temperature", self.temperature, lo=0.0, allowed="a finite float ≥ 0 (0 = greedy)")
        _check_int("top_k", self.top_k, lo=0, allowed="an int ≥ 0 (0 = off)")
        _check_float("top_p", self.top_p, lo=0.0, hi=1.0, lo_open=True, allowed="a float in (0, 1] (1 = off)")
        _check_float("min_p", self.min_p, lo=0.0, hi=1.0, hi_open=True, allowed="a float in [0, 1) (0 = off)")
        _check_float(
            "repetition_penalty",
            self.repetition_penalty,
            lo=0.0,
            lo_open=True,
            allowed="a finite float > 0 (1 = off, > 1 discourages repeats)",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            _check_float(name, getattr(self, name), lo=-2.0, hi=2.0, allowed="a float in [-2, 2] (0 = off)")
        if self.max_new_tokens is not None:
            _check_int(
                "max_new_tokens", self.max_new_tokens, lo=1, allowed="None (until the context ends) or an int ≥ 1"
            )
        _check_int("min_tokens", self.min_tokens, lo=0, allowed="an int ≥ 0 (0 = off)")
        if self.max_new_tokens is not None and self.min_tokens > self.max_new_tokens:
            raise ValueError(
                f"SamplingParams.min_tokens={self.min_tokens} must not exceed max_new_tokens={self.max_new_tokens}"
            )
        self._check_logit_bias()
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, lo=0, allowed="None or an int ≥ 0 (top alternatives per token)")
        _check_int("n", self.n, lo=1, allowed="an int ≥ 1 (samples of the prompt)")
        if self.structured is not None:
            check_spec(self.structured)
            if self.ignore_eos or self.min_tokens:
                raise ValueError(
                    "SamplingParams.structured ends the answer with EOS once the document is complete: it cannot "
                    f"go with ignore_eos={self.ignore_eos} or min_tokens={self.min_tokens}"
                )
        if self.seed is not None:
            _check_int("seed", self.seed, lo=0, allowed="None or an int ≥ 0")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"SamplingParams.ignore_eos must be a bool, got {self.ignore_eos!r}")
        _check_int("num_beams", self.num_beams, lo=1, allowed="an int ≥ 1 (1 = no beam search)")
        _check_float("length_penalty", self.length_penalty, allowed="a finite float")
        if isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop, tuple) or not all(isinstance(x, str) and x for x in self.stop):
            raise ValueError(
                f"SamplingParams.stop must be a tuple of non-empty strings, e.g. ('\\n\\n',), got {self.stop!r}"
            )
        if self.num_beams > 1 and self.temperature != 0:
            raise ValueError(
                f"SamplingParams.num_beams={self.num_beams} needs temperature=0 (beam search is "
                f"deterministic here), got temperature={self.temperature!r}"
            )

    def _check_logit_bias(self) -> None:
        bias = self.logit_bias
        if isinstance(bias, dict):
            bias = tuple(sorted(bias.items()))
        ok = isinstance(bias, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in bias)
        if ok:
            bias = tuple((t, float(b) if isinstance(b, int) and not isinstance(b, bool) else b) for t, b in bias)
            ok = all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 and isinstance(b, float) and -100 <= b <= 100
                for t, b in bias
            )
        if not ok or len({t for t, _ in bias}) != len(bias):
            raise ValueError(
                "SamplingParams.logit_bias must map distinct token ids ≥ 0 to biases in [-100, 100], "
                f"e.g. {{50256: -100.0}}, got {self.logit_bias!r}"
            )
        object.__setattr__(self, "logit_bias", bias)

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax: no randomness, filters cannot change it."""
        return self.temperature == 0

    @classmethod
    def from_name(cls, name: str, **overrides) -> "SamplingParams":
        """A preset (``greedy``, ``precise``, ``balanced``, ``creative``), optionally with fields replaced."""
        key = name.strip().lower()
        if key not in PRESETS:
            raise ValueError(f"unknown sampling preset {name!r}; valid: {sorted(PRESETS)}")
        return replace(PRESETS[key], **overrides)


PRESETS: dict[str, SamplingParams] = {
    # Starting points for the notebooks, not tuned recommendations. No penalties: those need counts.
    "greedy": SamplingParams(),
    "precise": SamplingParams(temperature=0.3, top_p=0.9),
    "balanced": SamplingParams(temperature=0.7, top_p=0.9, top_k=50),
    "creative": SamplingParams(temperature=1.0, top_p=0.95, min_p=0.05),
}


def _as_logits(logits: torch.Tensor) -> torch.Tensor:
    """Check (B, V) floating logits and upcast fp16/bf16 to fp32 (softmax and cumsum need the range)."""
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"logits must be a torch.Tensor of shape (B, V), got {type(logits).__name__}")
    if logits.dim() != 2 or logits.shape[0] < 1 or logits.shape[1] < 1:
        raise ValueError(f"logits must have shape (B, V) with B, V ≥ 1, got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating tensor (fp32/fp16/bf16), got {logits.dtype}")
    return logits.float()  # a copy for fp16/bf16, the same tensor for fp32: callers never write in place


def _check_params(params) -> None:
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")


def _check_counts(name: str, counts: torch.Tensor, logits: torch.Tensor) -> None:
    if not isinstance(counts, torch.Tensor):
        raise ValueError(f"{name} must be a (B, V) integer torch.Tensor, got {type(counts).__name__}")
    if counts.shape != logits.shape:
        raise ValueError(f"{name} must have the logits' shape {tuple(logits.shape)} (B, V), got {tuple(counts.shape)}")
    if counts.is_floating_point() or counts.is_complex() or counts.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer occurrence counts, got dtype {counts.dtype}")
    if counts.device != logits.device:
        raise ValueError(f"{name} is on {counts.device} but logits are on {logits.device}")


def counts_from_ids(ids: torch.Tensor, vocab_size: int, pad_id: int | None = None) -> torch.Tensor:
    """How often each token occurs per row: (B, T) ids → (B, V) int64 counts, ``pad_id`` not counted."""
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an int ≥ 1, got {vocab_size!r}")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError(f"ids must be a (B, T) integer torch.Tensor, got {getattr(ids, 'shape', type(ids).__name__)}")
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor, got dtype {ids.dtype}")
    ids = ids.long()
    real = torch.ones_like(ids, dtype=torch.bool) if pad_id is None else ids != pad_id  # (B, T)
    if real.any() and (ids[real].min() < 0 or ids[real].max() >= vocab_size):
        raise ValueError(
            f"ids must lie in [0, vocab_size={vocab_size}) (or equal pad_id={pad_id}), "
            f"got values in [{ids[real].min().item()}, {ids[real].max().item()}]"
        )
    counts = torch.zeros(ids.shape[0], vocab_size, dtype=torch.int64, device=ids.device)  # (B, V)
    return counts.scatter_add_(1, ids.clamp(0, vocab_size - 1), real.long())


def apply_penalties(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_counts: torch.Tensor | None = None,
    output_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Discourage repeats: repetition penalty on prompt+output tokens, then presence/frequency on output only."""
    _check_params(params)
    logits = _as_logits(logits)  # (B, V) fp32
    rep = params.repetition_penalty != 1.0
    pres_freq = params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
    if rep and prompt_counts is None and output_counts is None:
        raise ValueError(
            f"repetition_penalty={params.repetition_penalty} needs prompt_counts and/or output_counts "
            "((B, V) ints, see counts_from_ids)"
        )
    if pres_freq and output_counts is None:
        raise ValueError(
            "presence_penalty/frequency_penalty need output_counts ((B, V) ints, zeros before the "
            "first generated token)"
        )
    for name, counts in (("prompt_counts", prompt_counts), ("output_counts", output_counts)):
        if counts is not None:
            _check_counts(name, counts, logits)
    if rep:
        seen = torch.zeros_like(logits, dtype=torch.bool)  # (B, V)
        for counts in (prompt_counts, output_counts):
            if counts is not None:
                seen |= counts > 0
        r = params.repetition_penalty
        # Dividing a negative logit would *raise* it, so negatives are multiplied instead (CTRL, HF).
        logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    if pres_freq:
        out = output_counts.to(logits.dtype)  # (B, V)
        logits = logits - params.presence_penalty * (out > 0).to(logits.dtype) - params.frequency_penalty * out
    return logits


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide logits by T: T < 1 sharpens the distribution, T > 1 flattens it. T = 0 is greedy, not this."""
    if (
        not isinstance(temperature, (int, float))
        or isinstance(temperature, bool)
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise ValueError(f"temperature must be a finite float > 0 (use argmax for 0), got {temperature!r}")
    return _as_logits(logits) / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits per row, the rest → -inf. Ties with the k-th value are all kept."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"top_k must be an int ≥ 0 (0 = off), got {k!r}")
    logits = _as_logits(logits)  # (B, V)
    if k == 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # (B, 1) the k-th largest value
    return logits.masked_fill(logits < kth, -math.inf)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches p (the nucleus); the rest → -inf.

    Ties with the least likely kept token are all kept, so the result does not depend on sort order.
    """
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not (0 < p <= 1):
        raise ValueError(f"top_p must be a float in (0, 1] (1 = off), got {p!r}")
    logits = _as_logits(logits)  # (B, V)
    if p >= 1:
        return logits
    # Drop the least likely tokens while their total mass stays ≤ 1 - p. Summing from the small end
    # is what HF does, and it is the accurate order for a float32 cumsum over a long tail.
    sorted_logits, _ = torch.sort(logits, dim=-1, stable=True)  # (B, V) ascending
    tail_mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (B, V) mass of this token and all below
    n_drop = (tail_mass <= 1 - p).sum(dim=-1, keepdim=True)  # (B, 1) a prefix, since cumsum is monotone
    n_drop = n_drop.clamp(max=logits.shape[-1] - 1)  # always keep the most likely token
    threshold = sorted_logits.gather(-1, n_drop)  # (B, 1) the least likely kept logit
    return logits.masked_fill(logits < threshold, -math.inf)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens less likely than ``min_p`` × the top token's probability: a cut that scales with confidence."""
    if not isinstance(min_p, (int, float)) or isinstance(min_p, bool) or not (0 <= min_p < 1):
        raise ValueError(f"min_p must be a float in [0, 1) (0 = off), got {min_p!r}")
    logits = _as_logits(logits)  # (B, V)
    if min_p == 0:
        return logits
    probs = logits.softmax(dim=-1)  # (B, V)
    cut = min_p * probs.amax(dim=-1, keepdim=True)  # (B, 1); the top token is never below it
    return logits.masked_fill(probs < cut, -math.inf)


def process_logits(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_counts: torch.Tensor | None = None,
    output_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Penalties → temperature → top-k → top-p → min-p. Greedy stops after penalties (filters keep the argmax)."""
    logits = apply_penalties(logits, params, prompt_counts, output_counts)  # (B, V) fp32
    if params.greedy:
        return logits
    logits = apply_temperature(logits, params.temperature)
    logits = top_k_filter(logits, params.top_k)
    logits = top_p_filter(logits, params.top_p)
    return min_p_filter(logits, params.min_p)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A seeded generator on ``device``. Make one per request and reuse it every step: a fresh one per
    step would replay the same random numbers."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an int ≥ 0, got {seed!r}")
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(seed)
    return gen


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    *,
    generator: torch.Generator | None = None,
    prompt_counts: torch.Tensor | None = None,
    output_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Next token per row, (B,) int64: argmax when greedy, else one draw from the processed softmax."""
    _check_params(params)
    if not params.greedy and generator is None and params.seed is not None:
        raise ValueError(
            f"params.seed={params.seed} is set but no generator was passed: build one per request "
            "with make_generator(params.seed, device) and pass it to every step"
        )
    if (
        not params.greedy
        and generator is not None
        and isinstance(logits, torch.Tensor)
        and generator.device.type != logits.device.type
    ):
        raise ValueError(f"generator is on {generator.device} but logits are on {logits.device}")
    logits = process_logits(logits, params, prompt_counts, output_counts)  # (B, V) fp32
    if params.greedy:
        return logits.argmax(dim=-1)  # (B,) first index among ties
    probs = logits.softmax(dim=-1)  # (B, V) filtered tokens have probability 0
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)  # (B,)
