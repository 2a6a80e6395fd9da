"""Traces: OpenTelemetry spans of each request's stages, exported in-process, and a latency waterfall.

A trace is a tree of spans, one per unit of work, each with a start, an end and its parent: here a request
span with guard, retrieve and generate below it, and generate's prefill and decode below that
(``pipeline.Pipeline.run(..., tracer=)``). ``make_tracer`` builds a private ``TracerProvider`` (the global one
is left alone, so re-running a cell does not stack processors) whose spans go to an ``InMemorySpanExporter``,
the SDK's exporter for tests; a deployment swaps it for an OTLP exporter to Jaeger, Tempo or a vendor, and the
spans are the same. ``waterfall`` lays each trace's spans out against its request's start, the view a tracing
UI draws, and ``plot_waterfall`` draws it. Introduced in 08_system_2_agents_observability_feedback.ipynb.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


def make_tracer(name: str = "course.system"):
    """(tracer, exporter): spans end up in ``exporter.get_finished_spans()`` as they finish."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer(name), exporter


@dataclass(frozen=True)
class Bar:
    trace: int  # the request's number, in order of its start
    name: str
    depth: int  # 0 for the request span
    start_ms: float  # from the request span's start
    duration_ms: float


def waterfall(spans) -> list[Bar]:
    """Every span as a bar against its trace's root span, traces in order of their start."""
    spans = list(spans)
    if not spans or not all(hasattr(s, "context") and hasattr(s, "start_time") for s in spans):
        raise ValueError(
            "spans must be a non-empty list of finished OpenTelemetry spans (exporter.get_finished_spans())"
        )
    by_trace = defaultdict(list)
    for s in spans:
        by_trace[s.context.trace_id].append(s)
    roots = []
    for tid, group in by_trace.items():
        root = [s for s in group if s.parent is None]
        if len(root) != 1:
            raise ValueError(f"trace {tid:x} has {len(root)} root spans; a request has one")
        roots.append((root[0].start_time, tid))
    bars = []
    for number, (_, tid) in enumerate(sorted(roots)):
        group = by_trace[tid]
        ids = {s.context.span_id: s for s in group}
        t0 = min(s.start_time for s in group)

        def depth(s) -> int:
            d = 0
            while s.parent is not None and s.parent.span_id in ids:
                s, d = ids[s.parent.span_id], d + 1
            return d

        for s in sorted(group, key=lambda s: (s.start_time, depth(s))):
            bars.append(Bar(number, s.name, depth(s), (s.start_time - t0) / 1e6, (s.end_time - s.start_time) / 1e6))
    return bars


def durations(bars: list[Bar]) -> dict[str, list[float]]:
    """Milliseconds per span name, over all traces."""
    if not isinstance(bars, list) or not all(isinstance(b, Bar) for b in bars):
        raise ValueError("bars must be a list of Bar (from waterfall)")
    out = defaultdict(list)
    for b in bars:
        out[b.name].append(b.duration_ms)
    return dict(out)


def plot_waterfall(bars: list[Bar], ax=None):
    """One row per span, requests stacked top to bottom, bars coloured by span name, a log-free ms axis."""
    import matplotlib.pyplot as plt

    if not bars or not all(isinstance(b, Bar) for b in bars):
        raise ValueError("bars must be a non-empty list of Bar (from waterfall)")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.28 * len(bars) + 1))
    names = list(dict.fromkeys(b.name for b in bars))
    colours = {n: f"C{i}" for i, n in enumerate(names)}
    labels = []
    for row, b in enumerate(bars):
        ax.barh(row, max(b.duration_ms, 0.02), left=b.start_ms, color=colours[b.name])
        labels.append(f"#{b.trace} {'  ' * b.depth}{b.name}")
    ax.set_yticks(range(len(bars)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the request's start")
    return ax


__all__ = ["Bar", "durations", "make_tracer", "plot_waterfall", "waterfall"]
