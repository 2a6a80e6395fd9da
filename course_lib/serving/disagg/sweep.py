"""The scale model swept over request rates for the notebook: one row per (setup, rate) with TTFT / TPOT
percentiles, SLO attainment and goodput per GPU, and DistServe's goodput (the highest rate that meets the
SLO). Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC

from course_lib.measure.metrics import SLO
from course_lib.serving.disagg.simulate import SimConfig, simulate_colocated, simulate_disaggregated


def sweep_rates(
    cfg: SimConfig,
    rates: SequenceABC[float],
    setups: SequenceABC[tuple[int, int] | int] = (2, (1, 1)),
    slo: SLO | None = None,
) -> list[dict]:
    """One row per (setup, rate): TTFT/TPOT percentiles, attainment and goodput per GPU under ``slo``. A setup
    is an int (colocated GPUs) or (prefill GPUs, decode GPUs); compare setups with the same GPU count."""
    rates = list(rates)
    if not rates or any(not isinstance(r, (int, float)) or isinstance(r, bool) or not r > 0 for r in rates):
        raise ValueError(f"rates must be a non-empty list of positive requests/s, got {rates!r}")
    rows = []
    for s in setups:
        for r in rates:
            if isinstance(s, int) and not isinstance(s, bool):
                res = simulate_colocated(cfg, r, s)
            elif isinstance(s, tuple) and len(s) == 2:
                res = simulate_disaggregated(cfg, r, *s)
            else:
                raise ValueError(f"each setup must be an int (colocated GPUs) or (prefill, decode), got {s!r}")
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
