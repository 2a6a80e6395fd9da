"""Tensor parallelism (Megatron-LM) and sequence parallelism (Korthikanti et al.) on the engine's linear seam.

Tensor parallelism (Shoeybi et al. 2019) splits every layer's weights over p ranks so that each reads 1/p
of them per step, and pays for it with communication:
- attention is split by heads: rank r keeps H/p query heads and Hkv/p KV heads, so its ``qkv`` is
  *column-parallel* (its slice of output features, no communication: the input is replicated) and its
  KV cache holds only its Hkv/p heads;
- ``o`` and ``down`` are *row-parallel* (their slice of input features): each rank computes a partial sum
  of the full output and ONE all-reduce adds them, so a layer costs two all-reduces of (N, D);
- ``gate_up`` is column-parallel like ``qkv``; SwiGLU is elementwise, so it runs on the local slice;
- the embedding, the norms and the LM head are replicated (each rank computes the same logits).

Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models") removes the replicated work between the TP regions: each row-parallel all-reduce becomes a
reduce-scatter over tokens (rank r gets the summed rows of its token shard), the norms and residual adds
run on N/p tokens, and an all-gather rebuilds the (N, D) input of the next column-parallel linear. A ring
reduce-scatter plus a ring all-gather move exactly the bytes of one ring all-reduce, so SP costs no
extra communication and cuts the elementwise work (and activation memory) per rank to 1/p.

Decode is bandwidth-bound on weights, so TP divides the bytes each rank reads by p — but it adds 2·L
latency-bound all-reduces of a few KB per step. On a small CPU with gloo the collectives (and the
processes fighting for cores) cost more than the weight reads they save: ``tp_step_times`` measures it.
Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from course_lib.engine.layers import Linear, SkinnyLinear
from course_lib.engine.model import LlamaEngineModel, apply_rope, rms_norm
from course_lib.measure.bench import Timing

REDUCE_SCATTER_METHODS = ("auto", "native", "all_to_all", "all_reduce")


# ---------------------------------------------------------------- collectives, timed and counted
@dataclass
class OpStats:
    """What one kind of collective cost on this rank since the last ``reset``."""

    calls: int = 0
    payload_bytes: int = 0  # size of the full (N, D) tensor being reduced / gathered, summed over calls
    sent_bytes: float = 0.0  # what a ring algorithm sends per rank: all-reduce 2(p−1)/p·S, RS and AG (p−1)/p·S
    seconds: float = 0.0  # wall time inside the blocking call (includes waiting for the slower rank)


@dataclass
class Comm:
    """The three collectives TP and SP need, each wrapped with a timer and a byte counter.

    ``reduce_scatter``: "native" (``dist.reduce_scatter_tensor``; gloo has it from torch 2.x), "all_to_all"
    (each rank sends shard j of its partial sums to rank j and adds what it receives: the same (p−1)/p·S
    bytes as a ring reduce-scatter), "all_reduce" (all-reduce, then keep my rows: correct but twice the
    bytes) or "auto" (native, falling back to all_to_all where the backend lacks it). With
    ``world_size == 1`` every collective is the identity and nothing is sent.
    """

    rank: int
    world_size: int
    group: object = None
    reduce_scatter: str = "auto"
    timed: bool = True
    stats: dict[str, OpStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {self.world_size!r}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {self.rank!r}")
        if self.reduce_scatter not in REDUCE_SCATTER_METHODS:
            raise ValueError(f"reduce_scatter must be one of {REDUCE_SCATTER_METHODS}, got {self.reduce_scatter!r}")
        self.reset()

    def reset(self) -> None:
        self.stats = {op: OpStats() for op in ("all_reduce", "reduce_scatter", "all_gather")}

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stats.values())

    @property
    def sent_bytes(self) -> float:
        return sum(s.sent_bytes for s in self.stats.values())

    def _record(self, op: str, t0: float, x: torch.Tensor, payload: int, sent_factor: float) -> None:
        if x.is_cuda:
            torch.cuda.synchronize(x.device)  # the collective was launched, not finished
        s = self.stats[op]
        s.calls += 1
        s.seconds += time.perf_counter() - t0
        s.payload_bytes += payload
        s.sent_bytes += sent_factor * payload

    def _start(self, x: torch.Tensor) -> float:
        if x.is_cuda:
            torch.cuda.synchronize(x.device)  # do not bill the collective for the matmul before it
        return time.perf_counter()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over ranks, in place; returns x. Ring model: 2(p−1)/p · bytes(x) sent per rank."""
        p = self.world_size
        if p == 1:
            return x
        import torch.distributed as dist

        t0 = self._start(x)
        dist.all_reduce(x, group=self.group)
        self._record("all_reduce", t0, x, x.numel() * x.element_size(), 2 * (p - 1) / p)
        return x

    def all_gather_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's (n, ...) rows → every rank's, stacked in rank order: (p·n, ...). (p−1)/p · output sent."""
        p = self.world_size
        if p == 1:
            return x
        import torch.distributed as dist

        t0 = self._start(x)
        out = x.new_empty(p * x.shape[0], *x.shape[1:])  # (p·n, D)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.1x
        gather(out, x.contiguous(), group=self.group)
        self._record("all_gather", t0, x, out.numel() * out.element_size(), (p - 1) / p)
        return out

    def reduce_scatter_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Partial sums (p·n, ...) → the summed rows ``rank·n : (rank+1)·n`` of this rank: (n, ...)."""
        p = self.world_size
        if p == 1:
            return x
        if x.shape[0] % p:
            raise ValueError(f"reduce_scatter_tokens needs a row count divisible by world_size={p}, got {x.shape[0]}")
        import torch.distributed as dist

        n = x.shape[0] // p
        x = x.contiguous()
        payload = x.numel() * x.element_size()
        t0 = self._start(x)
        method = self.reduce_scatter
        if method in ("auto", "native"):
            out = x.new_empty(n, *x.shape[1:])
            try:
                scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
                scatter(out, x, group=self.group)
            except (RuntimeError, NotImplementedError):  # a backend without it fails on every rank, before sending
                if method == "native":
                    raise
                self.reduce_scatter = method = "all_to_all"
        if method == "all_to_all":
            recv = torch.empty_like(x)  # (p·n, D): block j = rank j's partial sums of MY rows
            dist.all_to_all_single(recv, x, group=self.group)
            out = recv.view(p, n, *x.shape[1:]).sum(0)  # (n, D)
        elif method == "all_reduce":
            dist.all_reduce(x, group=self.group)
            out = x[self.rank * n : (self.rank + 1) * n]
        factor = 2 * (p - 1) / p if method == "all_reduce" else (p - 1) / p
        self._record("reduce_scatter", t0, x, payload, factor)
        return out


