"""The scale model swept over request rates for the notebook: one row per (setup, rate) with TTFT / TPOT
percentiles, SLO attainment and goodput per GPU, and DistServe's goodput (the highest rate that meets the
SLO). Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC

from course_lib.measure.metrics import SLO
from course_lib.serving.disagg.chunked import simulate_colocated_chunked
from course_lib.serving.disagg.simulate import SimConfig, simulate_colocated, simulate_disaggregated


def sweep_rates(
    cfg: SimConfig,
    rates: SequenceABC[float],
    setups: SequenceABC[tuple[int, int] | int] = (2, (1, 1)),
    slo: SLO | None = None,
) -> list[dict]:
    """One row per (setup, rate): TTFT/TPOT percentiles, attainment and goodput per GPU under ``slo``. A setup
    is an int (colocated GPUs, prefill-first), ("chunked", GPUs, token budget) (colocated with chunked
    prefill) or (prefill GPUs, decode GPUs); compare setups with the same GPU count."""
    rates = list(rates)
    if not rates or any(not isinstance(r, (int, float)) or isinstance(r, bool) or not r > 0 for r in rates):
        raise ValueError(f"rates must be a non-empty list of positive requests/s, got {rates!r}")
    rows = []
    for s in setups:
        for r in rates:
            if isinstance(s, int) and not isinstance(s, bool):
                res = simulate_colocated(cfg, r, s)
            elif isinstance(s, tuple) and len(s) == 3 and s[0] == "chunked":
                res = simulate_colocated_chunked(cfg, r, s[1], s[2])
            elif isinstance(s, tuple) and len(s) == 2 and not any(isinstance(v, str) for v in s):
                res = simulate_disaggregated(cfg, r, *s)
            else:
                raise ValueError(
                    "each setup must be an int (colocated GPUs), ('chunked', GPUs, token budget) or "
                    f"(prefill, decode), got {s!r}"
                )
            rows.append(res.row(slo))
    return rows


def max_goodput_per_gpu(rows: list[dict], setup: str, target: float = 0.9) -> float:
    """DistServe's goodput: the highest swept rate at which ≥ ``target`` of requests meet the SLO, per GPU
    (0 if none does). ``rows`` from ``sweep_rates`` with an ``slo``."""
    if not 0 < target <= 1:
        raise ValueError(f"target must be a fraction in (0, 1], got {target!r}")
    mine = [r for r in rows if r["setup"] == setup]
    if not mine or "attainment" not in mine[0]:
        raise ValueError(f"rows must come from sweep_rates(..., slo=...) and include setup {setup!r}")
    ok = [r["rate"] / r["gpus"] for r in mine if r["attainment"] >= target]
    return max(ok, default=0.0)


def side_by_side(rows: list[dict], rate: float) -> str:
    """A table of every setup at one swept ``rate``: TTFT and TPOT p50 / p99 (ms) and SLO attainment."""
    mine = [r for r in rows if r["rate"] == rate]
    if not mine:
        raise ValueError(f"rate must be one of the swept rates {sorted({r['rate'] for r in rows})}, got {rate!r}")
    lines = [
        f"at {rate:g} req/s: {'setup':<30} {'TTFT p50':>9} {'p99':>7} {'TPOT p50':>9} {'p99':>6}   in SLO",
    ]
    for r in mine:
        att = f"{r['attainment']:>7.0%}" if "attainment" in r else ""
        lines.append(
            f"{'':<{len(f'at {rate:g} req/s: ')}}{r['setup']:<30} {r['ttft_p50'] * 1e3:>9.0f} {r['ttft_p99'] * 1e3:>7.0f}"
            f" {r['tpot_p50'] * 1e3:>9.2f} {r['tpot_p99'] * 1e3:>6.2f} {att}"
        )
    return "\n".join(lines)


def goodput_margin(rows: list[dict], setup: str, baseline: str, target: float = 0.9) -> float:
    """``max_goodput_per_gpu`` of ``setup`` minus that of ``baseline`` (req/s per GPU; > 0: ``setup`` serves
    more within the SLO on the swept grid)."""
    return max_goodput_per_gpu(rows, setup, target) - max_goodput_per_gpu(rows, baseline, target)
