"""The server's p50 TPOT against the engine's own decode step at the same batch, recorded for the ledger.

Issue 21's server goal: p50 TPOT at 8 req/s within 1.3× of the in-process *step time at the same batch*.
``benchmarks/server_overhead.py`` sends the same timed requests to the engine in-process, to the thread
server and to the process server; this module turns its rounds into the number the goal names:
- ``decode_batch``: the batch a run decoded at, from the client's token times alone: for each request, the
  mean number of requests decoding (between their first and last token) over its own decode span; the
  median over requests (the batch behind the p50 request);
- ``step_times``: the engine's decode step, timed in-process with ``batch`` requests decoding and nothing
  else (no arrivals, no prefill in the step);
- ``step_at``: that step at a fractional batch, linearly between the batches timed;
- ``build_record``: per round, each run's p50 TPOT and batch, and the median over rounds of
  p50 TPOT ÷ step at that run's batch (the steps timed once, or in every round beside its runs, so that a
  burst of load on a shared machine hits the numerator and the denominator alike); the ledger's ``ratio``
  is the default server's (the process server: ``python -m course_lib.serving.server`` runs the engine in
  a process of its own unless told ``--engine thread``; the thread server's is beside it).
The in-process *TPOT* (same arrivals, prefills of new arrivals in the steps) is recorded too, with the
script's older ≤ 10 % goal; it is not the goal's denominator. ``load_record`` reads the file back, its
fields checked. Introduced in 02_metrics_2_throughput_utilization.ipynb (the ledger).
"""

from __future__ import annotations

import concurrent.futures
import json
import statistics
import time
from pathlib import Path

OUT = "server-tpot-cpu.json"
RUNS = ("in-process", "thread server", "process server")
GOAL = 1.3


def decode_batch(results) -> float:
    """The median over requests (with ≥ 2 tokens) of the mean number of requests decoding during that
    request's decode span (first to last token, itself included). ``results``: ``LoadResult.results``."""
    spans = [(r.token_times[0], r.token_times[-1]) for r in results if len(r.token_times) >= 2]
    spans = [(a, b) for a, b in spans if b > a]
    if not spans:
        raise ValueError("results must hold at least one request with two or more token times")
    per = []
    for a, b in spans:
        covered = sum(max(0.0, min(b, d) - max(a, c)) for c, d in spans)
        per.append(covered / (b - a))
    return float(statistics.median(per))


def step_times(engine, batches, prompt_tokens: int = 32, steps: int = 16, repeats: int = 3) -> dict[int, float]:
    """{batch: median seconds of one decode step} of ``engine`` with ``batch`` requests decoding, nothing
    else in the step: the prompts prefilled first (untimed), then ``steps`` decode steps timed, ``repeats``
    times. The engine must be idle. The steps run on a worker thread, as ``loadgen.measure_engine``'s and
    the server's engine loop do (torch's CPU thread pool behaves differently on the main thread)."""

    batches = sorted(set(batches)) if not isinstance(batches, int) else [batches]
    if not batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batches):
        raise ValueError(f"batches must be ints >= 1, got {batches!r}")
    for name, v in (("prompt_tokens", prompt_tokens), ("steps", steps), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if engine.has_unfinished():
        raise RuntimeError("step_times needs an idle engine")
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="course-steps") as pool:
        return pool.submit(_time_steps, engine, batches, prompt_tokens, steps, repeats).result()


def _time_steps(engine, batches, prompt_tokens, steps, repeats) -> dict[int, float]:
    from course_lib.engine.sampling import SamplingParams

    prompt = list(range(100, 100 + prompt_tokens))
    out = {}
    for b in batches:
        times = []
        for _ in range(repeats):
            for _ in range(b):
                engine.add_request(prompt, SamplingParams(max_new_tokens=steps + 1, ignore_eos=True))
            started = 0
            while started < b:  # prefill (and each first token), untimed
                started += sum(ev.index == 0 for ev in engine.step())
            while engine.has_unfinished():
                t = time.perf_counter()
                ev = engine.step()
                dt = time.perf_counter() - t
                if len(ev) == b:
                    times.append(dt)
        if not times:
            raise RuntimeError(f"no decode step ran all {b} requests together; raise the engine's max_num_seqs")
        out[b] = float(statistics.median(times))
    return out