# ---------------------------------------------------------------- the parallel linear layers
def shard_rows(weight: torch.Tensor, segments: list[int], rank: int, world_size: int) -> torch.Tensor:
    """Rows of each segment of a fused weight (e.g. q | k | v), rank's 1/p of each, concatenated.
    A fused (Σ out, in) weight must be split per segment: slicing the whole would give rank 0 all of q."""
    if sum(segments) != weight.shape[0]:
        raise ValueError(f"segments {segments} do not add up to the {weight.shape[0]} rows of the weight")
    if world_size == 1:
        return weight
    parts = []
    start = 0
    for size in segments:
        if size % world_size:
            raise ValueError(f"a segment of {size} rows cannot be split over world_size={world_size}")
        step = size // world_size
        parts.append(weight[start + rank * step : start + (rank + 1) * step])  # (out/p, in)
        start += size
    return torch.cat(parts, dim=0).contiguous()


def _local(weight: torch.Tensor, bias: torch.Tensor | None, like: Linear) -> Linear:
    """The rank's own matmul, with the same kernel choice as the layer it replaces (skinny or reference)."""
    return SkinnyLinear(weight, bias) if isinstance(like, SkinnyLinear) else Linear(weight, bias)


class ColumnParallelLinear(Linear):
    """Y_r = X W_rᵀ with W_r this rank's (out/p, in) rows: the input is replicated, nothing is communicated."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, like: Linear | None = None) -> None:
        super().__init__(weight, bias)  # (out/p, in)
        self.local = _local(weight, bias, like or self)

    @classmethod
    def from_linear(
        cls, lin: Linear, rank: int, world_size: int, segments: list[int] | None = None
    ) -> ColumnParallelLinear:
        """Shard a (fused) layer; ``segments`` are the row counts of its fused parts (default: one part)."""
        segments = segments or [lin.out_features]
        bias = None if lin.bias is None else shard_rows(lin.bias[:, None], segments, rank, world_size)[:, 0]
        return cls(shard_rows(lin.weight, segments, rank, world_size), bias, like=lin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, in), replicated → (N, out/p), this rank's output features."""
        return self.local(x)


