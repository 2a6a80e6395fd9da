"""Splitting a real model over GPUs: memory per device and decode-step time under tensor × pipeline parallelism.

``memory_per_device`` says whether a shard fits in the GPU's memory (datasheet GB read as GiB, 2**30 bytes,
as chapter 01 does): the layers / (tp · pp), the embedding and LM head on the first and last stage — split
over tp by vocabulary rows (vLLM's VocabParallelEmbedding / ParallelLMHead) or replicated on every rank
(``vocab_parallel=False``, as the course's own TP code does) — plus the KV cache split by layers over pp and
by KV heads over tp. ``estimate`` combines the roofline time of a shard's decode step (datasheet peaks;
decode is bandwidth-bound on the weights, so TP divides the bytes each GPU reads) with its communication on
a link of ``course_lib.parallel.interconnects``: Megatron-LM's two all-reduces per layer for TP
(latency-bound: a few KB each), one activation send per stage boundary for PP, no overlap assumed. Its
``step_s`` is the steady state of a serving engine's decode with m micro-batches in flight across steps
(no fill and drain per step: that is the one-batch GPipe ``bubble``). ``parallel_plan`` tries every
(tp, pp) of a GPU count (e.g. Llama-3-70B on 8× H100) and ``format_plan`` tabulates it.
Introduced in 07_parallelism.ipynb.
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
    """Bytes one GPU holds under TP × PP (the busiest one: a first or last stage, with the embedding or head)."""

    weights: float
    kv: float
    capacity: float  # the GPU's memory in bytes (datasheet GB as GiB)
    vocab_bytes: float = 0.0  # of ``weights``: the embedding and LM head rows this GPU holds

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
    vocab_parallel: bool = True,
) -> MemoryPerDevice:
    """The busiest GPU's bytes: the layers / (tp · pp), plus the embedding and LM head (both on the one stage
    when pp = 1; the larger of the two on an end stage otherwise), divided by tp when ``vocab_parallel``
    (vLLM), whole on every rank when not; plus the KV cache of ``batch`` sequences of ``context_len``
    tokens, split by layers over ``pp`` and by KV heads over ``tp`` — but a KV head cannot be split: with
    tp > num_kv_heads each KV head is replicated, so the KV share stops shrinking at tp = num_kv_heads."""
    from course_lib.core.dtypes import dtype_bytes
    from course_lib.measure.costs import check_positive_int
    from course_lib.models.accounting import kv_bytes_per_token, weight_bytes

    shape, spec = _shape(model), _gpu(gpu)
    tp, pp = _degree("tp", tp), _degree("pp", pp)
    check_positive_int("batch", batch)
    check_positive_int("context_len", context_len)
    if not isinstance(vocab_parallel, bool):
        raise ValueError(f"vocab_parallel must be True or False, got {vocab_parallel!r}")
    table = shape.vocab_size * shape.hidden_size * dtype_bytes(dtype)  # one (V, D) matrix
    embed, head = table, (0.0 if shape.tie_embeddings else table)
    body = weight_bytes(shape, dtype) - embed - head
    ends = embed + head if pp == 1 else max(embed, head)  # a tied head sits with the embedding: stage 0 and last
    vocab = ends / tp if vocab_parallel else ends
    kv_total = kv_bytes_per_token(shape, dtype) * context_len * batch
    kv = kv_total / (pp * min(tp, shape.num_kv_heads))
    return MemoryPerDevice(body / (tp * pp) + vocab, kv, spec.memory_gb * 2**30, vocab)


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
        """Steady-state decode: the time for every micro-batch to get its next token, with m micro-batches
        in flight across steps (a serving engine starts micro-batch j's next step as soon as its token is
        back; no fill and drain per step). A stage is busy m · stage_s per round; one micro-batch's round
        trip through the pp stages and back takes pp · (stage_s + p2p_s); the slower of the two sets the pace.
        It is also each sequence's time per output token: pipelining never lowers it below ``latency_s``."""
        if self.pp == 1:
            return self.micro_batches * self.stage_s
        return max(self.micro_batches * self.stage_s, self.pp * (self.stage_s + self.p2p_s))

    @property
    def decode_idle(self) -> float:
        """Share of a steady-state decode round each stage idles: 1 − m · stage_s / step_s; with free hand-offs
        1 − m / pp while m < pp (m = 1 on 2 stages: 0.5 by construction), 0 from m = pp on."""
        return 1 - self.micro_batches * self.stage_s / self.step_s

    @property
    def bubble(self) -> float:
        """Idle fraction of ONE batch pushed through once (a prefill, GPipe fill and drain): (pp − 1) / (m + pp − 1)."""
        return (self.pp - 1) / (self.micro_batches + self.pp - 1)

    @property
    def tokens_per_s(self) -> float:
        """Steady-state decode throughput: batch tokens per ``step_s``."""
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
    vocab_parallel: bool = True,
) -> ParallelEstimate:
    """Decode-step time of ``model`` under tensor degree ``tp`` and pipeline degree ``pp``.

    Each stage holds layers / pp; each GPU of a stage 1 / tp of them. Compute: the roofline time
    (max of FLOPs / peak and bytes / bandwidth, datasheet peaks of ``gpu``) of 1 / (tp · pp) of a decode
    step's FLOPs and bytes (KV bytes split as in ``memory_per_device``) for one micro-batch. TP
    communication (Megatron-LM: one all-reduce after attention, one after the MLP): 2 · layers / pp
    all-reduces of micro-batch · hidden · bytes over tp ranks. PP: one send of micro-batch · hidden ·
    bytes between stages. ``vocab_parallel`` (vLLM): the LM head's read is split over tp too, at the cost of
    one more all-reduce (the embedding) and an all-gather of the logits per step; replicated (False): every
    rank reads the whole head. No overlap of communication with compute is assumed."""
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
    head = shape.vocab_size * shape.hidden_size * dtype_bytes(dtype)  # the LM head, read whole every step
    weights = weights_read_per_step(shape, mb, dtype)
    step_bytes = (weights - head) / tp + head / (tp if vocab_parallel else 1) + kv
    flops = decode_flops(shape, context_len, mb) / tp
    compute = min_time(flops / pp, step_bytes / pp, spec.peak_flops(spec.best_dtype(dtype)), spec.bandwidth)
    message = mb * shape.hidden_size * dtype_bytes(dtype)  # (micro-batch, hidden) activations
    layers_per_stage = shape.num_layers / pp
    tp_comm = 2 * layers_per_stage * collective_time("all_reduce", message, tp, link_key) if tp > 1 else 0.0
    if tp > 1 and vocab_parallel:  # the embedding's all-reduce and the logits' all-gather, averaged over stages
        logits = mb * shape.vocab_size * dtype_bytes(dtype)
        tp_comm += (
            collective_time("all_reduce", message, tp, link_key) + collective_time("all_gather", logits, tp, link_key)
        ) / pp
    p2p = collective_time("send", message, 2, link_key) if pp > 1 else 0.0
    memory = memory_per_device(
        shape, tp, pp, batch=batch, context_len=context_len, dtype=dtype, gpu=spec, vocab_parallel=vocab_parallel
    )
    return ParallelEstimate(shape.name, tp, pp, batch, micro_batches, compute, tp_comm, p2p, memory)


