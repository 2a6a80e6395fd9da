"""Calibrating the cost model on this machine: whole ``engine.step()`` calls timed over a grid of prefill
tokens and decode rows (``measure_step_times``), the fit to their medians (``calibrate``), and a cache of
the result per model and machine (``load_or_calibrate``). ``record_batches`` spies on a scheduler to learn
each step's shape. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import dataclasses
import platform
import statistics
import time
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from pathlib import Path

from course_lib.engine.sampling import SamplingParams
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.serving.simulator.cost_model import CostModel, StepShape, fit_cost_model, step_shape


@dataclass(frozen=True)
class CalibrationPoint:
    shape: StepShape
    samples_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)


def record_batches(engine, sink: list) -> None:
    """Record (shape, sequences, tokens) of every batch this engine's scheduler returns (this instance only)."""
    schedule = engine.scheduler.schedule

    def recorded(*args, **kwargs):
        batch = schedule(*args, **kwargs)
        if batch.seqs:
            sink.append((step_shape(batch), len(batch), batch.total_tokens))
        return batch

    engine.scheduler.schedule = recorded


def _model_key(engine) -> str:
    cfg = engine.hf_model.config
    name = Path(str(getattr(cfg, "_name_or_path", "") or "model")).name or "model"
    return f"{name}-L{cfg.num_hidden_layers}-H{cfg.hidden_size}-{str(engine.model.dtype).removeprefix('torch.')}"


def measure_step_times(
    engine,
    pool: SequenceABC[int],
    *,
    decode_rows: SequenceABC[int] = (0, 1, 4, 8, 16),
    prefill_tokens: SequenceABC[int] = (0, 64, 256, 512),
    context_lens: SequenceABC[int] = (32, 256),
    repeats: int = 3,
) -> list[CalibrationPoint]:
    """Time whole ``engine.step()`` calls (schedule, forward, sample, postprocess) over a grid: ``rows``
    sequences decoding with prompts of ``context_len`` tokens, plus one new prompt of ``p`` tokens in the
    same step (p = 0: decode only). The first pass over the grid is a warm-up and is thrown away."""
    from course_lib.engine import Engine

    rows_grid = sorted({int(r) for r in decode_rows})
    pre_grid = sorted({int(p) for p in prefill_tokens})
    if min(rows_grid) < 0 or min(pre_grid) < 0 or not any(pre_grid) or max(rows_grid) == 0:
        raise ValueError("decode_rows and prefill_tokens must be ints ≥ 0, each with at least one positive value")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    steps_needed = (repeats + 1) * len(pre_grid) + 2
    cfg = SchedulerConfig(
        max_num_seqs=max(rows_grid) + 1,
        max_num_batched_tokens=max(max(pre_grid) + max(rows_grid), max(rows_grid) * max(context_lens)),
        chunked_prefill=False,
    )
    eng = Engine(engine.hf_model, engine.tokenizer, device=engine.device, config=cfg)
    shapes: list[tuple[StepShape, int, int]] = []
    record_batches(eng, shapes)
    samples: dict[tuple[int, int, int], list[tuple[StepShape, float]]] = {}
    combos = [(0, 0)] + [(r, c) for r in rows_grid if r > 0 for c in context_lens]
    for rows, ctx in combos:
        for i in range(rows):
            eng.add_request(
                list(pool[i * 7 : i * 7 + ctx]), SamplingParams(max_new_tokens=steps_needed + 2, ignore_eos=True)
            )
        while any(s.num_output_tokens == 0 for s in eng.scheduler.running) or eng.scheduler.waiting:
            eng.step()  # prefill the decoders (not timed)
        for rep in range(repeats + 1):
            for p in pre_grid:
                if p == 0 and rows == 0:
                    continue
                if p:
                    eng.add_request(list(pool[1000 : 1000 + p]), SamplingParams(max_new_tokens=1, ignore_eos=True))
                t0 = time.perf_counter()
                eng.step()
                dt = time.perf_counter() - t0
                if rep > 0:
                    samples.setdefault((p, rows, ctx), []).append((shapes[-1][0], dt))
        for rid in list(eng._live):
            eng.abort(rid)
    out = []
    for got in samples.values():
        ctx_mean = round(statistics.fmean(sh.decode_context for sh, _ in got))
        shape = StepShape(got[0][0].prefill_tokens, got[0][0].decode_rows, ctx_mean)
        out.append(CalibrationPoint(shape, tuple(dt for _, dt in got)))
    return out


def calibrate(engine, pool: SequenceABC[int], *, use_context: bool | None = None, **grid) -> CostModel:
    """Measure step times on this machine (``measure_step_times``) and fit the cost model to their medians."""
    points = measure_step_times(engine, pool, **grid)
    meta = {
        "model": _model_key(engine),
        "machine": platform.processor() or platform.machine(),
        "threads": _threads(),
        "max_model_len": engine.config.max_model_len,
        "kv_layout": [engine.model.num_layers, engine.model.num_kv_heads, engine.model.head_dim],
        "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
        "points": [[*dataclasses.astuple(p.shape), p.median_s] for p in points],
    }
    return fit_cost_model(
        [(*dataclasses.astuple(p.shape), p.median_s) for p in points], use_context=use_context, meta=meta
    )


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def calibration_path(engine) -> Path:
    """Where ``load_or_calibrate`` caches this engine's cost model: under ``corpus.cache_dir()/serving``."""
    from course_lib.models.corpus import cache_dir

    return cache_dir() / "serving" / f"cost-{_model_key(engine)}-{platform.machine()}-{_threads()}t.json"


def load_or_calibrate(engine, pool: SequenceABC[int], *, path: str | Path | None = None, refresh: bool = False, **grid):
    """The cached cost model for this engine and machine, or a fresh calibration (then cached)."""
    path = Path(path) if path is not None else calibration_path(engine)
    if path.exists() and not refresh:
        return CostModel.load(path)
    model = calibrate(engine, pool, **grid)
    model.save(path)
    return model
