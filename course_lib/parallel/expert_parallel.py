"""Expert parallelism: a tiny mixture-of-experts layer, its experts spread over ranks, tokens routed all-to-all.

A mixture-of-experts (MoE) MLP (Shazeer et al. 2017; GShard, Lepikhin et al. 2021; Mixtral's top-2 of 8)
replaces one feed-forward block by E experts and a router: each token goes to the k experts with the
highest router logits, weighted by a softmax over those k. ``moe_reference`` is the one-process layer.
Under expert parallelism each of p ranks holds E / p experts and its own share of the tokens; a token
whose expert lives elsewhere travels there and back: one **all-to-all** dispatch (each rank sends rank j the
rows routed to j's experts) and one all-to-all combine. ``ep_worker`` runs it under ``launch`` with gloo's
``all_to_all_single`` — or, where a gloo build lacks it, an all-gather of every rank's rows from which each
keeps its own (``exchange``: the same result, p times the bytes; it says which it used) — and returns the
largest difference from ``moe_reference``, the tokens each expert got (the load imbalance: the busiest
expert sets the pace) and the bytes and seconds of the all-to-alls, which the α–β model prices as
(p − 1)·α + (p − 1)/p · n·β (``alpha_beta.coefficients("all_to_all", p)``). Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MoEWeights:
    """A router (D, E) and E SwiGLU experts: w1, w3 (E, D, F), w2 (E, F, D)."""

    router: torch.Tensor
    w1: torch.Tensor
    w3: torch.Tensor
    w2: torch.Tensor

    @property
    def num_experts(self) -> int:
        return self.router.shape[1]


def make_moe(hidden: int = 64, ffn: int = 128, num_experts: int = 4, seed: int = 0) -> MoEWeights:
    """Random weights (the same on every rank for the same seed)."""
    for name, v in (("hidden", hidden), ("ffn", ffn), ("num_experts", num_experts)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    g = torch.Generator().manual_seed(seed)
    s = hidden**-0.5
    return MoEWeights(
        torch.randn(hidden, num_experts, generator=g) * s,
        torch.randn(num_experts, hidden, ffn, generator=g) * s,
        torch.randn(num_experts, hidden, ffn, generator=g) * s,
        torch.randn(num_experts, ffn, hidden, generator=g) * ffn**-0.5,
    )


def route(x: torch.Tensor, w: MoEWeights, k: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(experts (N, k), weights (N, k)): each token's top-k experts and their softmax weights over those k."""
    if not 1 <= k <= w.num_experts:
        raise ValueError(f"k must be in [1, {w.num_experts}] (the number of experts), got {k!r}")
    top, idx = (x @ w.router).topk(k, dim=-1)  # (N, k)
    return idx, torch.softmax(top, dim=-1)


def expert_forward(x: torch.Tensor, w: MoEWeights, e: int) -> torch.Tensor:
    """Expert e's SwiGLU MLP on rows x (n, D) -> (n, D)."""
    return (torch.nn.functional.silu(x @ w.w1[e]) * (x @ w.w3[e])) @ w.w2[e]


def moe_reference(x: torch.Tensor, w: MoEWeights, k: int = 2) -> torch.Tensor:
    """The one-process MoE layer on x (N, D): Σ over each token's top-k experts of weight · expert(x)."""
    idx, gate = route(x, w, k)
    out = torch.zeros_like(x)
    for e in range(w.num_experts):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if len(rows):
            out.index_add_(0, rows, gate[rows, slot, None] * expert_forward(x[rows], w, e))
    return out


def exchange(
    send: torch.Tensor, send_counts: list[int], recv_counts: list[int], method: list, sent: list | None = None
) -> torch.Tensor:
    """All-to-all of rows: send rows [Σ counts[:j], +counts[j]) to rank j, receive recv_counts[j] rows from
    each. ``method`` (a one-item list) holds "all_to_all" until a backend refuses it; then "all_gather":
    every rank's rows padded to the largest, gathered, and each keeps the blocks addressed to it. ``sent`` (a
    one-item list) accumulates the bytes this rank sent to others: the rows addressed to other ranks for
    an all-to-all; (p − 1) copies of its padded rows for the ring all-gather."""
    import torch.distributed as dist

    p, rank = dist.get_world_size(), dist.get_rank()
    row = send[0].numel() * send.element_size() if len(send) else 0

    if method[0] == "all_to_all":
        recv = send.new_empty(sum(recv_counts), *send.shape[1:])
        try:
            dist.all_to_all_single(recv, send.contiguous(), recv_counts, send_counts)
            if sent is not None:
                sent[0] += (sum(send_counts) - send_counts[rank]) * row
            return recv
        except (RuntimeError, NotImplementedError):
            method[0] = "all_gather"  # a gloo build without all_to_all: fall back, and say so
    sizes = torch.tensor([len(send)])
    all_sizes = [torch.zeros(1, dtype=sizes.dtype) for _ in range(p)]
    dist.all_gather(all_sizes, sizes)
    most = int(max(s.item() for s in all_sizes))
    padded = send.new_zeros(most, *send.shape[1:])
    padded[: len(send)] = send
    got = [torch.empty_like(padded) for _ in range(p)]
    dist.all_gather(got, padded)
    if sent is not None:
        sent[0] += (p - 1) * padded.numel() * padded.element_size()
    mine = torch.tensor(send_counts)  # every rank's send counts, to find my block in its rows
    all_counts = [torch.empty_like(mine) for _ in range(p)]
    dist.all_gather(all_counts, mine)
    blocks = []
    for j in range(p):
        start = int(all_counts[j][:rank].sum())
        blocks.append(got[j][start : start + int(all_counts[j][rank])])
    return torch.cat(blocks)