class RowParallelLinear(Linear):
    """Y = Σ_r X_r W_rᵀ with W_r this rank's (out, in/p) columns: a partial sum per rank, ONE all-reduce."""

    def __init__(
        self, weight: torch.Tensor, comm: Comm, bias: torch.Tensor | None = None, like: Linear | None = None
    ) -> None:
        super().__init__(weight, bias)  # (out, in/p); the bias is added once, after the reduction
        self.comm = comm
        self.local = _local(weight, None, like or self)

    @classmethod
    def from_linear(cls, lin: Linear, rank: int, world_size: int, comm: Comm) -> RowParallelLinear:
        if lin.in_features % world_size:
            raise ValueError(f"in_features={lin.in_features} cannot be split over world_size={world_size}")
        step = lin.in_features // world_size
        weight = lin.weight if world_size == 1 else lin.weight[:, rank * step : (rank + 1) * step].contiguous()
        return cls(weight, comm, lin.bias, like=lin)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, in/p), this rank's input features → (N, out): this rank's share of the sum, no bias."""
        return self.local(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, in/p) → (N, out), the full result on every rank."""
        y = self.comm.all_reduce(self.partial(x))  # (N, out)
        return y if self.bias is None else y + self.bias


# ---------------------------------------------------------------- sharding the model
def check_tp_degree(num_heads: int, num_kv_heads: int, ffn_size: int, world_size: int) -> None:
    """Raise ValueError naming what world_size does not divide (heads, KV heads or the MLP width)."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    for name, value in (
        ("num_attention_heads", num_heads),
        ("num_key_value_heads", num_kv_heads),
        ("intermediate_size", ffn_size),
    ):
        if value % world_size:
            hint = " (GQA/MQA: each rank must keep whole KV heads)" if name == "num_key_value_heads" else ""
            raise ValueError(
                f"tensor parallelism needs world_size to divide {name}={value}, got world_size={world_size}{hint}"
            )


def shard_model(model: LlamaEngineModel, rank: int, world_size: int, comm: Comm) -> LlamaEngineModel:
    """Shard ``model`` in place for (rank, world_size): qkv/gate_up column-parallel, o/down row-parallel,
    embedding, norms and LM head replicated; head counts and sizes updated so ``run_layers`` needs no change."""
    if getattr(model, "tensor_parallel", None) is not None:
        raise ValueError(f"this model is already sharded as (rank, world_size)={model.tensor_parallel}")
    check_tp_degree(model.num_heads, model.num_kv_heads, model.ffn_size, world_size)
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    p = world_size
    for i, layer in enumerate(model.layers):
        qkv_rows = [model.q_size, model.kv_size, model.kv_size]  # fused rows: q | k | v, each split by heads
        model.set_linear(f"layers.{i}.qkv", ColumnParallelLinear.from_linear(layer.qkv, rank, p, qkv_rows))
        model.set_linear(f"layers.{i}.o", RowParallelLinear.from_linear(layer.o, rank, p, comm))
        ffn_rows = [model.ffn_size, model.ffn_size]  # fused rows: gate | up
        model.set_linear(f"layers.{i}.gate_up", ColumnParallelLinear.from_linear(layer.gate_up, rank, p, ffn_rows))
        model.set_linear(f"layers.{i}.down", RowParallelLinear.from_linear(layer.down, rank, p, comm))
    model.num_heads //= p
    model.num_kv_heads //= p
    model.q_size = model.num_heads * model.head_dim
    model.kv_size = model.num_kv_heads * model.head_dim
    model.ffn_size //= p
    model.tensor_parallel = (rank, p)
    return model


class TensorParallelModel:
    """One rank's view of a sharded ``LlamaEngineModel``: the engine calls it like the model it wraps.

    Plain TP runs the model's own ``forward`` (the parallel layers do the communication). With
    ``sequence_parallel`` a step of N ≥ p tokens runs ``forward_sp``; a smaller step (a lone decode
    token) runs plain TP: splitting one token over two ranks would be padding, not parallelism.
    """

    def __init__(self, model: LlamaEngineModel, comm: Comm, sequence_parallel: bool = False) -> None:
        if getattr(model, "tensor_parallel", None) is None:
            raise ValueError("wrap a model sharded by shard_model(model, rank, world_size, comm)")
        self.model = model
        self.comm = comm
        self.sequence_parallel = bool(sequence_parallel)
        self.rows_normed = 0  # rows of (D,) this rank pushed through the SP region's norms (SP steps only)

    def __getattr__(self, name: str):
        if name == "model":  # not set yet (e.g. while unpickling): do not recurse
            raise AttributeError(name)
        return getattr(self.model, name)  # num_layers, vocab_size, device, linears(), set_linear(), ...

    def reset_stats(self) -> None:
        self.comm.reset()
        self.rows_normed = 0

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta,
        backend,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.sequence_parallel and input_ids.shape[0] >= self.comm.world_size:
            return self.forward_sp(input_ids, positions, meta, backend, logits_indices)
        return self.model.forward(input_ids, positions, meta, backend, logits_indices)

    __call__ = forward

    def forward_sp(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta,
        backend,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The same logits as ``forward``, with the residual stream split over tokens between TP regions.

        Uneven N: the stream is padded to p·n rows, n = ⌈N/p⌉; rank r owns flat tokens r·n … r·n+n−1,
        the last rank's padding rows (zeros, ≤ p−1 of them) go through the norms and are dropped after
        every all-gather. Only the M rows the head needs are assembled at the end (one all-reduce of (M, D)).
        """
        m, comm = self.model, self.comm
        p, r = comm.world_size, comm.rank
        N = input_ids.shape[0]
        n = -(-N // p)  # tokens per rank after padding
        lo = r * n
        H, Hkv, hd = m.num_heads, m.num_kv_heads, m.head_dim  # this rank's heads
        cos, sin = m.rope(positions)
        cos, sin = cos[:, None], m._signed(sin)[:, None]  # (N, 1, hd)
        x = m.embed(input_ids[lo : lo + n])  # (≤n, D): this rank's tokens only
        x = F.pad(x, (0, 0, 0, n - x.shape[0]))  # (n, D): zero rows pad the last rank

        def gather(h: torch.Tensor) -> torch.Tensor:  # g: (n, D) shard → (N, D) replicated
            return comm.all_gather_tokens(h)[:N]

        def scatter(y: torch.Tensor) -> torch.Tensor:  # ḡ: (N, D) partial sums → (n, D) summed shard
            return comm.reduce_scatter_tokens(F.pad(y, (0, 0, 0, p * n - N)))

        for i in range(m.num_layers):
            w = m.layers[i]
            h = rms_norm(x, w.attn_norm, m.eps)  # (n, D): the SP region, 1/p of the rows
            qkv = w.qkv(gather(h))  # (N, (H + 2·Hkv)·hd), this rank's heads
            qk, v = qkv.split([m.q_size + m.kv_size, m.kv_size], dim=-1)
            qk = apply_rope(qk.view(N, H + Hkv, hd), cos, sin)
            q, k = qk.split([H, Hkv], dim=1)  # (N, H/p, hd), (N, Hkv/p, hd)
            o = backend.forward(i, q, k, v.view(N, Hkv, hd), meta)  # (N, H/p, hd)
            x = x + scatter(w.o.partial(o.reshape(N, H * hd)))  # (n, D): reduce-scatter replaces the all-reduce
            h = rms_norm(x, w.mlp_norm, m.eps)  # (n, D)
            gate, up = w.gate_up(gather(h)).split(m.ffn_size, dim=-1)  # (N, F/p) each
            x = x + scatter(w.down.partial(F.silu(gate) * up))  # (n, D)
            self.rows_normed += 2 * n
        if logits_indices is not None and logits_indices.numel() == 0:
            return x.new_empty(0, m.vocab_size)
        idx = torch.arange(N, device=x.device) if logits_indices is None else logits_indices  # (M,)
        rows = x.new_zeros(idx.shape[0], x.shape[1])  # (M, D): each rank fills the rows it owns
        mine = (idx >= lo) & (idx < lo + n)
        rows[mine] = x[idx[mine] - lo]
        return m.head(comm.all_reduce(rows))  # (M, V), replicated like plain TP


# ---------------------------------------------------------------- the engine, and what it costs
def tp_engine(
    rank: int,
    world_size: int,
    model: str = "tiny-target",
    *,
    config=None,
    sequence_parallel: bool = False,
    linear: str = "auto",
    dtype: str = "fp32",
    device: str | torch.device = "cpu",
    group=None,
    reduce_scatter: str = "auto",
):
    """An ``Engine`` whose model is rank's tensor-parallel shard and whose KV cache holds rank's KV heads.

    Call it on every rank (under ``course_lib.parallel.launcher.launch``, or with torch.distributed
    initialised) and drive every rank's engine with the same requests: the forward runs in lockstep
    because every collective must be entered by all ranks, and greedy (or equally seeded) sampling of
    replicated logits makes the same decision everywhere. ``world_size == 1`` needs no process group.
    """
    from course_lib.engine.attention import ContiguousBackend
    from course_lib.engine.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.models.load import load_model

    hf, tokenizer = load_model(model, device=device, dtype=dtype)
    cfg = hf.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    check_tp_degree(heads, kv_heads, cfg.intermediate_size, world_size)
    comm = Comm(rank, world_size, group, reduce_scatter)  # checks rank
    if world_size > 1:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                f"world_size={world_size} needs torch.distributed initialised on every rank: run tp_engine "
                "inside course_lib.parallel.launcher.launch(fn, world_size)"
            )
        if dist.get_world_size(group) != world_size or dist.get_rank(group) != rank:
            raise ValueError(
                f"(rank, world_size)=({rank}, {world_size}) does not match the process group's "
                f"({dist.get_rank(group)}, {dist.get_world_size(group)})"
            )
    config = config or SchedulerConfig()
    max_len = config.max_model_len or cfg.max_position_embeddings
    rows = config.max_num_seqs
    if config.max_kv_tokens is not None:
        rows = min(rows, config.max_kv_tokens // max_len)
        if rows == 0:
            raise ValueError(
                f"SchedulerConfig.max_kv_tokens={config.max_kv_tokens} cannot hold one sequence of "
                f"max_model_len={max_len} tokens in a contiguous cache; raise it or lower max_model_len"
            )
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    backend = ContiguousBackend(
        cfg.num_hidden_layers, kv_heads // world_size, head_dim, max_len, rows, hf.dtype, hf.device
    )  # 1/p of the KV bytes per token on each rank
    engine = Engine(hf, tokenizer, device=device, dtype=dtype, config=config, backend=backend, linear=linear)
    shard_model(engine.model, rank, world_size, comm)
    engine.model = TensorParallelModel(engine.model, comm, sequence_parallel)
    return engine


def tp_comm_bytes(
    hidden_size: int, num_layers: int, num_tokens: int, world_size: int, sequence_parallel: bool = False, elem: int = 4
) -> dict[str, float]:
    """Predicted ring bytes sent per rank in one forward of ``num_tokens`` tokens, and rows normed per rank.

    TP: 2 all-reduces of (N, D) per layer, each 2(p−1)/p·N·D·elem. SP: the same count of reduce-scatters
    and all-gathers over the padded p·⌈N/p⌉ rows, each (p−1)/p of that: RS + AG = one all-reduce. The norms
    run on N rows per rank under TP and ⌈N/p⌉ under SP. (The head's (M, D) assembly under SP is extra.)
    """
    p, L, D = world_size, num_layers, hidden_size
    if sequence_parallel and num_tokens >= p:
        rows = p * -(-num_tokens // p)
        one = (p - 1) / p * rows * D * elem
        return {
            "reduce_scatter": 2 * L * one,
            "all_gather": 2 * L * one,
            "all_reduce": 0.0,
            "rows_normed": 2 * L * rows // p,
        }
    return {
        "reduce_scatter": 0.0,
        "all_gather": 0.0,
        "all_reduce": 2 * L * 2 * (p - 1) / p * num_tokens * D * elem,
        "rows_normed": 2 * L * num_tokens,
    }


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


def _step_worker(
    rank: int, world_size: int, batch: int, context: int, repeats: int, warmup: int, model: str = "tiny-target"
) -> dict:
    """One rank of ``tp_step_times``: prefill ``batch`` prompts of ``context`` tokens, then time decode steps."""
    import torch.distributed as dist

    from course_lib.engine.sampling import SamplingParams
    from course_lib.engine.scheduler import SchedulerConfig

    max_len = context + warmup + repeats + 4
    cfg = SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=max(batch * max_len, 256), max_model_len=max_len)
    engine = tp_engine(rank, world_size, model, config=cfg)
    gen = torch.Generator().manual_seed(0)  # the same prompts on every rank
    params = SamplingParams(max_new_tokens=warmup + repeats + 2, ignore_eos=True)
    for b in range(batch):
        engine.add_request(torch.randint(0, engine.model.vocab_size, (context,), generator=gen).tolist(), params)
    engine.step()  # the prefill of all prompts (first tokens)
    barrier = dist.barrier if world_size > 1 else (lambda: None)
    for _ in range(warmup):
        engine.step()
    steps, comm_s, calls, nbytes = [], [], 0, 0
    for _ in range(repeats):
        barrier()  # start every rank's step together: the timer measures the step, not the skew
        engine.model.reset_stats()
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
        ar = engine.model.comm.stats["all_reduce"]
        comm_s.append(ar.seconds)
        calls, nbytes = ar.calls, ar.payload_bytes
    while engine.has_unfinished():
        engine.step()
    return {"step": steps, "allreduce": comm_s, "calls": calls, "bytes": nbytes}


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
    rank: int, world_size: int, prompts: list[str], max_new_tokens: int = 8, sequence_parallel: bool = False
) -> list[list[int]]:
    """Greedy generation on one TP rank (run it under ``launch``): every rank runs the same requests in
    lockstep and returns the same tokens."""
    from course_lib.engine.sampling import SamplingParams

    torch.set_num_threads(1)
    engine = tp_engine(rank, world_size, sequence_parallel=sequence_parallel)
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    return [r.output_ids for r in engine.generate(prompts, params)]


def tp_generate(
    prompts: list[str], world_size: int = 2, max_new_tokens: int = 8, sequence_parallel: bool = False, timeout_s=180.0
) -> list[list[list[int]]]:
    """Greedy tokens of ``prompts`` from a TP group of ``world_size`` processes: one list per rank."""
    from course_lib.parallel.launcher import launch

    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    return launch(
        tp_generate_worker,
        world_size,
        list(prompts),
        max_new_tokens,
        sequence_parallel,
        threads_per_worker=1,
        timeout_s=timeout_s,
    )