def step_at(steps: dict, batch: float) -> float:
    """The step time at ``batch``, linear between the two timed batches around it (``steps`` from
    ``step_times``); a batch outside the timed range is an error, not an extrapolation."""
    if not steps:
        raise ValueError("steps is empty: time some batches with step_times first")
    ks = sorted(int(k) for k in steps)
    vals = {int(k): float(v) for k, v in steps.items()}
    if not (ks[0] <= batch <= ks[-1]):
        raise ValueError(f"batch {batch:g} is outside the timed batches {ks[0]}..{ks[-1]}")
    lo = max(k for k in ks if k <= batch)
    hi = min(k for k in ks if k >= batch)
    if lo == hi:
        return vals[lo]
    w = (batch - lo) / (hi - lo)
    return vals[lo] * (1 - w) + vals[hi] * w


def batches_to_time(rounds: dict) -> list[int]:
    """The integer batches ``step_at`` needs for every run of ``rounds`` ({run: [LoadResult, ...]}, or
    {run: LoadResult} for one round)."""
    import math

    seen = [decode_batch(r.results) for runs in rounds.values() for r in (runs if isinstance(runs, list) else [runs])]

    return list(range(max(1, math.floor(min(seen))), math.ceil(max(seen)) + 1))


def build_record(rounds: dict, steps, meta: dict, goal: float = GOAL) -> dict:
    """The JSON-ready record: ``rounds`` ({run name: [LoadResult per round]}, "in-process" among them),
    ``steps`` ({batch: s} from ``step_times`` for every round, or a list of them, one per round),
    ``meta`` (machine, date, command, load, versions)."""
    if "in-process" not in rounds or len(rounds) < 2:
        raise ValueError(f"rounds needs 'in-process' and at least one server run, got {sorted(rounds)}")
    n = {len(v) for v in rounds.values()}
    if len(n) != 1 or 0 in n:
        raise ValueError(
            f"every run needs the same non-zero number of rounds, got { {k: len(v) for k, v in rounds.items()} }"
        )
    for k in ("machine", "date", "command"):
        if k not in meta:
            raise ValueError(f"meta has no {k!r}")
    n_rounds = n.pop()
    per_round_steps = list(steps) if isinstance(steps, (list, tuple)) else [steps] * n_rounds
    if len(per_round_steps) != n_rounds or not all(isinstance(s, dict) for s in per_round_steps):
        raise ValueError(f"steps must be one {{batch: s}} dict or a list of {n_rounds} (one per round), got {steps!r}")
    per_round = []
    for i in range(n_rounds):
        row = {}
        for name, runs in rounds.items():
            res = runs[i]
            b = decode_batch(res.results)
            tpot = res.p("tpot")
            at = step_at(per_round_steps[i], b)
            row[name] = {
                "tpot_p50_ms": tpot * 1e3,
                "ttft_p50_ms": res.p("ttft") * 1e3,
                "batch": b,
                "step_ms_at_batch": at * 1e3,
                "tpot_over_step": tpot / at,
            }
        per_round.append(row)
    summary = {}
    for name in rounds:
        summary[name] = {
            k: statistics.median(r[name][k] for r in per_round)
            for k in ("tpot_p50_ms", "batch", "step_ms_at_batch", "tpot_over_step")
        }
        if name != "in-process":
            summary[name]["tpot_over_in_process_tpot"] = statistics.median(
                r[name]["tpot_p50_ms"] / r["in-process"]["tpot_p50_ms"] for r in per_round
            )
    default = "process server" if "process server" in rounds else next(n for n in rounds if n != "in-process")
    ratio = summary[default]["tpot_over_step"]
    return {
        "what": "p50 TPOT of the course server vs the engine's own decode step at the batch the server ran",
        "goal": f"p50 TPOT at 8 req/s <= {goal:g} x the in-process decode step at the same batch (issue 21)",
        "meta": dict(meta),
        "step_ms": _ms(steps) if isinstance(steps, dict) else [_ms(s) for s in per_round_steps],
        "rounds": per_round,
        "median_over_rounds": summary,
        "ratio_run": default,
        "ratio": ratio,
        "at_most": goal,
        "met": ratio <= goal,
    }


def _ms(steps: dict) -> dict:
    return {str(k): v * 1e3 for k, v in sorted(steps.items())}


def load_record(path=None) -> dict:
    """The stored record, its fields checked (a missing one named)."""
    from course_lib.core.paths import data_dir

    path = Path(path) if path is not None else data_dir() / "measurements" / OUT
    d = json.loads(Path(path).read_text())
    for k in ("meta", "rounds", "step_ms", "ratio", "ratio_run", "median_over_rounds"):
        if k not in d:
            raise ValueError(f"{path} has no {k!r}: re-run python benchmarks/server_overhead.py")
    for k in ("machine", "date", "command"):
        if k not in d["meta"]:
            raise ValueError(f"{path}: meta has no {k!r}: re-run python benchmarks/server_overhead.py")
    return d


__all__ = ["GOAL", "OUT", "batches_to_time", "build_record", "decode_batch", "load_record", "step_at", "step_times"]