def ep_worker(
    rank: int,
    world_size: int,
    tokens: int = 64,
    hidden: int = 64,
    ffn: int = 128,
    num_experts: int = 4,
    k: int = 2,
    seed: int = 0,
    exchange_method: str = "all_to_all",
) -> dict:
    """One rank of expert parallelism (under ``launch``): experts [rank·E/p, (rank+1)·E/p), tokens
    [rank·N/p, (rank+1)·N/p) of the same seeded input on every rank; dispatch, compute, combine.
    ``exchange_method``: "all_to_all" (falls back by itself where gloo lacks it) or "all_gather" (forced)."""
    import torch.distributed as dist

    p, E = world_size, num_experts
    if E % p or tokens % p:
        raise ValueError(f"num_experts={E} and tokens={tokens} must both be divisible by world_size={p}")
    w = make_moe(hidden, ffn, E, seed)
    x_all = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + 1))  # (N, D)
    n = tokens // p
    x = x_all[rank * n : (rank + 1) * n]  # (n, D) my tokens
    per = E // p
    idx, gate = route(x, w, k)  # (n, k)
    flat_e = idx.reshape(-1)  # (n·k,) one row per (token, choice)
    order = torch.argsort(flat_e // per, stable=True)  # grouped by destination rank
    dest = (flat_e // per)[order]
    send_counts = torch.bincount(dest, minlength=p).tolist()
    if exchange_method not in ("all_to_all", "all_gather"):
        raise ValueError(f"exchange_method must be 'all_to_all' or 'all_gather', got {exchange_method!r}")
    method = [exchange_method]
    recv_counts = exchange(torch.tensor(send_counts)[:, None], [1] * p, [1] * p, method)[:, 0].tolist()
    rows = x.repeat_interleave(k, 0)[order]  # (n·k, D)
    payload = torch.cat([rows, flat_e[order, None].to(rows.dtype)], 1)  # the expert id rides along
    dist.barrier()
    t0 = time.perf_counter()
    sent = [0]  # the bytes of the two token exchanges, as sent (the counts' exchange is not counted)
    got = exchange(payload, send_counts, recv_counts, method, sent)  # (m, D + 1) rows for my experts
    t_dispatch = time.perf_counter() - t0
    out_rows = torch.empty(len(got), hidden)
    load = [0] * E
    for e in range(rank * per, (rank + 1) * per):
        sel = (got[:, -1] == e).nonzero(as_tuple=True)[0]
        load[e] = len(sel)
        out_rows[sel] = expert_forward(got[sel, :-1], w, e)
    t1 = time.perf_counter()
    back = exchange(out_rows, recv_counts, send_counts, method, sent)  # (n·k, D) in my send order
    t_combine = time.perf_counter() - t1
    y = torch.zeros(n * k, hidden)
    y[order] = back
    out = (gate.reshape(-1, 1) * y).view(n, k, hidden).sum(1)  # (n, D)
    ref = moe_reference(x_all, w, k)[rank * n : (rank + 1) * n]
    loads = torch.tensor(load)
    dist.all_reduce(loads)  # every expert's token count, over ranks
    return {
        "max_abs_diff": float((out - ref).abs().max()),
        "method": method[0],
        "expert_tokens": loads.tolist(),
        "bytes_sent": sent[0],
        "rows_to_others": sum(send_counts) - send_counts[rank],  # (token, choice) rows dispatched off this rank
        "row_bytes": (hidden + 1) * payload.element_size(),
        "seconds": t_dispatch + t_combine,
    }


__all__ = [
    "MoEWeights",
    "ep_and_ring_worker",
    "ep_worker",
    "exchange",
    "expert_forward",
    "make_moe",
    "moe_reference",
    "route",
]


def ep_and_ring_worker(rank: int, world_size: int, ep: dict | None = None, ring: dict | None = None) -> dict:
    """Both demonstrations in one launch (one process start-up instead of two): {"ep": ..., "ring": ...}."""
    from course_lib.parallel.ring_attention import ring_attention_worker

    return {
        "ep": ep_worker(rank, world_size, **(ep or {})),
        "ring": ring_attention_worker(rank, world_size, **(ring or {})),
    }
