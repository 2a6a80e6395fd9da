"""Serving metrics from timestamped events: TTFT, TPOT, latency percentiles, throughput, goodput, MFU, MBU.

A server is judged per request (did *this* user wait too long?), so we keep every request's event
times and report percentiles: a mean hides the tail that users remember. Decode is bandwidth-bound
(every step reads all weights and the KV cache), so MBU, not MFU, says how close decode is to its
ceiling; prefill is compute-bound and is judged by MFU. Vocabulary from Chip Huyen, *AI Engineering*, ch. 9.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# Humans read about 4-5 words/s ≈ 6-8 tokens/s, i.e. ~120 ms per token: a stream faster than this
# per token (TPOT) is not perceived as faster. (Chip Huyen, AI Engineering, ch. 9.)
reading_speed_budget_s = 0.120

DEFAULT_PS = (50, 90, 95, 99)


def _check_number(name: str, value, *, positive: bool = False, non_negative: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and positive:
        ok = value > 0
    if ok and non_negative:
        ok = value >= 0
    if not ok:
        kind = "a finite number > 0" if positive else "a finite number ≥ 0" if non_negative else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


@dataclass
class RequestTrace:
    """One request's events on the ``time.perf_counter`` clock; the server appends to ``token_times``."""

    request_id: str | int
    arrival: float  # s, when the request reached the server
    prompt_tokens: int
    token_times: list[float] = field(default_factory=list)  # s, when each output token was emitted
    finish: float | None = None  # s, when the response was closed, if known

    def __post_init__(self) -> None:
        _check_number(f"RequestTrace({self.request_id!r}).arrival", self.arrival)
        if not isinstance(self.prompt_tokens, int) or isinstance(self.prompt_tokens, bool) or self.prompt_tokens < 0:
            raise ValueError(
                f"RequestTrace({self.request_id!r}).prompt_tokens must be an int ≥ 0, got {self.prompt_tokens!r}"
            )
        self.token_times = list(self.token_times)
        self.check()

    def check(self) -> None:
        """Token times must be finite, ≥ arrival and non-decreasing; finish ≥ the last event. Raises ValueError."""
        name = f"RequestTrace({self.request_id!r})"
        previous = self.arrival
        for i, t in enumerate(self.token_times):
            _check_number(f"{name}.token_times[{i}]", t)
            if t < previous:
                raise ValueError(
                    f"{name}.token_times must be ≥ arrival ({self.arrival}) and non-decreasing; "
                    f"token_times[{i}]={t} < {previous}"
                )
            previous = t
        if self.finish is not None:
            _check_number(f"{name}.finish", self.finish)
            if self.finish < previous:
                raise ValueError(f"{name}.finish={self.finish} must be ≥ arrival and the last token time ({previous})")

    @property
    def n_output(self) -> int:
        """Output tokens emitted so far."""
        return len(self.token_times)

    def _first_and_last(self) -> tuple[float, float]:
        if not self.token_times:
            raise ValueError(f"RequestTrace({self.request_id!r}) has no output tokens yet")
        return self.token_times[0], self.token_times[-1]

    @property
    def ttft(self) -> float:
        """Time to first token: queueing + prefill, what the user waits before anything appears."""
        return self._first_and_last()[0] - self.arrival

    @property
    def tpot(self) -> float:
        """Time per output token after the first: (last − first) / (n − 1). NaN with one token (no gap exists)."""
        first, last = self._first_and_last()
        return (last - first) / (self.n_output - 1) if self.n_output > 1 else math.nan

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: every gap between consecutive tokens (their mean is the TPOT)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def latency(self) -> float:
        """End-to-end latency: last token − arrival (= TTFT + TPOT · (n − 1))."""
        return self._first_and_last()[1] - self.arrival


def percentiles(values, ps=DEFAULT_PS) -> dict:
    """{p: value} for each percentile p (numpy's linear interpolation); the tail is what users feel."""
    arr = np.asarray(values, dtype=float).ravel()
    if arr.size == 0:
        raise ValueError("values must be a non-empty sequence of numbers")
    if not np.isfinite(arr).all():
        raise ValueError(f"values must all be finite, got {int((~np.isfinite(arr)).sum())} NaN/inf of {arr.size}")
    ps = tuple(ps)
    if not ps:
        raise ValueError("ps must be a non-empty sequence of percentiles in [0, 100]")
    for p in ps:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 100:
            raise ValueError(f"ps must hold percentiles in [0, 100] like (50, 90, 99), got {p!r}")
    return {p: float(v) for p, v in zip(ps, np.percentile(arr, ps))}


