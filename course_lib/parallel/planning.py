"""Splitting a real model over GPUs: memory per device and decode-step time under tensor × pipeline parallelism.

``memory_per_device`` says whether a shard fits: weights / (tp · pp) plus the KV cache split by layers over
pp and by KV heads over tp. ``estimate`` combines the roofline time of a shard's decode step (datasheet
peaks; decode is bandwidth-bound on the weights, so TP divides the bytes each GPU reads) with its
communication on a link of ``course_lib.parallel.interconnects``: Megatron-LM's two all-reduces per layer
for TP (latency-bound: a few KB each), one activation send per stage boundary for PP, no overlap assumed.
``parallel_plan`` tries every (tp, pp) of a GPU count (e.g. Llama-3-70B on 8× H100) and ``format_plan``
tabulates it. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.parallel.alpha_beta import fmt_seconds
from course_lib.parallel.interconnects import collective_time


def _shape(model):
    from course_lib.models.accounting import ModelShape

    return model if isinstance(model, ModelShape) else ModelShape.from_name(model)


def _gpu(gpu):
    from course_lib.measure.hardware.datasheet import GpuSpec, gpu_spec

    return gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)


def _degree(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class MemoryPerDevice:
    """Bytes one GPU holds under TP × PP: its share of the weights and of the KV cache."""

    weights: float
    kv: float
    capacity: float  # the GPU's memory in bytes

    @property
    def total(self) -> float:
        return self.weights + self.kv

    @property
    def fits(self) -> bool:
        """Whether weights + KV fit in 90% of the GPU's memory (the rest: CUDA context, activations)."""
        return self.total <= 0.9 * self.capacity


def memory_per_device(
    model="llama-3-70b",
    tp: int = 1,
    pp: int = 1,
    *,
    batch: int = 1,
    context_len: int = 4096,
    dtype: str = "bf16",
    gpu="H100 SXM",
) -> MemoryPerDevice:
    """Weights / (tp · pp) + the KV cache of ``batch`` sequences of ``context_len`` tokens, split by layers
    over ``pp`` and by KV heads over ``tp`` — but a KV head cannot be split: with tp > num_kv_heads
    each KV head is replicated, so the KV share stops shrinking at tp = num_kv_heads."""
    from course_lib.measure.costs import check_positive_int
    from course_lib.models.accounting import kv_bytes_per_token, weight_bytes

    shape, spec = _shape(model), _gpu(gpu)
    tp, pp = _degree("tp", tp), _degree("pp", pp)
    check_positive_int("batch", batch)
    check_positive_int("context_len", context_len)
    kv_total = kv_bytes_per_token(shape, dtype) * context_len * batch
    kv = kv_total / (pp * min(tp, shape.num_kv_heads))
    return MemoryPerDevice(weight_bytes(shape, dtype) / (tp * pp), kv, spec.memory_gb * 1e9)


@dataclass(frozen=True)
class ParallelEstimate:
    """One decode step (one new token per sequence) of a model split over tp × pp GPUs."""

    model: str
    tp: int
    pp: int
    batch: int
    micro_batches: int
    compute_s: float  # roofline time of one stage's shard for one micro-batch
    tp_comm_s: float  # the stage's Megatron all-reduces for one micro-batch
    p2p_s: float  # sending one micro-batch's activations to the next stage
    memory: MemoryPerDevice

    @property
    def stage_s(self) -> float:
        return self.compute_s + self.tp_comm_s

    @property
    def latency_s(self) -> float:
        """Time per token of one sequence (TPOT): through every stage in turn, plus the hops between them."""
        return self.pp * self.stage_s + (self.pp - 1) * self.p2p_s

    @property
    def step_s(self) -> float:
        """Time for all micro-batches to get their token: (m + pp − 1) pipeline slots (GPipe schedule)."""
        return (self.micro_batches + self.pp - 1) * (self.stage_s + (self.p2p_s if self.pp > 1 else 0.0))

    @property
    def bubble(self) -> float:
        """Idle fraction of the pipeline schedule: (pp − 1) / (m + pp − 1)."""
        return (self.pp - 1) / (self.micro_batches + self.pp - 1)

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.step_s

    @property
    def comm_fraction(self) -> float:
        """Share of the token latency spent communicating."""
        return 1 - self.pp * self.compute_s / self.latency_s


