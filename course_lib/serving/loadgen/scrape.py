"""Reading a server's ``/metrics`` as a dashboard would: Prometheus histograms, their quantiles, a plot.

A load generator measures what the client sees; the server's own histograms (TTFT, inter-token latency)
say what the server saw, in buckets. ``histograms`` parses the exposition text with ``prometheus_client``'s
parser, ``quantile`` interpolates inside a bucket exactly as PromQL's ``histogram_quantile`` does (so it is
only as fine as the buckets), and ``plot_histograms`` draws the share of observations per bucket.
Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Histogram:
    name: str
    bounds: tuple[float, ...]  # upper bounds of the buckets, ascending, the last one +inf
    cumulative: tuple[float, ...]  # observations ≤ each bound (Prometheus buckets are cumulative)
    total: float  # sum of the observed values
    count: float  # number of observations

    def counts(self) -> list[float]:
        """Observations per bucket (not cumulative)."""
        return [c - p for c, p in zip(self.cumulative, (0.0, *self.cumulative[:-1]))]


def histograms(text: str, names) -> dict[str, Histogram]:
    """The histograms ``names`` (their base names, e.g. ``course_time_to_first_token_seconds``) in the
    Prometheus exposition ``text``, summed over label sets. A name that is absent raises, naming it."""
    if not isinstance(text, str):
        raise ValueError(f"text must be the /metrics exposition as a str, got {type(text).__name__}")
    names = [names] if isinstance(names, str) else list(names)
    found: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in names or family.type != "histogram":
            continue
        acc = found.setdefault(family.name, {"buckets": {}, "sum": 0.0, "count": 0.0})
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                acc["buckets"][bound] = acc["buckets"].get(bound, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                acc["sum"] += sample.value
            elif sample.name.endswith("_count"):
                acc["count"] += sample.value
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"no histogram named {missing} in the metrics text")
    out = {}
    for name, acc in found.items():
        bounds = tuple(sorted(acc["buckets"]))
        out[name] = Histogram(name, bounds, tuple(acc["buckets"][b] for b in bounds), acc["sum"], acc["count"])
    return out


def quantile(hist: Histogram, q: float) -> float:
    """PromQL's ``histogram_quantile(q, …)``: the bucket where rank q·count falls, interpolated linearly
    inside it (from 0 for the first bucket); the highest finite bound if the rank falls in +inf; nan if empty."""
    if not isinstance(q, (int, float)) or not 0 <= q <= 1:
        raise ValueError(f"q must be a number in [0, 1], got {q!r}")
    if hist.count <= 0:
        return math.nan
    rank = q * hist.count
    lower, below = 0.0, 0.0
    for bound, cum in zip(hist.bounds, hist.cumulative):
        if cum >= rank:
            if math.isinf(bound):
                return lower
            inside = cum - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 0.0)
        lower, below = bound, cum
    return lower


def plot_histograms(hists, ax=None, unit: float = 1e3, unit_name: str = "ms"):
    """Share of observations per bucket for each histogram, on a log axis of the buckets' upper bounds."""
    import matplotlib.pyplot as plt

    hists = list(hists.values()) if isinstance(hists, dict) else list(hists)
    if not hists:
        raise ValueError("hists must be a non-empty collection of Histogram (from histograms)")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.0, 3.2), dpi=90)
    for h in hists:
        finite = [(b, c) for b, c in zip(h.bounds, h.counts()) if not math.isinf(b)]
        if h.count > 0 and finite:
            xs = [b * unit for b, _ in finite]
            ys = [c / h.count for _, c in finite]
            ax.step(
                xs, ys, where="pre", label=f"{h.name} (n={h.count:.0f}, p50 {quantile(h, 0.5) * unit:.1f} {unit_name})"
            )
    ax.set_xscale("log")
    ax.set_xlabel(f"bucket upper bound ({unit_name})")
    ax.set_ylabel("share of observations")
    ax.legend(fontsize=7)
    return ax
