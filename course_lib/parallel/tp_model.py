"""A tensor-parallel model (Megatron-LM): one rank's shard of the engine's Llama, and an ``Engine`` around it.

``shard_model`` replaces the engine model's linear layers in place (``course_lib.parallel.tp_layers``):
- attention is split by heads: rank r keeps H/p query heads and the KV heads they use (Hkv/p of them, or
  one KV head replicated on p/Hkv ranks when p > Hkv: ``course_lib.parallel.tp_plan``), so its ``qkv`` is
  *column-parallel* (its slice of output features, no communication: the input is replicated) and its
  KV cache holds only its own KV heads;
- ``o`` and ``down`` are *row-parallel* (their slice of input features): each rank computes a partial sum
  of the full output and ONE all-reduce adds them, so a layer costs two all-reduces of (N, D);
- ``gate_up`` is column-parallel like ``qkv``; SwiGLU is elementwise, so it runs on the local slice;
- the norms are replicated; the embedding and the LM head are replicated (each rank computes the same
  logits) or, with ``vocab_parallel``, cut by vocabulary rows (``course_lib.parallel.tp_vocab``: one more
  all-reduce for the embedding, one all-gather of the logits).

Decode is bandwidth-bound on weights, so TP divides the bytes each rank reads by p, and adds 2·L
latency-bound all-reduces of a few KB per step. ``TensorParallelModel`` is what the engine calls (plain TP,
or sequence parallelism: ``course_lib.parallel.sequence_parallel``); ``tp_engine`` builds an ``Engine`` on
one rank of a launched group, loading only that rank's slices where the checkpoint is a safetensors
file (``course_lib.parallel.tp_load``). Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.engine.model import LlamaEngineModel
from course_lib.parallel.sequence_parallel import forward_sp
from course_lib.parallel.tp_comm import Comm
from course_lib.parallel.tp_layers import ColumnParallelLinear, RowParallelLinear
from course_lib.parallel.tp_plan import RankShard, check_tp_degree, kv_heads_per_rank, rank_shard
from course_lib.parallel.tp_vocab import shard_vocab


def _wrap_presliced(model: LlamaEngineModel, shard: RankShard, comm: Comm) -> None:
    """The layers already hold only this rank's rows and columns (``tp_load``): check the shapes, wrap them."""
    hd, hq, hkv, f = model.head_dim, len(shard.q_heads), len(shard.kv_heads), len(shard.ffn)
    want = {"qkv": ((hq + 2 * hkv) * hd, None), "o": (None, hq * hd), "gate_up": (2 * f, None), "down": (None, f)}
    for i, layer in enumerate(model.layers):
        for name, (rows, cols) in want.items():
            lin = getattr(layer, name)
            if (rows or lin.out_features, cols or lin.in_features) != (lin.out_features, lin.in_features):
                raise ValueError(
                    f"layers.{i}.{name} is {tuple(lin.weight.shape)}, not rank {shard.rank}'s slice "
                    f"({rows or lin.out_features}, {cols or lin.in_features}): was it loaded for another (rank, world_size)?"
                )
        model.set_linear(f"layers.{i}.qkv", ColumnParallelLinear(layer.qkv.weight, layer.qkv.bias, like=layer.qkv))
        model.set_linear(f"layers.{i}.o", RowParallelLinear(layer.o.weight, comm, layer.o.bias, like=layer.o))
        gate_up = layer.gate_up
        model.set_linear(f"layers.{i}.gate_up", ColumnParallelLinear(gate_up.weight, gate_up.bias, like=gate_up))
        model.set_linear(
            f"layers.{i}.down", RowParallelLinear(layer.down.weight, comm, layer.down.bias, like=layer.down)
        )


