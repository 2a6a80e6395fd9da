"""A tensor-parallel model (Megatron-LM): one rank's shard of the engine's Llama, and an ``Engine`` around it.

``shard_model`` replaces the engine model's linear layers in place (``course_lib.parallel.tp_layers``):
- attention is split by heads: rank r keeps H/p query heads and Hkv/p KV heads, so its ``qkv`` is
  *column-parallel* (its slice of output features, no communication: the input is replicated) and its
  KV cache holds only its Hkv/p heads;
- ``o`` and ``down`` are *row-parallel* (their slice of input features): each rank computes a partial sum
  of the full output and ONE all-reduce adds them, so a layer costs two all-reduces of (N, D);
- ``gate_up`` is column-parallel like ``qkv``; SwiGLU is elementwise, so it runs on the local slice;
- the embedding, the norms and the LM head are replicated (each rank computes the same logits).

Decode is bandwidth-bound on weights, so TP divides the bytes each rank reads by p, and adds 2·L
latency-bound all-reduces of a few KB per step. ``TensorParallelModel`` is what the engine calls (plain TP,
or sequence parallelism: ``course_lib.parallel.sequence_parallel``); ``tp_engine`` builds an ``Engine`` on
one rank of a launched group. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.engine.model import LlamaEngineModel
from course_lib.parallel.sequence_parallel import forward_sp
from course_lib.parallel.tp_comm import Comm
from course_lib.parallel.tp_layers import ColumnParallelLinear, RowParallelLinear


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

    def forward(self, input_ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """The arguments and logits of ``LlamaEngineModel.forward``: ``forward_sp`` under sequence parallelism
        for a step of N ≥ p tokens, else the sharded model's own forward."""
        if self.sequence_parallel and input_ids.shape[0] >= self.comm.world_size:
            logits, rows = forward_sp(self.model, self.comm, input_ids, *args, **kwargs)
            self.rows_normed += rows
            return logits
        return self.model.forward(input_ids, *args, **kwargs)

    __call__ = forward


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


__all__ = ["TensorParallelModel", "check_tp_degree", "shard_model", "tp_engine"]