@dataclass(frozen=True)
class SLO:
    """A service-level objective per request: first token within ``ttft_s``, then ``tpot_s`` per token."""

    ttft_s: float
    tpot_s: float = reading_speed_budget_s

    def __post_init__(self) -> None:
        _check_number("SLO.ttft_s", self.ttft_s, positive=True)
        _check_number("SLO.tpot_s", self.tpot_s, positive=True)


def meets(trace: RequestTrace, slo: SLO) -> bool:
    """Did this request meet the SLO? No tokens → no; one token → only TTFT is judged (no TPOT exists)."""
    if not isinstance(slo, SLO):
        raise ValueError(f"slo must be an SLO(ttft_s, tpot_s), got {type(slo).__name__}")
    if trace.n_output == 0:
        return False
    tpot = trace.tpot
    # a request exactly at the limit meets it: allow float rounding of the averaged gaps (1 ns)
    return trace.ttft <= slo.ttft_s + 1e-9 and (math.isnan(tpot) or tpot <= slo.tpot_s + 1e-9)


@dataclass
class ServingSummary:
    """What a serving benchmark reports: latency distributions, rates over a window, and goodput."""

    count: int  # requests given
    completed: int  # requests with ≥ 1 output token (the latency stats use these)
    ttft: dict  # {p: seconds}
    tpot: dict  # {p: seconds}, over requests with ≥ 2 tokens (NaN if none)
    latency: dict  # {p: seconds}
    mean_ttft: float
    mean_tpot: float
    mean_latency: float
    window: tuple[float, float]  # (start, end) s of the rate denominators
    output_tokens_per_s: float  # output tokens emitted inside the window / its length
    total_tokens_per_s: float  # + prompt tokens of requests whose first token is in the window
    requests_per_min: float  # requests whose last token is in the window, per minute
    goodput_rps: float | None = None  # of those, the ones meeting the SLO, per second
    slo_attainment: float | None = None  # fraction of all requests meeting the SLO
    slo: SLO | None = None

    def table(self) -> str:
        """A small printable table: percentiles in ms, then rates."""
        ps = list(self.ttft)
        head = f"{'metric':<12}" + "".join(f"{'p' + format(p, 'g'):>9}" for p in ps) + f"{'mean':>9}"
        lines = [
            f"{self.completed}/{self.count} requests with output, window {self.window[1] - self.window[0]:.3f} s",
            head,
        ]
        for name, dist, mean in (
            ("TTFT ms", self.ttft, self.mean_ttft),
            ("TPOT ms", self.tpot, self.mean_tpot),
            ("latency ms", self.latency, self.mean_latency),
        ):
            lines.append(f"{name:<12}" + "".join(f"{dist[p] * 1e3:>9.1f}" for p in ps) + f"{mean * 1e3:>9.1f}")
        lines.append(
            f"throughput: {self.output_tokens_per_s:.1f} output tok/s, {self.total_tokens_per_s:.1f} "
            f"total tok/s, {self.requests_per_min:.1f} req/min"
        )
        if self.slo is not None:
            lines.append(
                f"goodput: {self.goodput_rps:.3f} req/s meeting TTFT ≤ {self.slo.ttft_s * 1e3:g} ms and "
                f"TPOT ≤ {self.slo.tpot_s * 1e3:g} ms ({self.slo_attainment:.1%} of requests)"
            )
        return "\n".join(lines)


def _mean_and_percentiles(values: list[float], ps) -> tuple[float, dict]:
    if not values:
        return math.nan, {p: math.nan for p in ps}
    return float(np.mean(values)), percentiles(values, ps)


