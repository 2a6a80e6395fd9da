"""One token with the KV cache vs recomputing it, on a real model: measured steps beside their roofline floors.

With the cache, the step that makes a sequence L tokens long is one token attending to L − 1 stored keys:
it streams every weight and the whole cache once for 2·params FLOPs, so it is bandwidth-bound (for the
chat model the weights are far larger than the last-level cache). Without it, the step recomputes all
L − 1 tokens: ≈ 2·params·(L − 1) FLOPs for the same weights read once, compute-bound past the ridge.
``step_rows`` times both steps on an engine at chosen lengths (the cache is filled to L − 1 slots without
a prefill: the values in it do not change the work) and sets each beside max(FLOPs / peak FLOP/s,
bytes / bandwidth) from the machine's measured peaks. Lengths above ``recompute_max`` are predicted only:
on a CPU a no-cache step there costs seconds. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from course_lib.kv.checks import check_int, check_ints
from course_lib.models.accounting import (
    ModelShape,
    attention_flops,
    decode_flops,
    decode_step_bytes,
    matmul_params,
    weights_read_per_step,
)


def recompute_step_flops(shape: ModelShape, length: int) -> float:
    """FLOPs of the no-cache step that makes the sequence ``length`` tokens long: a forward over the
    ``length − 1`` tokens so far, every projection on every token, the LM head on the last one only (the
    engine computes only the logits it samples from), causal attention over (n + 1)/2 keys on average."""
    check_int("length", length, 2)
    n = length - 1
    head = shape.vocab_size * shape.hidden_size
    return 2.0 * (matmul_params(shape) - head) * n + 2.0 * head + attention_flops(shape, n, 1) * (n + 1) / 2


def recompute_step_bytes(shape: ModelShape, length: int, dtype: str = "fp32") -> float:
    """Bytes the no-cache step must at least read: every weight once (``weights_read_per_step`` over the
    ``length − 1`` tokens). Activations are not counted: past the ridge the step is compute-bound anyway."""
    check_int("length", length, 2)
    return weights_read_per_step(shape, length - 1, dtype)


@dataclass(frozen=True)
class StepRow:
    """The step that makes the sequence ``length`` tokens long, with the cache and without (batch 1)."""

    length: int
    cached_s: float  # median measured
    cached_spread_s: tuple[float, float]  # (fastest, slowest) sample
    cached_flops: float
    cached_bytes: float
    recompute_s: float | None  # None: not measured (length > recompute_max)
    recompute_spread_s: tuple[float, float] | None
    recompute_flops: float
    recompute_bytes: float
    flop_rate: float  # the machine's measured peak FLOP/s used for the floors
    bandwidth: float  # bytes/s

    def floor_s(self, cached: bool) -> float:
        """Roofline floor: max(FLOPs / peak, bytes / bandwidth)."""
        f, b = (self.cached_flops, self.cached_bytes) if cached else (self.recompute_flops, self.recompute_bytes)
        return max(f / self.flop_rate, b / self.bandwidth)

    def bound(self, cached: bool) -> str:
        """Which roof sets the floor: 'bandwidth' or 'compute'."""
        f, b = (self.cached_flops, self.cached_bytes) if cached else (self.recompute_flops, self.recompute_bytes)
        return "compute" if f / self.flop_rate >= b / self.bandwidth else "bandwidth"

    @property
    def predicted_speedup(self) -> float:
        return self.floor_s(False) / self.floor_s(True)

    @property
    def speedup(self) -> float | None:
        """Measured: no-cache step ÷ cached step (None where the no-cache step was not run)."""
        return None if self.recompute_s is None else self.recompute_s / self.cached_s


def format_step_rows(rows, model: str = "") -> str:
    """``step_rows``'s rows as a table: measured median (spread), floor and its roof, speed-ups."""

    def cell(t, spread, floor, bound):
        if t is None:
            return f"{'not run':>22} {floor * 1e3:>9.1f} {bound[:4]:>5}"
        return f"{t * 1e3:>9.1f} ({spread[0] * 1e3:.0f}-{spread[1] * 1e3:.0f}) {floor * 1e3:>9.1f} {bound[:4]:>5}"

    head = f"{model}, batch 1: one step, ms (median (fastest-slowest)) against the roofline floor ms"
    lines = [
        head,
        f"{'L':>6} {'cache: measured':>22} {'floor':>9} {'roof':>5} {'no cache: measured':>22} {'floor':>9} "
        f"{'roof':>5} {'speed-up':>9} {'floor ratio':>11}",
    ]
    for r in rows:
        sp = "—" if r.speedup is None else f"{r.speedup:.1f}x"
        lines.append(
            f"{r.length:>6} {cell(r.cached_s, r.cached_spread_s, r.floor_s(True), r.bound(True))} "
            f"{cell(r.recompute_s, r.recompute_spread_s, r.floor_s(False), r.bound(False))} "
            f"{sp:>9} {r.predicted_speedup:>10.1f}x"
        )
    return "\n".join(lines)