def tp_time_per_token(model="llama-3-70b", tp: int = 8, link_key="nvlink4", batch: int = 1, dtype="bf16", **kw):
    """Tensor-parallel decode estimate (pp = 1): ``estimate(model, tp, 1, link_key, ...)``; ``.latency_s`` is TPOT."""
    return estimate(model, tp, 1, link_key, batch=batch, dtype=dtype, **kw)


def pp_time(model="llama-3-70b", pp: int = 8, link_key="nvlink4", batch: int = 1, micro_batches: int = 1, **kw):
    """Pipeline-parallel decode estimate (tp = 1): ``.latency_s`` per token, ``.step_s`` and ``.decode_idle``
    with ``micro_batches`` in flight (``.bubble``: one batch's fill and drain). In decode every micro-batch
    re-reads its stage's weights, so pipelining raises throughput only where the step is not bandwidth-bound,
    and never lowers one token's latency."""
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
    vocab_parallel: bool = True,
) -> list[ParallelEstimate]:
    """Every (tp, pp) from ``degrees`` with tp · pp ≤ ``n_gpus`` (e.g. Llama-3-70B on 8× H100)."""
    _degree("n_gpus", n_gpus)
    shape = _shape(model)
    out = []
    for pp in degrees:
        for tp in degrees:
            if tp * pp <= n_gpus and shape.num_heads % tp == 0 and pp <= shape.num_layers:
                out.append(
                    estimate(
                        shape,
                        tp,
                        pp,
                        link_key,
                        batch=batch,
                        context_len=context_len,
                        dtype=dtype,
                        gpu=gpu,
                        vocab_parallel=vocab_parallel,
                    )
                )
    return out


def format_plan(plan: list[ParallelEstimate]) -> str:
    """A table of a ``parallel_plan``: memory per GPU, whether it fits, token latency and its comm share."""
    if not plan:
        raise ValueError("plan must be a non-empty list of ParallelEstimate (from parallel_plan)")
    head = f"{'tp':>3}{'pp':>4}{'GiB/GPU':>9}{'fits':>6}{'TPOT':>11}{'comm':>7}{'tok/s':>9}"
    lines = [f"{plan[0].model}, batch {plan[0].batch}", head, "-" * len(head)]
    for e in plan:
        lines.append(
            f"{e.tp:>3}{e.pp:>4}{e.memory.total / 2**30:>9.1f}{'yes' if e.memory.fits else 'no':>6}"
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