def summarize(
    traces, slo: SLO | None = None, window: tuple[float, float] | None = None, ps=DEFAULT_PS
) -> ServingSummary:
    """Summarise a benchmark run. ``window`` (start, end) only sets the rate denominators
    (default: first arrival → last token); latency percentiles use every request with output."""
    traces = list(traces)
    if not traces or not all(isinstance(t, RequestTrace) for t in traces):
        raise ValueError("traces must be a non-empty sequence of RequestTrace")
    if slo is not None and not isinstance(slo, SLO):
        raise ValueError(f"slo must be None or an SLO(ttft_s, tpot_s), got {type(slo).__name__}")
    for t in traces:
        t.check()  # token_times may have been appended since construction
    done = [t for t in traces if t.n_output > 0]
    if window is None:
        if not done:
            raise ValueError("no trace has output tokens, so there is no default window; pass window=(start, end)")
        window = (min(t.arrival for t in traces), max(t.token_times[-1] for t in done))
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"window must be (start, end) in seconds with end > start, got {window!r}")
    start, end = window
    _check_number("window start", start)
    _check_number("window end", end)
    if end <= start:
        raise ValueError(f"window must be (start, end) in seconds with end > start, got {window!r}")
    duration = end - start

    def inside(x: float) -> bool:
        return start <= x <= end

    out_tokens = sum(inside(x) for t in done for x in t.token_times)
    prompt_tokens = sum(t.prompt_tokens for t in done if inside(t.token_times[0]))
    finished = [t for t in done if inside(t.token_times[-1])]
    mean_ttft, ttft = _mean_and_percentiles([t.ttft for t in done], ps)
    mean_tpot, tpot = _mean_and_percentiles([t.tpot for t in done if t.n_output > 1], ps)
    mean_lat, lat = _mean_and_percentiles([t.latency for t in done], ps)
    summary = ServingSummary(
        count=len(traces),
        completed=len(done),
        ttft=ttft,
        tpot=tpot,
        latency=lat,
        mean_ttft=mean_ttft,
        mean_tpot=mean_tpot,
        mean_latency=mean_lat,
        window=(start, end),
        output_tokens_per_s=out_tokens / duration,
        total_tokens_per_s=(out_tokens + prompt_tokens) / duration,
        requests_per_min=60.0 * len(finished) / duration,
    )
    if slo is not None:
        summary.slo = slo
        summary.goodput_rps = sum(meets(t, slo) for t in finished) / duration
        summary.slo_attainment = sum(meets(t, slo) for t in traces) / len(traces)
    return summary


def mfu(
    *,
    peak_flops_per_s: float,
    flops_per_s: float | None = None,
    tokens_per_s: float | None = None,
    flops_per_token: float | None = None,
) -> float:
    """Model FLOPs utilisation = achieved FLOP/s ÷ peak FLOP/s; give ``flops_per_s`` or ``tokens_per_s`` and
    ``flops_per_token`` (≈ 2 · params). Not clipped: above 1 means the peak (or the FLOP count) is wrong."""
    _check_number("peak_flops_per_s", peak_flops_per_s, positive=True)
    token_form = (tokens_per_s is not None, flops_per_token is not None)
    if (flops_per_s is not None) == any(token_form) or any(token_form) != all(token_form):
        raise ValueError("give either flops_per_s, or both tokens_per_s and flops_per_token")
    if all(token_form):
        _check_number("tokens_per_s", tokens_per_s, non_negative=True)
        _check_number("flops_per_token", flops_per_token, positive=True)
        flops_per_s = tokens_per_s * flops_per_token
    else:
        _check_number("flops_per_s", flops_per_s, non_negative=True)
    return flops_per_s / peak_flops_per_s


def mbu(
    param_count: float,
    bytes_per_param: float,
    tokens_per_s: float,
    bandwidth_bytes_per_s: float,
    kv_bytes_per_token_step: float = 0.0,
) -> float:
    """Model bandwidth utilisation = (params · bytes/param + KV bytes read) · tokens/s ÷ peak bandwidth.

    Decode reads every weight and the sequence's KV cache once per step. ``tokens_per_s`` is per sequence
    (steps/s = 1 / TPOT); with a batch the weights are shared, so pass steps/s and the whole batch's KV
    bytes per step. Not clipped: above 1 means the bandwidth (or the byte count) is wrong.
    """
    _check_number("param_count", param_count, positive=True)
    _check_number("bytes_per_param", bytes_per_param, positive=True)
    _check_number("tokens_per_s", tokens_per_s, non_negative=True)
    _check_number("bandwidth_bytes_per_s", bandwidth_bytes_per_s, positive=True)
    _check_number("kv_bytes_per_token_step", kv_bytes_per_token_step, non_negative=True)
    bytes_per_step = param_count * bytes_per_param + kv_bytes_per_token_step
    return bytes_per_step * tokens_per_s / bandwidth_bytes_per_s