def estimate(
    model="llama-3-70b",
    tp: int = 1,
    pp: int = 1,
    link_key="nvlink4",
    *,
    batch: int = 1,
    micro_batches: int = 1,
    context_len: int = 4096,
    dtype: str = "bf16",
    gpu="H100 SXM",
) -> ParallelEstimate:
    """Decode-step time of ``model`` under tensor degree ``tp`` and pipeline degree ``pp``.

    Each stage holds layers / pp; each GPU of a stage 1 / tp of them. Compute: the roofline time
    (max of FLOPs / peak and bytes / bandwidth, datasheet peaks of ``gpu``) of 1 / (tp · pp) of a decode
    step's FLOPs and bytes (KV bytes split as in ``memory_per_device``) for one micro-batch. TP
    communication (Megatron-LM: one all-reduce after attention, one after the MLP): 2 · layers / pp
    all-reduces of micro-batch · hidden · bytes over tp ranks. PP: one send of micro-batch · hidden ·
    bytes between stages. No overlap of communication with compute is assumed."""
    from course_lib.core.dtypes import dtype_bytes
    from course_lib.measure.costs import check_positive_int
    from course_lib.measure.roofline import min_time
    from course_lib.models.accounting import decode_flops, kv_bytes_per_token, weights_read_per_step

    shape, spec = _shape(model), _gpu(gpu)
    tp, pp, micro_batches = _degree("tp", tp), _degree("pp", pp), _degree("micro_batches", micro_batches)
    check_positive_int("batch", batch)
    check_positive_int("context_len", context_len)
    if shape.num_heads % tp:
        raise ValueError(f"tp={tp} must divide the {shape.num_heads} attention heads of {shape.name}")
    if pp > shape.num_layers:
        raise ValueError(f"pp={pp} exceeds the {shape.num_layers} layers of {shape.name}")
    if batch % micro_batches:
        raise ValueError(f"micro_batches={micro_batches} must divide batch={batch}")
    mb = batch // micro_batches
    kv = kv_bytes_per_token(shape, dtype) * context_len * mb / min(tp, shape.num_kv_heads)
    step_bytes = weights_read_per_step(shape, mb, dtype) / tp + kv
    flops = decode_flops(shape, context_len, mb) / tp
    compute = min_time(flops / pp, step_bytes / pp, spec.peak_flops(spec.best_dtype(dtype)), spec.bandwidth)
    message = mb * shape.hidden_size * dtype_bytes(dtype)  # (micro-batch, hidden) activations
    layers_per_stage = shape.num_layers / pp
    tp_comm = 2 * layers_per_stage * collective_time("all_reduce", message, tp, link_key) if tp > 1 else 0.0
    p2p = collective_time("send", message, 2, link_key) if pp > 1 else 0.0
    memory = memory_per_device(shape, tp, pp, batch=batch, context_len=context_len, dtype=dtype, gpu=spec)
    return ParallelEstimate(shape.name, tp, pp, batch, micro_batches, compute, tp_comm, p2p, memory)


def tp_time_per_token(model="llama-3-70b", tp: int = 8, link_key="nvlink4", batch: int = 1, dtype="bf16", **kw):
    """Tensor-parallel decode estimate (pp = 1): ``estimate(model, tp, 1, link_key, ...)``; ``.latency_s`` is TPOT."""
    return estimate(model, tp, 1, link_key, batch=batch, dtype=dtype, **kw)


def pp_time(model="llama-3-70b", pp: int = 8, link_key="nvlink4", batch: int = 1, micro_batches: int = 1, **kw):
    """Pipeline-parallel decode estimate (tp = 1): ``.latency_s`` per token, ``.step_s`` and ``.bubble`` for
    ``micro_batches`` in flight. In decode every micro-batch re-reads its stage's weights, so pipelining
    raises throughput only where the step is not bandwidth-bound, and never lowers one token's latency."""
    return estimate(model, 1, pp, link_key, batch=batch, micro_batches=micro_batches, **kw)


def parallel_plan(
    model="llama-3-70b",
    n_gpus: int = 8,
    link_key="nvlink4",
    *,
    gpu="H100 SXM",
    batch: int = 1,
    context_len: int = 4096,
    dtype: str = "bf16",
    degrees=(1, 2, 4, 8),
) -> list[ParallelEstimate]:
    """Every (tp, pp) from ``degrees`` with tp · pp ≤ ``n_gpus`` (e.g. Llama-3-70B on 8× H100)."""
    _degree("n_gpus", n_gpus)
    shape = _shape(model)
    out = []
    for pp in degrees:
        for tp in degrees:
            if tp * pp <= n_gpus and shape.num_heads % tp == 0 and pp <= shape.num_layers:
                out.append(
                    estimate(shape, tp, pp, link_key, batch=batch, context_len=context_len, dtype=dtype, gpu=gpu)
                )
    return out


def format_plan(plan: list[ParallelEstimate]) -> str:
    """A table of a ``parallel_plan``: memory per GPU, whether it fits, token latency and its comm share."""
    if not plan:
        raise ValueError("plan must be a non-empty list of ParallelEstimate (from parallel_plan)")
    head = f"{'tp':>3}{'pp':>4}{'GB/GPU':>9}{'fits':>6}{'TPOT':>11}{'comm':>7}{'tok/s':>9}"
    lines = [f"{plan[0].model}, batch {plan[0].batch}", head, "-" * len(head)]
    for e in plan:
        lines.append(
            f"{e.tp:>3}{e.pp:>4}{e.memory.total / 1e9:>9.1f}{'yes' if e.memory.fits else 'no':>6}"
            f"{fmt_seconds(e.latency_s):>11}{e.comm_fraction * 100:>6.0f}%{e.tokens_per_s:>9.1f}"
        )
    return "\n".join(lines)


__all__ = [
    "MemoryPerDevice",
    "ParallelEstimate",
    "estimate",
    "format_plan",
    "memory_per_device",
    "parallel_plan",
    "pp_time",
    "tp_time_per_token",
]
