"""Chapter 06's serving simulator: the engine's own scheduler, a bookkeeping KV cache, and a calibrated clock.

Replaying a trace on the real engine takes as long as the trace; a policy sweep over arrival rates would
take hours. The simulator keeps everything that decides *which* tokens run in a step (the very same
``Scheduler`` class, its budgets, its preemption, a KV backend that does the slot accounting of the real
one without tensors) and replaces the one thing that costs time, the forward, by a cost model fitted on
this machine:  step_time ≈ a + b·prefill_tokens + c·decode_rows (+ d·Σ decode context).

The parts: ``cost_model`` (the step-cost model, fitted or from datasheet roofs), ``calibrate`` (measuring
it on this machine, cached), ``backends`` (KV caches without tensors), ``virtual_clock`` (``simulate``),
``wall_clock`` (``run_real``, the same trace on an ``Engine``), ``replay`` (the ``RunResult`` both return)
and ``comparison`` (``compare`` sim against real, ``sweep`` policies across rates).
Introduced in 06_batching_serving.ipynb.
"""

from course_lib.serving.simulator.backends import KV_CACHES, SimContiguousBackend, SimPagedBackend, sim_backend
from course_lib.serving.simulator.calibrate import (
    CalibrationPoint,
    calibrate,
    calibration_path,
    load_or_calibrate,
    measure_step_times,
)
from course_lib.serving.simulator.comparison import SimVsReal, SweepPoint, compare, sweep
from course_lib.serving.simulator.cost_model import (
    CostModel,
    StepShape,
    fit_cost_model,
    roofline_cost_model,
    step_shape,
)
from course_lib.serving.simulator.replay import RunResult, StepRecord
from course_lib.serving.simulator.virtual_clock import simulate
from course_lib.serving.simulator.wall_clock import run_real

__all__ = [
    "KV_CACHES",
    "CalibrationPoint",
    "CostModel",
    "RunResult",
    "SimContiguousBackend",
    "SimPagedBackend",
    "SimVsReal",
    "StepRecord",
    "StepShape",
    "SweepPoint",
    "calibrate",
    "calibration_path",
    "compare",
    "fit_cost_model",
    "load_or_calibrate",
    "measure_step_times",
    "roofline_cost_model",
    "run_real",
    "sim_backend",
    "simulate",
    "step_shape",
    "sweep",
]
