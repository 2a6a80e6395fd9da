"""Sequence parallelism (Korthikanti et al. 2022): the residual stream split over tokens between the TP regions.

Under plain tensor parallelism every rank runs the norms and residual adds on all N tokens: replicated
work. "Reducing Activation Recomputation in Large Transformer Models" removes it: each row-parallel
all-reduce becomes a reduce-scatter over tokens (rank r gets the summed rows of its token shard), the
norms and residual adds run on N/p tokens, and an all-gather rebuilds the (N, D) input of the next
column-parallel linear. A ring reduce-scatter plus a ring all-gather move exactly the bytes of one ring
all-reduce, so SP costs no extra communication and cuts the elementwise work (and activation memory) per
rank to 1/p. ``forward_sp`` runs one step of a model sharded by ``course_lib.parallel.tp_model.shard_model``
this way. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.engine.model import LlamaEngineModel, apply_rope, rms_norm
from course_lib.parallel.tp_comm import Comm


def forward_sp(
    m: LlamaEngineModel, comm: Comm, input_ids, positions, meta, backend, logits_indices=None
) -> tuple[torch.Tensor, int]:
    """The logits of ``m.forward`` (a TP-sharded model), with the residual stream split over tokens between TP
    regions; returns (logits (M, V), rows of (D,) this rank pushed through the norms).

    Uneven N: the stream is padded to p·n rows, n = ⌈N/p⌉; rank r owns flat tokens r·n … r·n+n−1,
    the last rank's padding rows (zeros, ≤ p−1 of them) go through the norms and are dropped after
    every all-gather. Only the M rows the head needs are assembled at the end (one all-reduce of (M, D)).
    """
    p, r = comm.world_size, comm.rank
    N = input_ids.shape[0]  # input_ids, positions: (N,)
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

    rows_normed = 0
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
        rows_normed += 2 * n
    if logits_indices is not None and logits_indices.numel() == 0:
        return x.new_empty(0, m.vocab_size), rows_normed
    idx = torch.arange(N, device=x.device) if logits_indices is None else logits_indices  # (M,)
    rows = x.new_zeros(idx.shape[0], x.shape[1])  # (M, D): each rank fills the rows it owns
    mine = (idx >= lo) & (idx < lo + n)
    rows[mine] = x[idx[mine] - lo]
    return m.head(comm.all_reduce(rows)), rows_normed  # (M, V), replicated like plain TP


__all__ = ["forward_sp"]
