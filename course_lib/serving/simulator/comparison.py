"""Simulation against measurement, and policies against each other: ``compare`` runs one trace on the real
engine and in the simulator and sets the metrics side by side (``SimVsReal``); ``sweep`` draws
throughput–latency and goodput curves per policy across arrival rates. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import math
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass

from course_lib.engine.scheduler import SchedulerConfig
from course_lib.measure.metrics import SLO
from course_lib.serving.simulator.cost_model import CostModel
from course_lib.serving.simulator.replay import RunResult
from course_lib.serving.simulator.virtual_clock import simulate
from course_lib.serving.simulator.wall_clock import run_real
from course_lib.serving.traces import Trace

COMPARED = ("throughput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")


@dataclass
class SimVsReal:
    """The same trace and policy, simulated and run: each metric and the ratio sim / real."""

    sim: RunResult
    real: RunResult

    def ratios(self) -> dict[str, float]:
        s, r = self.sim.metrics(), self.real.metrics()
        return {k: s[k] / r[k] if r[k] else math.nan for k in COMPARED}

    def within(self, tol: float = 0.2, keys=("throughput", "tpot_p50")) -> bool:
        """Do the simulated ``keys`` lie within ±``tol`` of the measured ones?"""
        rat = self.ratios()
        return all(abs(rat[k] - 1) <= tol for k in keys)

    def table(self) -> str:
        s, r, rat = self.sim.metrics(), self.real.metrics(), self.ratios()
        lines = [f"{'metric':<16}{'sim':>10}{'real':>10}{'sim/real':>10}"]
        for k in COMPARED:
            scale, unit = (1.0, "tok/s") if k == "throughput" else (1e3, "ms")
            lines.append(f"{k + ' ' + unit:<16}{s[k] * scale:>10.1f}{r[k] * scale:>10.1f}{rat[k]:>10.2f}")
        return "\n".join(lines)


def compare(
    engine,
    trace: Trace,
    config: SchedulerConfig,
    cost_model: CostModel,
    *,
    pool: SequenceABC[int] | None = None,
    kv_cache: str = "contiguous",
    slo: SLO | None = None,
    prefix_caching: bool = False,
) -> SimVsReal:
    """Run ``trace`` under ``config`` on the real engine and in the simulator (the same prompt ids)."""
    from course_lib.serving.workload import prompt_pool

    if pool is None:
        pool = prompt_pool(engine.tokenizer, trace.pool_tokens)
    kw = dict(pool=pool, kv_cache=kv_cache, slo=slo, prefix_caching=prefix_caching)
    real = run_real(engine, trace, config, **kw)
    sim = simulate(trace, real.config, cost_model, **kw)
    return SimVsReal(sim, real)


@dataclass(frozen=True)
class SweepPoint:
    policy: str  # the label given to the config
    rate: float  # requests/s
    mode: str  # "sim" or "real"
    metrics: dict


def sweep(
    trace: Trace,
    configs: dict[str, SchedulerConfig],
    rates: SequenceABC[float],
    cost_model: CostModel,
    *,
    slo: SLO | None = None,
    engine=None,
    real_rates: SequenceABC[float] = (),
    kv_cache: str = "contiguous",
) -> list[SweepPoint]:
    """Throughput, latency percentiles and goodput per policy across arrival rates: ``trace`` rescaled to
    each rate (``Trace.with_rate``) and simulated; also run on ``engine`` at ``real_rates`` (keep those few)."""
    if not configs:
        raise ValueError("configs must name at least one SchedulerConfig")
    rates = [float(r) for r in rates]
    if not rates or any(not r > 0 for r in rates):
        raise ValueError(f"rates must be positive numbers, got {rates!r}")
    if real_rates and engine is None:
        raise ValueError("real_rates needs an engine")
    pool = None
    if real_rates:
        from course_lib.serving.workload import prompt_pool

        pool = prompt_pool(engine.tokenizer, trace.pool_tokens)
    out = []
    for label, cfg in configs.items():
        for rate in rates:
            res = simulate(trace.with_rate(rate), cfg, cost_model, kv_cache=kv_cache, slo=slo, pool=pool)
            out.append(SweepPoint(label, rate, "sim", res.metrics()))
        for rate in real_rates:
            res = run_real(engine, trace.with_rate(rate), cfg, pool=pool, kv_cache=kv_cache, slo=slo)
            out.append(SweepPoint(label, float(rate), "real", res.metrics()))
    return out


def relative_errors(sim: dict, real: dict, keys=COMPARED) -> dict[str, float]:
    """(sim − real) / real per metric, from two ``RunResult.metrics()`` dicts (NaN where real is 0)."""
    return {k: (sim[k] - real[k]) / real[k] if real[k] else math.nan for k in keys}


def error_table(sim: dict, real: dict, keys=COMPARED) -> str:
    """Sim, real, the absolute error and the relative one per metric: a ratio alone hides how far off it is."""
    rel = relative_errors(sim, real, keys)
    lines = [f"  {'metric':<18}{'sim':>10}{'real':>10}{'sim − real':>12}{'error':>8}"]
    for k in keys:
        scale, unit = (1.0, "tok/s") if k == "throughput" else (1e3, "ms")
        lines.append(
            f"  {k + ' ' + unit:<18}{sim[k] * scale:>10.1f}{real[k] * scale:>10.1f}"
            f"{(sim[k] - real[k]) * scale:>+12.1f}{rel[k]:>+8.0%}"
        )
    return "\n".join(lines)
