"""What a step costs, as the simulator's clock: step_time ≈ a + b·prefill_tokens + c·decode_rows
(+ d·Σ decode context), fitted to measured steps (``fit_cost_model``) or set from datasheet roofs
(``roofline_cost_model``). On a CPU a decode row costs little next to the fixed cost ``a`` (the weights are
read once per step whatever the batch: decode is bandwidth-bound), while every prefill token costs compute
(compute-bound), which is why batching decodes is nearly free and a long prefill stalls everyone decoding
beside it. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from course_lib.engine.scheduler import ScheduledBatch
from course_lib.measure.fitting import nonneg_lstsq


@dataclass(frozen=True)
class StepShape:
    """What one scheduled step holds, in the cost model's terms."""

    prefill_tokens: int  # prompt tokens (whole prompts, chunks, recomputation after preemption)
    decode_rows: int  # sequences generating one token
    decode_context: int  # Σ KV length (after the step) of the decode rows: what their attention reads

    @property
    def features(self) -> tuple[float, float, float, float]:
        return (1.0, float(self.prefill_tokens), float(self.decode_rows), float(self.decode_context))


def step_shape(batch: ScheduledBatch) -> StepShape:
    """The shape of a batch just returned by ``Scheduler.schedule`` (before the step updates the sequences)."""
    prefill = rows = context = 0
    for seq, n in zip(batch.seqs, batch.num_tokens):
        if n == 1 and seq.num_cached_tokens >= seq.num_prompt_tokens:
            rows += 1
            context += seq.num_cached_tokens + 1
        else:
            prefill += n
    return StepShape(prefill, rows, context)


@dataclass(frozen=True)
class CostModel:
    """step_time = a + b·prefill_tokens + c·decode_rows + d·decode_context, in seconds (least squares)."""

    a: float  # s, fixed cost of a step (weights streamed once, Python, sampling)
    b: float  # s per prefill token (compute-bound)
    c: float  # s per decode row
    d: float = 0.0  # s per token of decode context (attention reads the KV cache)
    rms_s: float = math.nan  # root-mean-square residual of the fit
    max_rel_err: float = math.nan  # largest |residual| / measured time over the fitted points
    n_points: int = 0
    meta: dict = field(default_factory=dict)  # machine, model, grid

    def __post_init__(self) -> None:
        for name in ("a", "b", "c", "d"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"CostModel.{name} must be a finite number, got {v!r}")

    def step_time(self, prefill_tokens: int, decode_rows: int, decode_context: int = 0) -> float:
        """Predicted seconds of one step (at least 1 µs)."""
        t = self.a + self.b * prefill_tokens + self.c * decode_rows + self.d * decode_context
        return max(t, 1e-6)

    def shape_time(self, shape: StepShape) -> float:
        return self.step_time(shape.prefill_tokens, shape.decode_rows, shape.decode_context)

    def batch_time(self, batch: ScheduledBatch) -> float:
        return self.shape_time(step_shape(batch))

    def describe(self) -> str:
        return (
            f"step ≈ {self.a * 1e3:.2f} ms + {self.b * 1e6:.1f} µs·prefill_tokens + {self.c * 1e6:.1f} µs·decode_rows"
            + (f" + {self.d * 1e9:.1f} ns·decode_context" if self.d else "")
            + (
                f"  (rms residual {self.rms_s * 1e3:.2f} ms, max rel err {self.max_rel_err:.0%}, {self.n_points} points)"
                if self.n_points
                else f"  (not fitted: {self.meta.get('source', 'given coefficients')})"
            )
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"a", "b", "c"} - set(d)
        if missing:
            raise ValueError(f"not a cost model: missing {sorted(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        return cls.from_dict(json.loads(Path(path).read_text()))


def fit_cost_model(
    points, use_context: bool | None = None, relative: bool = True, meta: dict | None = None
) -> CostModel:
    """Fit a + b·prefill + c·rows (+ d·context) to (prefill_tokens, decode_rows, decode_context, seconds)
    points with ``numpy.linalg.lstsq``. ``relative``: weight each point by 1/time, so a 3 ms decode step
    counts as much as a 300 ms prefill (a simulator replays thousands of the former). Every coefficient is
    kept ≥ 0 (``fitting.nonneg_lstsq``): a negative one has no physical meaning, work never saves time.
    ``use_context`` None: keep the context term only if it cuts the RMS relative residual by ≥ 10%."""
    arr = np.asarray([tuple(p) for p in points], dtype=float)
    if arr.ndim != 2 or arr.shape[1] != 4 or arr.shape[0] < 4 or not np.isfinite(arr).all():
        raise ValueError("points must be at least 4 finite (prefill_tokens, decode_rows, decode_context, s) tuples")
    if (arr[:, 3] <= 0).any():
        raise ValueError("step times must be > 0")
    X = np.column_stack([np.ones(len(arr)), arr[:, :3]])  # (N, 4)
    y = arr[:, 3]  # (N,)
    w = 1.0 / y if relative else np.ones_like(y)  # (N,)

    def fit(cols: list[int]) -> tuple[np.ndarray, float]:
        if np.linalg.matrix_rank(X[:, cols]) < len(cols):
            raise ValueError("points must vary prefill tokens and decode rows (the fit is otherwise underdetermined)")
        coef, _ = nonneg_lstsq(X[:, cols] * w[:, None], y * w)
        full = np.zeros(4)
        full[cols] = coef
        return full, float(np.sqrt(np.mean(((X @ full - y) * w) ** 2)))

    coef, err = fit([0, 1, 2])
    if use_context or (use_context is None and np.ptp(arr[:, 2]) > 0):
        coef4, err4 = fit([0, 1, 2, 3])
        if use_context or (err4 <= 0.9 * err and coef4[3] > 0):
            coef = coef4
    resid = X @ coef - y
    a, b, c, d = (float(v) for v in coef)
    rms = float(np.sqrt(np.mean(resid**2)))
    return CostModel(a, b, c, d, rms, float(np.max(np.abs(resid) / y)), len(arr), dict(meta or {}))


def roofline_cost_model(model: str = "llama-3-8b", gpu: str = "H100 SXM", dtype: str = "bf16") -> CostModel:
    """A GPU-shaped cost model from datasheet roofs (no measurement), to ask what a policy does on a real
    serving GPU: a = weight bytes / bandwidth (a decode step streams every weight once, whatever its batch),
    b = 2·matmul params / peak FLOP/s per prefill token (prefill is compute-bound), c = 0, and d = KV bytes per
    token / bandwidth (each decode row reads its own context). Lower bounds: real kernels reach 50-80%."""
    from course_lib.measure.hardware.datasheet import gpu_spec
    from course_lib.models.accounting import ModelShape, kv_bytes_per_token, matmul_params, weight_bytes

    shape, spec = ModelShape.from_name(model), gpu_spec(gpu)
    bw, flops = spec.bandwidth, spec.peak_flops(dtype)
    return CostModel(
        a=weight_bytes(shape, dtype) / bw,
        b=2 * matmul_params(shape) / flops,
        c=0.0,
        d=kv_bytes_per_token(shape, dtype) / bw,
        meta={
            "source": f"roofline of {model} on {gpu} ({dtype}), datasheet peaks",
            "max_model_len": shape.max_position,
        },
    )