def engine_shape(engine) -> ModelShape:
    """The ``ModelShape`` of an engine's model, named after its checkpoint folder."""
    config = engine.hf_model.config
    return ModelShape.from_config(config, name=Path(getattr(config, "_name_or_path", "") or "engine").name)


def step_rows(
    engine, lengths=(64, 256, 1024), recompute_max: int | None = None, repeats: int = 5, peaks=None, token: int = 7
) -> list[StepRow]:
    """Time, at each of ``lengths`` (sequence length after the step, prompt included), one decode step with
    the engine's KV cache holding ``length − 1`` tokens and one no-cache step recomputing them (the engine's
    ``NoCacheBackend``, as ``use_kv_cache=False`` runs it); median and spread of ``repeats`` timings after
    a warm-up. ``engine``: an idle ``Engine`` with a contiguous or paged cache and ``max_model_len`` ≥ the
    longest length. ``recompute_max``: longest length whose no-cache step is run (default: all); longer
    rows carry the floor only. ``peaks``: a ``MeasuredPeaks`` (default ``microbench.machine_peaks()``); its
    matmul peak in the engine's dtype and its bandwidth make the floors."""
    import torch

    from course_lib.core.dtypes import canonical
    from course_lib.engine.attention.base import AttentionBackend
    from course_lib.engine.engine import Engine
    from course_lib.engine.generation import swap_backend
    from course_lib.measure.bench import benchmark

    if not isinstance(engine, Engine):
        raise ValueError(f"engine must be a course_lib.engine.Engine, got {type(engine).__name__}")
    if engine.has_unfinished():
        raise ValueError("engine has unfinished requests; step_rows needs an idle engine")
    lengths = sorted(set(check_ints("lengths", lengths, 2)))
    if lengths[-1] > engine.config.max_model_len:
        raise ValueError(
            f"lengths must be <= the engine's max_model_len {engine.config.max_model_len}, got {lengths[-1]}"
        )
    recompute_max = lengths[-1] if recompute_max is None else check_int("recompute_max", recompute_max, 2)
    check_int("repeats", repeats)
    check_int("token", token, 0)
    if peaks is None:
        from course_lib.measure.microbench import machine_peaks

        peaks = machine_peaks()
    shape, dtype = engine_shape(engine), canonical(engine.model.dtype)
    rate, bw = peaks.peak_flops(dtype), peaks.bandwidth
    kv: AttentionBackend = engine.backend
    g = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for L in lengths:
            n = L - 1
            h = kv.allocate()
            try:
                kv.append(h, n)  # L − 1 slots "cached" (zeros: the work does not depend on the values)

                def cached(h=h, n=n):
                    kv.append(h, 1)
                    engine.forward([h], [[token]], [n])
                    kv.truncate(h, n)

                c = benchmark(cached, warmup=1, repeats=repeats, device=engine.device, peaks=False)
            finally:
                kv.free(h)
            r = None
            if L <= recompute_max:
                ids = torch.randint(0, shape.vocab_size, (n,), generator=g).tolist()
                with swap_backend(engine, False):
                    nc = engine.backend

                    def recompute(ids=ids, n=n, nc=nc):
                        h = nc.allocate()
                        nc.append(h, n)
                        engine.forward([h], [ids], [0], [True])  # logits of the last token only
                        nc.free(h)

                    r = benchmark(recompute, warmup=1, repeats=repeats, device=engine.device, peaks=False)
            rows.append(
                StepRow(
                    L,
                    c.median_s,
                    (min(c.samples_s), max(c.samples_s)),
                    decode_flops(shape, n),
                    decode_step_bytes(shape, n, 1, dtype),
                    None if r is None else r.median_s,
                    None if r is None else (min(r.samples_s), max(r.samples_s)),
                    recompute_step_flops(shape, L),
                    recompute_step_bytes(shape, L, dtype),
                    rate,
                    bw,
                )
            )
    return rows
