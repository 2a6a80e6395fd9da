"""Context parallelism for long prompts: ring attention over p ranks, equal to single-device attention.

A long prompt's activations and KV cache are split along the sequence: rank r holds the queries, keys and
values of tokens [r·T/p, (r+1)·T/p). Ring attention (Liu, Zaharia & Abbeel 2023; the blockwise online
softmax of FlashAttention, Dao et al. 2022) passes the K/V blocks around a ring: in each of p steps a
rank attends its queries to the block it holds, merges the partial result with a running max and sum
(``merge``), and hands the block to the next rank while receiving the previous one's. With a causal mask a
block from later tokens contributes nothing (it is still passed on). ``ring_attention_worker`` runs it
under ``launch`` and returns the largest difference from ``torch.nn.functional.scaled_dot_product_attention``
on the whole sequence, and the bytes it sent: (p − 1) K/V blocks per rank, each 2 · T/p · H · d · elem.
Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import math

import torch


def block_attention(q, k, v, q_pos, k_pos):
    """Causal attention of q (n, H, d) on one block k, v (m, H, d): (out (n, H, d), row max (H, n), row sum (H, n))
    of the block's unnormalised softmax; rows with no visible key give max −inf, sum 0, out 0."""
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])  # (H, n, m)
    scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    mx = scores.amax(-1)  # (H, n)
    safe = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
    w = torch.exp(scores - safe[..., None])  # (H, n, m); masked entries exp(−inf) = 0
    return torch.einsum("hnm,mhd->nhd", w, v), mx, w.sum(-1)


def merge(acc, mx, sm, out_b, mx_b, sm_b):
    """Fold one block's (out, max, sum) into the running (acc, max, sum): the online softmax."""
    new = torch.maximum(mx, mx_b)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    a, b = torch.exp(mx - safe), torch.exp(mx_b - safe)  # (H, n) rescale factors
    acc = acc * a.T[..., None] + out_b * b.T[..., None]
    return acc, new, sm * a + sm_b * b


def ring_attention_worker(
    rank: int, world_size: int, seq_len: int = 256, heads: int = 4, head_dim: int = 32, seed: int = 0
) -> dict:
    """One rank of causal ring attention over a seeded (T, H, d) q, k, v; compares with the whole sequence."""
    import torch.distributed as dist

    p, T = world_size, seq_len
    if T % p:
        raise ValueError(f"seq_len={T} must be divisible by world_size={p}")
    g = torch.Generator().manual_seed(seed)
    q_all, k_all, v_all = (torch.randn(T, heads, head_dim, generator=g) for _ in range(3))  # (T, H, d)
    n = T // p
    mine = slice(rank * n, (rank + 1) * n)
    q, kv = q_all[mine], torch.stack([k_all[mine], v_all[mine]])  # (n, H, d), (2, n, H, d)
    q_pos = torch.arange(rank * n, (rank + 1) * n)
    acc = torch.zeros_like(q)
    mx = torch.full((heads, n), float("-inf"))
    sm = torch.zeros(heads, n)
    sent, owner = 0, rank
    for step in range(p):
        k_pos = torch.arange(owner * n, (owner + 1) * n)
        if owner <= rank:  # causal: later tokens' blocks are masked out whole
            acc, mx, sm = merge(acc, mx, sm, *block_attention(q, kv[0], kv[1], q_pos, k_pos))
        if step < p - 1:  # hand my block on, take the previous rank's
            nxt = torch.empty_like(kv)
            ops = [dist.P2POp(dist.isend, kv, (rank + 1) % p), dist.P2POp(dist.irecv, nxt, (rank - 1) % p)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            sent += kv.numel() * kv.element_size()
            kv, owner = nxt, (owner - 1) % p
    out = acc / sm.T[..., None]
    ref = torch.nn.functional.scaled_dot_product_attention(
        q_all.transpose(0, 1), k_all.transpose(0, 1), v_all.transpose(0, 1), is_causal=True
    ).transpose(0, 1)[mine]  # (n, H, d)
    return {
        "max_abs_diff": float((out - ref).abs().max()),
        "bytes_sent": sent,
        "block_bytes": kv.numel() * kv.element_size(),
    }


def ring_bytes_per_rank(seq_len: int, heads: int, head_dim: int, p: int, elem: int = 4) -> int:
    """What ring attention sends per rank: (p − 1) blocks of K and V, each T/p tokens × H × d."""
    return (p - 1) * 2 * (seq_len // p) * heads * head_dim * elem


__all__ = ["block_attention", "merge", "ring_attention_worker", "ring_bytes_per_rank"]