def shard_model(
    model: LlamaEngineModel,
    rank: int,
    world_size: int,
    comm: Comm,
    presliced: bool = False,
    vocab_parallel: bool = False,
) -> LlamaEngineModel:
    """Shard ``model`` in place for (rank, world_size): qkv/gate_up column-parallel, o/down row-parallel,
    embedding, norms and LM head replicated; head counts and sizes updated so ``run_layers`` needs no change.

    Each rank keeps the KV heads its query heads use (``tp_plan.rank_shard``): Hkv/p of them, or one
    replicated KV head when p > Hkv. ``presliced``: the model was loaded with only this rank's slices
    (``tp_load.load_rank_model``); its layers are wrapped, not cut. ``vocab_parallel``: the embedding and
    the head are cut by vocabulary rows too (``tp_vocab.shard_vocab``; presliced: read so)."""
    if getattr(model, "tensor_parallel", None) is not None:
        raise ValueError(f"this model is already sharded as (rank, world_size)={model.tensor_parallel}")
    ffn = model.ffn_size * world_size if presliced else model.ffn_size  # a presliced down has F/p input columns
    shard = rank_shard(model.num_heads, model.num_kv_heads, ffn, rank, world_size)  # checks rank
    if presliced:
        _wrap_presliced(model, shard, comm)
    else:
        hd = model.head_dim
        for i, layer in enumerate(model.layers):
            qkv_rows = shard.qkv_rows(hd, model.num_heads, model.num_kv_heads)  # q | k | v, by heads
            model.set_linear(f"layers.{i}.qkv", ColumnParallelLinear.from_rows(layer.qkv, qkv_rows))
            model.set_linear(f"layers.{i}.o", RowParallelLinear.from_columns(layer.o, shard.o_columns(hd), comm))
            gate_up = ColumnParallelLinear.from_rows(layer.gate_up, shard.gate_up_rows(ffn))  # gate | up
            model.set_linear(f"layers.{i}.gate_up", gate_up)
            ffn_cols = (shard.ffn.start, shard.ffn.stop)
            model.set_linear(f"layers.{i}.down", RowParallelLinear.from_columns(layer.down, ffn_cols, comm))
    model.num_heads = len(shard.q_heads)
    model.num_kv_heads = len(shard.kv_heads)
    model.q_size = model.num_heads * model.head_dim
    model.kv_size = model.num_kv_heads * model.head_dim
    model.ffn_size = len(shard.ffn)
    model.tensor_parallel = (rank, world_size)
    model.rank_shard = shard
    model.vocab_parallel = None
    if vocab_parallel:
        shard_vocab(model, rank, world_size, comm, presliced=presliced)
    return model


def release_unsharded(hf_model) -> int:
    """Free the full projection weights the HF model still holds after ``shard_model`` copied this rank's
    slices out of them (its q/k/v, o, gate/up and down are views of the engine's fused tensors): returns
    the bytes released. The HF model keeps its embedding, norms and head, and can no longer run forward."""
    freed = 0
    with torch.no_grad():
        for layer in hf_model.model.layers:
            for mod in (
                *(getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")),
                *(getattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj")),
            ):
                for t in (mod.weight, mod.bias):
                    if t is not None and t.numel():
                        freed += t.numel() * t.element_size()
                        t.data = t.data.new_empty(0)
    return freed


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
    vocab_parallel: bool = False,
    standalone: bool = True,
):
    """An ``Engine`` whose model is rank's tensor-parallel shard and whose KV cache holds rank's KV heads.

    Call it on every rank (under ``course_lib.parallel.launcher.launch``, or with torch.distributed
    initialised) and drive every rank's engine with the same requests: the forward runs in lockstep
    because every collective must be entered by all ranks, and greedy (or equally seeded) sampling of
    replicated logits makes the same decision everywhere. ``world_size == 1`` needs no process group.
    ``vocab_parallel``: each rank holds V/p rows of the embedding and the head (``tp_vocab``); the logits are
    all-gathered, so every rank still samples from the same (B, V). ``standalone``: read a safetensors
    checkpoint without importing ``transformers`` where it can (``tp_load.load_for_rank``).
    """
    from course_lib.engine.attention import ContiguousBackend
    from course_lib.engine.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.parallel.tp_load import check_split, load_for_rank, model_config

    if config is not None and not isinstance(config, SchedulerConfig):
        raise ValueError(f"config must be a SchedulerConfig, got {type(config).__name__}")
    check_split(model_config(model), world_size)  # before any process group or weight: names the valid sizes
    if sequence_parallel and vocab_parallel and world_size > 1:
        raise ValueError(
            "sequence_parallel=True with vocab_parallel=True is not supported: sequence parallelism embeds each "
            "rank's own tokens, and the vocab-parallel lookup sums every rank's rows for the same tokens "
            "(Megatron reduce-scatters it instead); pick one"
        )
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
    hf, tokenizer, presliced = load_for_rank(
        model, rank, world_size, device=device, dtype=dtype, vocab_parallel=vocab_parallel, standalone=standalone
    )
    cfg = hf.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
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
        cfg.num_hidden_layers, kv_heads_per_rank(kv_heads, world_size), head_dim, max_len, rows, hf.dtype, hf.device
    )  # this rank's KV heads only: 1/p of the KV bytes per token, or one replicated head once p > Hkv
    # decode="eager": every step runs the reference forward through the sharded layers (the C step and the
    # fused step know only whole, unsharded linears)
    engine = Engine(
        hf, tokenizer, device=device, dtype=dtype, config=config, backend=backend, linear=linear, decode="eager"
    )
    shard_model(engine.model, rank, world_size, comm, presliced=presliced, vocab_parallel=vocab_parallel)
    if world_size > 1 and not presliced:
        release_unsharded(hf)  # the full weights this rank no longer needs
    engine.model = TensorParallelModel(engine.model, comm, sequence_parallel)
    return engine


__all__ = ["TensorParallelModel", "check_tp_degree", "release_unsharded", "shard_model", "tp_engine"]
