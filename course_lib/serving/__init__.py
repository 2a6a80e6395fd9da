"""Serving an LLM from the client's side: workloads to send (``workload``) and the per-token timing
of serving them, sweeps and latency fits (``client``). Introduced in 02_metrics_1_latency.ipynb; grown in chapter 06."""

from course_lib.serving.client import (
    BatchRun,
    InterferenceRun,
    LatencyFit,
    TTFTPoint,
    fit_latency,
    latency_grid,
    prefill_interference,
    serve,
    tpot_sweep,
    ttft_sweep,
    with_common_arrival,
)
from course_lib.serving.workload import Request, make_workload, prompt_of_length, prompt_pool

__all__ = [
    "BatchRun",
    "InterferenceRun",
    "LatencyFit",
    "Request",
    "TTFTPoint",
    "fit_latency",
    "latency_grid",
    "make_workload",
    "prompt_of_length",
    "prefill_interference",
    "prompt_pool",
    "serve",
    "tpot_sweep",
    "ttft_sweep",
    "with_common_arrival",
]
