"""Tensor parallelism run and timed on this machine: greedy tokens from a TP group, and the decode step time.

``tp_generate`` launches a TP group of processes (``course_lib.parallel.launcher.launch``) and returns
each rank's greedy tokens, which must equal the single-process engine's. ``tp_step_times`` times decode
steps at one TP degree with the time inside all-reduce measured apart (``TPStepTimes``). Decode is
bandwidth-bound on weights, so TP divides the bytes each rank reads by p — but it adds 2·L latency-bound
all-reduces of a few KB per step; on a small CPU with gloo the collectives (and the processes fighting
for cores) cost more than the weight reads they save. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from course_lib.measure.bench import Timing
from course_lib.parallel.tp_model import tp_engine


@dataclass
class TPStepTimes:
    """Decode step time at one TP degree, with the time inside all-reduce measured apart (rank 0's view)."""

    world_size: int
    batch: int
    context: int
    threads_per_worker: int
    step: Timing  # one decode step (schedule → forward → sample → postprocess), rank 0
    allreduce: Timing  # seconds spent inside all-reduce during each of those steps, rank 0
    allreduce_calls_per_step: int
    allreduce_bytes_per_step: int  # payload: Σ bytes of the (B, D) tensors reduced
    rank_step_median_s: list[float]
    ops_per_step: int | None = None  # torch operators rank 0 dispatched in one decode step (all-reduces apart)
    allreduce_wait_s: float | None = None  # per call, median: how long the first rank to arrive waited for the last
    allreduce_pure_s: float | None = None  # per call, median: the call on the rank that arrived last (no waiting)

    @classmethod
    def from_ranks(cls, results: list[dict], batch: int, context: int, threads_per_worker: int) -> TPStepTimes:
        """Assemble what ``_step_worker`` returned on each rank (rank 0's samples, every rank's median)."""
        p, r0 = len(results), results[0]
        return cls(
            world_size=p,
            batch=batch,
            context=context,
            threads_per_worker=threads_per_worker,
            step=Timing(f"decode step, TP={p}", "cpu", tuple(r0["step"])),
            allreduce=Timing(f"all-reduce per step, TP={p}", "cpu", tuple(r0["allreduce"])),
            allreduce_calls_per_step=r0["calls"],
            allreduce_bytes_per_step=r0["bytes"],
            rank_step_median_s=[statistics.median(r["step"]) for r in results],
            ops_per_step=r0.get("ops"),
            **_wait_split([r["trace"] for r in results]),
        )

    @property
    def allreduce_share(self) -> float:
        """Median over steps of (all-reduce seconds / step seconds)."""
        return statistics.median(a / s for a, s in zip(self.allreduce.samples_s, self.step.samples_s))

    def __str__(self) -> str:
        return (
            f"TP={self.world_size} (batch {self.batch}, context {self.context}, {self.threads_per_worker} thread(s)/rank): "
            f"step {self.step.median_s * 1e3:.2f} ms, all-reduce {self.allreduce.median_s * 1e3:.2f} ms "
            f"({100 * self.allreduce_share:.0f}%, {self.allreduce_calls_per_step} calls, "
            f"{self.allreduce_bytes_per_step / 1e3:.1f} KB)"
        )


def _wait_split(traces: list[list]) -> dict:
    """From every rank's (op, start, end) all-reduce calls: the median wait of the earliest arrival for the
    latest (max start − min start) and the median call time of the latest arrival (the collective alone)."""
    if len(traces) < 2 or not traces[0] or any(len(t) != len(traces[0]) for t in traces):
        return {}
    waits, pure = [], []
    for calls in zip(*traces):
        starts = [c[1] for c in calls]
        last = max(range(len(calls)), key=lambda r: starts[r])
        waits.append(max(starts) - min(starts))
        pure.append(calls[last][2] - calls[last][1])
    return {"allreduce_wait_s": statistics.median(waits), "allreduce_pure_s": statistics.median(pure)}


def _count_ops(engine) -> int | None:
    """Torch operators one decode step dispatches (a TorchDispatchMode counter); None where it cannot count."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return None

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        engine.step()
    return Count.n


def _step_worker(
    rank: int, world_size: int, batch: int, context: int, repeats: int, warmup: int, model: str = "tiny-target"
) -> dict:
    """One rank of ``tp_step_times``: prefill ``batch`` prompts of ``context`` tokens, then time decode steps."""
    import torch.distributed as dist

    from course_lib.engine.sampling import SamplingParams
    from course_lib.engine.scheduler import SchedulerConfig

    max_len = context + warmup + repeats + 6
    cfg = SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=max(batch * max_len, 256), max_model_len=max_len)
    engine = tp_engine(rank, world_size, model, config=cfg)
    gen = torch.Generator().manual_seed(0)  # the same prompts on every rank
    params = SamplingParams(max_new_tokens=warmup + repeats + 3, ignore_eos=True)
    for b in range(batch):
        engine.add_request(torch.randint(0, engine.model.vocab_size, (context,), generator=gen).tolist(), params)
    engine.step()  # the prefill of all prompts (first tokens)
    barrier = dist.barrier if world_size > 1 else (lambda: None)
    for _ in range(warmup):
        engine.step()
    steps, comm_s, calls, nbytes, trace = [], [], 0, 0, []
    comm = getattr(engine.model, "comm", None)
    for _ in range(repeats):
        barrier()  # start every rank's step together: the timer measures the step, not the skew
        engine.model.reset_stats()
        if comm is not None:
            comm.trace = []
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
        ar = engine.model.comm.stats["all_reduce"]
        comm_s.append(ar.seconds)
        calls, nbytes = ar.calls, ar.payload_bytes
        trace += comm.trace if comm is not None else []
    if comm is not None:
        comm.trace = None
    barrier()
    ops = _count_ops(engine)  # one more step, counted (not timed)
    while engine.has_unfinished():
        engine.step()
    return {"step": steps, "allreduce": comm_s, "calls": calls, "bytes": nbytes, "trace": trace, "ops": ops}


def tp_step_times(
    world_size: int,
    batch: int = 4,
    context: int = 128,
    repeats: int = 10,
    *,
    model: str = "tiny-target",
    warmup: int = 3,
    threads_per_worker: int | None = None,
    timeout_s: float = 300.0,
) -> TPStepTimes:
    """Decode step time at TP = ``world_size`` on this machine, with the all-reduce time measured apart.

    Each rank gets ``threads_per_worker`` torch threads (default: the cores divided among the ranks, so
    TP 1 and TP 2 use the same cores). Runs under ``course_lib.parallel.launcher.launch``.
    """
    from course_lib.parallel.launcher import launch, threads_for

    if threads_per_worker is None:
        threads_per_worker = threads_for(world_size)
    results = launch(
        _step_worker,
        world_size,
        batch,
        context,
        repeats,
        warmup,
        model,
        threads_per_worker=threads_per_worker,
        timeout_s=timeout_s,
    )
    return TPStepTimes.from_ranks(results, batch, context, threads_per_worker)


def tp_generate_worker(
    rank: int,
    world_size: int,
    prompts: list[str],
    max_new_tokens: int = 8,
    sequence_parallel: bool = False,
    model: str = "tiny-target",
    with_stats: bool = False,
    vocab_parallel: bool = False,
):
    """Greedy generation on one TP rank (run it under ``launch``): every rank runs the same requests in
    lockstep and returns the same tokens; with ``with_stats`` {"tokens", "comm": {op: {calls, payload_bytes,
    sent_bytes}}}: what the rank's collectives were given over the whole run, from its own counters."""
    from dataclasses import asdict

    from course_lib.engine.sampling import SamplingParams

    torch.set_num_threads(1)
    engine = tp_engine(rank, world_size, model, sequence_parallel=sequence_parallel, vocab_parallel=vocab_parallel)
    engine.model.reset_stats()
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    tokens = [r.output_ids for r in engine.generate(prompts, params)]
    if not with_stats:
        return tokens
    return {"tokens": tokens, "comm": {op: asdict(st) for op, st in engine.model.comm.stats.items()}}


def tp_generate(
    prompts: list[str],
    world_size: int = 2,
    max_new_tokens: int = 8,
    sequence_parallel: bool = False,
    timeout_s=180.0,
    model: str = "tiny-target",
    with_stats: bool = False,
    vocab_parallel: bool = False,
) -> list:
    """Greedy tokens of ``prompts`` from a TP group of ``world_size`` processes: one list per rank (with
    ``with_stats``, one dict per rank with its collectives' counters too). The split is checked before any
    process starts. ``vocab_parallel``: the embedding and the head cut by vocabulary rows (``tp_vocab``)."""
    from course_lib.parallel.launcher import launch
    from course_lib.parallel.tp_load import check_split, model_config

    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    check_split(model_config(model), world_size)
    return launch(
        tp_generate_worker,
        world_size,
        list(prompts),
        max_new_tokens,
        sequence_parallel,
        model,
        with_stats,
        vocab_parallel,
        threads_per_worker=1,
        timeout_s=timeout_s,
    )


__all__ = ["TPStepTimes", "tp_generate", "tp_generate_worker", "tp_step_times"]
