"""Chapter 06's request traces: when requests arrive, how long their prompts and answers are, what they share.

A serving policy is judged on a *trace*: the same arrivals and lengths replayed against every policy, on
the real engine and in the simulator. Arrivals are Poisson (independent users, exponential gaps at rate
λ) or bursty (gamma gaps with the same mean 1/λ but a coefficient of variation above 1: quiet spells,
then many requests at once, the load pattern that hurts TTFT most). Lengths are log-normal with a given
mean and a cap (most requests short, a long tail). A fraction of requests may open with a shared system
prompt of P tokens (the case prefix caching serves). A trace stores lengths, offsets and seeds only; the
prompt token ids are rebuilt deterministically from held-out text (``workload.prompt_pool``), so the JSON
files in ``data/traces/`` stay small. Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from course_lib.serving.workload import prompt_of_length

ARRIVALS = ("poisson", "bursty")


def _positive_number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an int ≥ 0, got {value!r}")
    return int(value)


def _fraction(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


# ----------------------------------------------------------------------------- arrival processes
def poisson_arrivals(rate: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` arrival times (s, from 0) of a Poisson process of ``rate`` requests/s: exponential gaps of mean 1/rate."""
    rate = _positive_number("rate", rate)
    n = _positive_int("n", n)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)  # (n,)
    return np.cumsum(gaps) - gaps[0]  # the first request arrives at t = 0


def bursty_arrivals(rate: float, n: int, cv: float = 3.0, seed: int = 0) -> np.ndarray:
    """``n`` arrival times of a gamma renewal process with mean rate ``rate`` and gap coefficient of variation
    ``cv`` (std/mean of the gaps; 1 is Poisson, above 1 is bursty): shape k = 1/cv², scale = 1/(rate·k)."""
    rate = _positive_number("rate", rate)
    n = _positive_int("n", n)
    cv = _positive_number("cv", cv)
    k = 1.0 / cv**2
    gaps = np.random.default_rng(seed).gamma(k, 1.0 / (rate * k), n)  # (n,) mean 1/rate, std cv/rate
    return np.cumsum(gaps) - gaps[0]


def lognormal_lengths(mean: float, n: int, sigma: float = 1.0, cap: int = 1024, seed: int = 0) -> np.ndarray:
    """``n`` integer lengths, log-normal with (uncapped) mean ``mean`` and log-space std ``sigma``, clipped to
    [1, cap]: μ = ln(mean) − σ²/2, so the long tail does not move the mean."""
    mean = _positive_number("mean", mean)
    n = _positive_int("n", n)
    cap = _positive_int("cap", cap)
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not math.isfinite(sigma) or sigma < 0:
        raise ValueError(f"sigma must be a finite number ≥ 0, got {sigma!r}")
    mu = math.log(mean) - sigma**2 / 2
    draws = np.random.default_rng(seed).lognormal(mu, sigma, n)  # (n,)
    return np.clip(np.rint(draws), 1, cap).astype(int)


