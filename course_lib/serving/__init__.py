"""Serving an LLM from the client's side: workloads to send (``workload``) and the per-token timing
of serving them, sweeps and latency fits (``client``). Introduced in 02_metrics.ipynb; grown in chapter 06."""

from course_lib.serving.client import (
    BatchRun,
    LatencyFit,
    TTFTPoint,
    fit_latency,
    latency_grid,
    serve,
    tpot_sweep,
    ttft_sweep,
    with_common_arrival,
)
from course_lib.serving.workload import Request, make_workload, prompt_of_length, prompt_pool

__all__ = [
    "BatchRun",
    "LatencyFit",
    "Request",
    "TTFTPoint",
    "fit_latency",
    "latency_grid",
    "make_workload",
    "prompt_of_length",
    "prompt_pool",
    "serve",
    "tpot_sweep",
    "ttft_sweep",
    "with_common_arrival",
]
