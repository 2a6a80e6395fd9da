"""Decode on the roofline, measured on the course engine: TPOT, MBU and where the batch curve bends.

A decode step of batch b reads every weight once (shared by the b sequences) plus each sequence's KV
cache, and does ≈ 2·params FLOPs per sequence: its intensity is ≈ 2b FLOPs per 4-byte fp32 weight. Left
of the ridge it is bandwidth-bound (TPOT ≈ bytes ÷ bandwidth, flat in b), right of it compute-bound
(TPOT grows ∝ b). That holds only when the bytes come from DRAM: a model that fits in the last-level
cache is overhead-bound instead (its floor is ops × per-op cost, ``floors``). ``time_decode_steps`` times
the engine's own ``step()`` over a static batch (the TPOT a user sees), ``DecodeStep`` turns one
measurement into MBU and a roofline ``Point``, and ``bend_batch`` finds where the measured TPOT curve
bends, to set beside the ridge batch the machine's peaks predict. Introduced in 01_bottlenecks_2_prefill_decode.ipynb.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from course_lib.core.memory import trim_heap
from course_lib.engine.layers import PackedLinear, SkinnyLinear
from course_lib.engine.sampling import SamplingParams
from course_lib.measure.costs import check_positive_int
from course_lib.measure.profiling import count_ops
from course_lib.measure.roofline import Point, check_positive
from course_lib.models.accounting import ModelShape, decode_flops, decode_step_bytes


@dataclass(frozen=True)
class DecodeStep:
    """Decode steps of one static batch, timed: ``step_s`` per step, the FLOPs and minimum bytes of one
    step (weights once + every sequence's KV cache, from ``accounting``, averaged over the timed steps)."""

    label: str
    batch: int
    context_len: float  # keys each sequence attends to, averaged over the timed steps
    step_s: tuple[float, ...]
    flops: float
    bytes: float

    def __post_init__(self) -> None:
        check_positive_int("batch", self.batch)
        check_positive("context_len", self.context_len)
        if not self.step_s:
            raise ValueError("step_s must hold at least one timed step")
        check_positive("step_s", list(self.step_s))
        check_positive("flops", self.flops)
        check_positive("bytes", self.bytes)

    @property
    def tpot_s(self) -> float:
        """Median seconds per decode step: the time per output token of every sequence in the batch."""
        return statistics.median(self.step_s)

    @property
    def spread(self) -> float:
        """(slowest − fastest step) ÷ median: how noisy the run was."""
        return (max(self.step_s) - min(self.step_s)) / self.tpot_s

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.tpot_s

    @property
    def gbps(self) -> float:
        """Minimum bytes of a step ÷ its median time, in GB/s."""
        return self.bytes / self.tpot_s / 1e9

    @property
    def gflops(self) -> float:
        return self.flops / self.tpot_s / 1e9

    def mbu(self, bandwidth: float) -> float:
        """Model bandwidth utilisation: bytes a step must read ÷ TPOT ÷ ``bandwidth`` (bytes/s). Not
        clipped: above 1 means the bytes came from a faster memory than ``bandwidth`` measures (a cache)."""
        return self.bytes / self.tpot_s / check_positive("bandwidth", bandwidth)

    def point(self, label: str | None = None) -> Point:
        """This measurement on a roofline."""
        return Point(label or self.label, self.flops, self.bytes, self.tpot_s)

    def floors(self, *, bandwidth: float, peak_flops: float, overhead_s: float = 0.0) -> dict[str, float]:
        """The three floors of this step in seconds: bytes ÷ bandwidth, FLOPs ÷ peak, and ``overhead_s``
        (ops × per-op cost: Horace He's third regime); the largest is what the step cannot beat."""
        if not isinstance(overhead_s, (int, float)) or not math.isfinite(overhead_s) or overhead_s < 0:
            raise ValueError(f"overhead_s must be a finite number of seconds >= 0, got {overhead_s!r}")
        return {
            "bandwidth-bound": self.bytes / check_positive("bandwidth", bandwidth),
            "compute-bound": self.flops / check_positive("peak_flops", peak_flops),
            "overhead-bound": float(overhead_s),
        }


def linear_path(engine, rows: int) -> str:
    """Which kernel the engine's matmuls use for a decode step of ``rows`` sequences: the native C step
    (``decode="auto"``/"native" where it takes the step: the course's GEMV inside one C call), the course's
    GEMV (``SkinnyLinear`` up to its ``gemv_rows``), oneDNN on the packed weight (``PackedLinear`` at every
    row count, ``SkinnyLinear`` up to its ``max_packed_rows``) or ``F.linear``."""
    check_positive_int("rows", rows)
    lins = [lin for _, lin in engine.model.linears()]
    fast = getattr(engine, "fast", None)
    if fast is not None and fast.mode == "native" and fast._native.why_not(engine.backend, rows, 1) is None:
        return "native C step"
    if lins and all(isinstance(lin, PackedLinear) for lin in lins):
        return "oneDNN packed"
    skinny = [lin for lin in lins if isinstance(lin, SkinnyLinear)]
    if skinny and rows <= min(lin.gemv_rows for lin in skinny):
        return "course GEMV"
    skinny = [lin for lin in skinny if lin.enabled]
    if skinny and rows <= min(lin.max_packed_rows for lin in skinny):
        return "oneDNN packed"
    return "F.linear"


def release_memory() -> int:
    """Collect garbage and hand freed heap memory back to the OS (glibc's ``malloc_trim``; elsewhere only
    the collection): call it after ``del engine``, so the next section starts from a smaller footprint.
    Returns this process's resident bytes afterwards (0 where /proc is absent)."""
    trim_heap()
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def _prompt(vocab: int, n: int, i: int) -> list[int]:
    """A deterministic prompt of ``n`` token ids, different for each sequence ``i`` (the content does
    not change a step's cost; distinct prompts keep any prefix cache out of it)."""
    return [1 + (7919 * i + 104_729 * j) % (vocab - 1) for j in range(n)]


def time_decode_steps(engine, *, batch: int, context_len: int, steps: int = 5, warmup: int = 1) -> DecodeStep:
    """Add ``batch`` requests of ``context_len`` prompt tokens to an idle ``engine``, prefill them in one
    step, then time ``warmup + steps`` decode steps of ``engine.step()`` (schedule, forward, sample,
    postprocess: the TPOT a user sees) and keep the last ``steps``. Every timed step must decode all
    ``batch`` sequences; the engine is idle again afterwards."""
    check_positive_int("batch", batch)
    check_positive_int("context_len", context_len)
    check_positive_int("steps", steps)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if engine.has_unfinished():
        raise ValueError("engine has unfinished requests: time_decode_steps needs an idle engine")
    cfg = engine.config
    if batch > cfg.max_num_seqs:
        raise ValueError(f"batch={batch} exceeds the engine's SchedulerConfig.max_num_seqs={cfg.max_num_seqs}")
    if batch * context_len > cfg.max_num_batched_tokens:
        raise ValueError(
            f"batch × context_len = {batch * context_len} prompt tokens exceed SchedulerConfig.max_num_batched_tokens="
            f"{cfg.max_num_batched_tokens}: the prefill would take several steps; raise it or shorten the context"
        )
    new_tokens = 1 + warmup + steps  # the prefill yields the first token, each decode step one more
    if context_len + new_tokens > cfg.max_model_len:
        raise ValueError(
            f"context_len + warmup + steps + 1 = {context_len + new_tokens} exceeds SchedulerConfig.max_model_len="
            f"{cfg.max_model_len}"
        )
    shape = ModelShape.from_config(engine.hf_model.config)
    dtype = str(engine.model.dtype).removeprefix("torch.")
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(_prompt(engine.model.vocab_size, context_len, i), params)
    if len(engine.step()) != batch:  # the prefill: one first token per sequence
        raise RuntimeError(
            f"the prefill step did not finish all {batch} prompts; is the engine's KV storage too small?"
        )
    samples = []
    for k in range(warmup + steps):
        t0 = time.perf_counter()
        n = len(engine.step())  # the step ends with .tolist(): the device is synchronised
        dt = time.perf_counter() - t0
        if n != batch:
            raise RuntimeError(f"decode step {k} ran {n} of {batch} sequences; raise max_num_seqs or the KV budget")
        if k >= warmup:
            samples.append(dt)
    if engine.has_unfinished():
        raise RuntimeError("requests left unfinished after the timed steps")
    # timed step k processes the token at position context_len + k and attends to context_len + k + 1 keys
    keys = [context_len + k + 1 for k in range(warmup, warmup + steps)]
    flops = statistics.fmean(decode_flops(shape, c, batch) for c in keys)
    moved = statistics.fmean(decode_step_bytes(shape, c, batch, dtype) for c in keys)
    return DecodeStep(f"decode b={batch}", batch, statistics.fmean(keys), tuple(samples), flops, moved)


def decode_sweep(engine, batches, *, context_len: int, steps: int = 5, warmup: int = 1) -> list[DecodeStep]:
    """``time_decode_steps`` for each batch size in ``batches`` (positive ints, increasing)."""
    batches = list(batches)
    if not batches or any(not isinstance(b, int) or isinstance(b, bool) or b <= 0 for b in batches):
        raise ValueError(f"batches must be a non-empty list of positive ints, got {batches!r}")
    if any(b2 <= b1 for b1, b2 in zip(batches, batches[1:])):
        raise ValueError(f"batches must be strictly increasing, got {batches!r}")
    return [time_decode_steps(engine, batch=b, context_len=context_len, steps=steps, warmup=warmup) for b in batches]


def count_decode_ops(engine, *, batch: int = 1, context_len: int = 16) -> int:
    """Torch ops one decode step of ``engine`` dispatches (``profiling.count_ops``) at ``batch``
    sequences of ``context_len`` prompt tokens: times a per-op cost, the step's overhead floor."""
    check_positive_int("batch", batch)
    check_positive_int("context_len", context_len)
    if engine.has_unfinished():
        raise ValueError("engine has unfinished requests: count_decode_ops needs an idle engine")
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    for i in range(batch):
        engine.add_request(_prompt(engine.model.vocab_size, context_len, i), params)
    engine.step()  # the prefill
    engine.step()  # one decode step first: a packed weight is made on its first use, not counted here
    n = count_ops(engine.step)
    while engine.has_unfinished():
        engine.step()
    return n


@dataclass(frozen=True)
class Bend:
    """A fit of TPOT(b) = max(floor_s, per_seq_s · b): flat, then proportional to the batch. ``batch`` is
    where the two lines cross (the measured ridge batch); None when no point lies on the rising line."""

    floor_s: float
    per_seq_s: float | None
    batch: float | None
    flat_points: int  # how many of the smallest batches the fit puts on the flat part


def bend_batch(batches, tpots) -> Bend:
    """Where a measured TPOT-vs-batch curve bends: the least-squares fit (in log time) of
    max(floor, c · b), over every split of the points into a flat part (the first k ≥ 1) and a
    rising part (the rest). A roofline predicts the bend at the ridge batch."""
    batches, tpots = list(batches), list(tpots)
    if len(batches) != len(tpots):
        raise ValueError(f"batches and tpots must have the same length, got {len(batches)} and {len(tpots)}")
    if len(batches) < 3:
        raise ValueError(f"bend_batch needs at least 3 points, got {len(batches)}")
    check_positive("batches", batches)
    check_positive("tpots", tpots)
    if any(b2 <= b1 for b1, b2 in zip(batches, batches[1:])):
        raise ValueError(f"batches must be strictly increasing, got {batches!r}")
    lb, lt = [math.log(b) for b in batches], [math.log(t) for t in tpots]
    best = None
    for k in range(len(batches), 0, -1):  # all flat first: a bend must earn its place
        log_a = statistics.fmean(lt[:k])
        log_c = statistics.fmean(t - b for t, b in zip(lt[k:], lb[k:])) if k < len(batches) else None
        err = sum((t - (log_a if log_c is None else max(log_a, log_c + b))) ** 2 for t, b in zip(lt, lb))
        if best is None or err < best[0] - 1e-12:
            best = (err, k, log_a, log_c)
    _, k, log_a, log_c = best
    if log_c is None:
        return Bend(math.exp(log_a), None, None, k)
    return Bend(math.exp(log_a), math.exp(log_c), math.exp(log_a - log_c), k)