# ----------------------------------------------------------------------------- the trace
@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace. Its prompt is ``prefix_len`` tokens of its group's shared system prompt
    (none when ``prefix_group`` is None), then ``prompt_len - prefix_len`` tokens of the pool from ``offset``."""

    arrival_s: float  # s after the trace starts
    prompt_len: int  # total prompt tokens, shared prefix included
    max_new_tokens: int  # output tokens (EOS is ignored when replaying)
    offset: int = 0  # where its own tokens start in the pool
    prefix_group: int | None = None  # requests of one group share the first prefix_len tokens
    prefix_len: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.arrival_s, (int, float)) and math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise ValueError(f"TraceRequest.arrival_s must be a finite number ≥ 0, got {self.arrival_s!r}")
        _positive_int("TraceRequest.prompt_len", self.prompt_len)
        _positive_int("TraceRequest.max_new_tokens", self.max_new_tokens)
        _non_negative_int("TraceRequest.offset", self.offset)
        _non_negative_int("TraceRequest.prefix_len", self.prefix_len)
        if self.prefix_group is None and self.prefix_len:
            raise ValueError("TraceRequest.prefix_len must be 0 when prefix_group is None")
        if self.prefix_group is not None:
            _non_negative_int("TraceRequest.prefix_group", self.prefix_group)
            if not 0 < self.prefix_len < self.prompt_len:
                raise ValueError(
                    f"TraceRequest.prefix_len must be in (0, prompt_len={self.prompt_len}) for a request in "
                    f"a prefix group, got {self.prefix_len}"
                )


_COLUMNS = ("arrival_s", "prompt_len", "max_new_tokens", "offset", "prefix_group", "prefix_len")


@dataclass
class Trace:
    """A list of requests sorted by arrival, and how it was made (``meta``: generator, seeds, pool size)."""

    requests: list[TraceRequest]
    name: str = "trace"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.requests or not all(isinstance(r, TraceRequest) for r in self.requests):
            raise ValueError("Trace.requests must be a non-empty list of TraceRequest")
        self.requests = sorted(self.requests, key=lambda r: r.arrival_s)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        """Last arrival − first arrival."""
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    @property
    def rate(self) -> float:
        """Measured mean arrival rate, requests/s ((n − 1) gaps over the duration); inf for a burst."""
        return (len(self) - 1) / self.duration_s if self.duration_s > 0 else math.inf

    @property
    def output_tokens(self) -> int:
        return sum(r.max_new_tokens for r in self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    @property
    def pool_tokens(self) -> int:
        """Tokens of held-out text the prompts are cut from (``prompt_pool(tokenizer, pool_tokens)``)."""
        return int(self.meta.get("pool_tokens", 4096))

    def max_model_len(self) -> int:
        """The longest prompt + output of any request: the context a replaying engine needs."""
        return max(r.prompt_len + r.max_new_tokens for r in self.requests)

    def prompt_ids(self, pool: Sequence[int]) -> list[list[int]]:
        """Each request's prompt token ids, rebuilt from ``pool``: group g's shared prefix is the pool slice
        starting at g · prefix_len (the same ids for every request of the group), then the request's own slice."""
        out = []
        for r in self.requests:
            own = prompt_of_length(pool, r.prompt_len - r.prefix_len, r.offset)
            prefix = prompt_of_length(pool, r.prefix_len, r.prefix_group * r.prefix_len) if r.prefix_len else []
            out.append(prefix + own)
        return out

    def with_rate(self, rate: float) -> Trace:
        """The same requests with every arrival time scaled so the mean rate becomes ``rate`` (same shape of
        gaps, same lengths): how a sweep over load replays one trace."""
        rate = _positive_number("rate", rate)
        if not math.isfinite(self.rate):
            raise ValueError("a trace whose requests all arrive at once has no rate to rescale")
        t0, k = self.requests[0].arrival_s, self.rate / rate
        reqs = [_replace(r, arrival_s=(r.arrival_s - t0) * k) for r in self.requests]
        return Trace(reqs, f"{self.name}@{rate:g}", {**self.meta, "rate": rate, "rescaled_from": self.name})

    # ------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        cols = {c: [getattr(r, c) for r in self.requests] for c in _COLUMNS}
        cols["arrival_s"] = [round(t, 6) for t in cols["arrival_s"]]
        return {"name": self.name, "meta": self.meta, "requests": cols}

    @classmethod
    def from_dict(cls, d: dict) -> Trace:
        try:
            cols = d["requests"]
            n = len(cols["arrival_s"])
            if any(len(cols[c]) != n for c in _COLUMNS):
                raise ValueError("columns of different lengths")
            reqs = [TraceRequest(*(cols[c][i] for c in _COLUMNS)) for i in range(n)]
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a trace: expected {{'requests': {{{', '.join(_COLUMNS)}}}}} ({e!r})") from e
        return cls(reqs, d.get("name", "trace"), dict(d.get("meta", {})))

    def save(self, path: str | Path) -> Path:
        """Write the trace as compact JSON (one list per column)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), separators=(",", ":")) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _replace(r: TraceRequest, **changes) -> TraceRequest:
    return TraceRequest(**{**{c: getattr(r, c) for c in _COLUMNS}, **changes})


def make_trace(
    n_requests: int,
    rate: float,
    *,
    arrival: str = "poisson",
    cv: float = 3.0,
    prompt_mean: float = 128,
    prompt_sigma: float = 0.8,
    prompt_max: int = 512,
    output_mean: float = 48,
    output_sigma: float = 0.8,
    output_max: int = 256,
    prefix_len: int = 0,
    prefix_fraction: float = 0.0,
    prefix_groups: int = 1,
    pool_tokens: int = 4096,
    seed: int = 0,
    start_s: float = 0.0,
    name: str | None = None,
) -> Trace:
    """A seeded trace: ``arrival`` "poisson" or "bursty" (gamma gaps of coefficient of variation ``cv``) at
    ``rate`` requests/s; log-normal prompt and output lengths with the given means, σ and caps. A fraction
    ``prefix_fraction`` of requests (in ``prefix_groups`` groups) open with a shared ``prefix_len``-token
    system prompt in front of their own prompt. Sub-streams are seeded separately, so changing the output
    lengths leaves the arrivals unchanged."""
    n = _positive_int("n_requests", n_requests)
    rate = _positive_number("rate", rate)
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival must be one of {ARRIVALS}, got {arrival!r}")
    prefix_len = _non_negative_int("prefix_len", prefix_len)
    prefix_fraction = _fraction("prefix_fraction", prefix_fraction)
    prefix_groups = _positive_int("prefix_groups", prefix_groups)
    pool_tokens = _positive_int("pool_tokens", pool_tokens)
    if prefix_fraction > 0 and prefix_len == 0:
        raise ValueError("prefix_fraction > 0 needs prefix_len > 0")
    if prefix_groups * prefix_len > pool_tokens:
        raise ValueError(f"prefix_groups × prefix_len = {prefix_groups * prefix_len} exceeds pool_tokens={pool_tokens}")
    if max(prompt_max, prefix_len + prompt_max) > pool_tokens:
        raise ValueError(f"prompt_max + prefix_len must fit in pool_tokens={pool_tokens}")
    seeds = np.random.SeedSequence(seed).spawn(5)
    ints = [int(s.generate_state(1)[0]) for s in seeds]
    if arrival == "poisson":
        times = poisson_arrivals(rate, n, ints[0])
    else:
        times = bursty_arrivals(rate, n, cv, ints[0])
    prompts = lognormal_lengths(prompt_mean, n, prompt_sigma, prompt_max, ints[1])
    outputs = lognormal_lengths(output_mean, n, output_sigma, output_max, ints[2])
    rng = np.random.default_rng(ints[3])
    offsets = rng.integers(0, pool_tokens, n)
    shared = np.random.default_rng(ints[4]).random(n) < prefix_fraction
    groups = rng.integers(0, prefix_groups, n)
    reqs = []
    for i in range(n):
        grp = int(groups[i]) if shared[i] else None
        p = int(prompts[i]) + (prefix_len if grp is not None else 0)
        reqs.append(
            TraceRequest(
                float(start_s + times[i]),
                p,
                int(outputs[i]),
                int(offsets[i]),
                grp,
                prefix_len if grp is not None else 0,
            )
        )
    meta = dict(
        generator="make_trace",
        n_requests=n,
        rate=rate,
        arrival=arrival,
        cv=cv if arrival == "bursty" else 1.0,
        prompt_mean=prompt_mean,
        prompt_sigma=prompt_sigma,
        prompt_max=prompt_max,
        output_mean=output_mean,
        output_sigma=output_sigma,
        output_max=output_max,
        prefix_len=prefix_len,
        prefix_fraction=prefix_fraction,
        prefix_groups=prefix_groups,
        pool_tokens=pool_tokens,
        seed=seed,
        start_s=start_s,
    )
    return Trace(reqs, name or f"{arrival}-{rate:g}rps-{n}req-seed{seed}", meta)


def merge_traces(*traces: Trace, name: str | None = None) -> Trace:
    """One trace holding the requests of all of them, by arrival (e.g. steady chat traffic plus a few
    long-prompt requests). Pools must agree."""
    if not traces or not all(isinstance(t, Trace) for t in traces):
        raise ValueError("merge_traces needs at least one Trace")
    pools = {t.pool_tokens for t in traces}
    if len(pools) > 1:
        raise ValueError(f"traces are cut from pools of different sizes: {sorted(pools)}")
    reqs = [r for t in traces for r in t.requests]
    meta = {"generator": "merge_traces", "parts": [t.to_dict()["meta"] for t in traces], "pool_tokens": pools.pop()}
    return Trace(reqs, name or "+".join(t.name for t in traces), meta)


def traces_dir() -> Path:
    """``data/traces/``: the traces chapter 06 ships."""
    from course_lib.core.paths import data_dir

    return data_dir() / "traces"


def load_trace(name: str) -> Trace:
    """A shipped trace by file name, with or without ``.json`` (``load_trace("poisson_small")``)."""
    path = traces_dir() / (name if name.endswith(".json") else f"{name}.json")
    if not path.exists():
        have = sorted(p.stem for p in traces_dir().glob("*.json"))
        raise ValueError(f"no trace {name!r} in {traces_dir()}; have {have}")
    return Trace.load(path)


__all__ = [
    "ARRIVALS",
    "Trace",
    "TraceRequest",
    "bursty_arrivals",
    "load_trace",
    "lognormal_lengths",
    "make_trace",
    "merge_traces",
    "poisson_arrivals",
    "traces_dir",
]
