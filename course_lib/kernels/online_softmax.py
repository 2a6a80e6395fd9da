"""The online softmax, one query row in plain torch: the trick FlashAttention and paged decode rest on.

A softmax over Tk scores needs their max and their sum before any output; the online form reads the
scores one block at a time and keeps only a running max ``m``, a running sum ``l`` and a running output
``acc``, rescaling the old ``l`` and ``acc`` by exp(m_old − m_new) whenever the max grows. The last state
equals the one-pass softmax, so a kernel never has to hold (or write) the whole row. A teaching
reference in fp64, not a kernel: neither bandwidth- nor compute-bound at this size.
Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import torch


def online_softmax_steps(scores_row: torch.Tensor, block: int, values: torch.Tensor | None = None) -> list[dict]:
    """The online softmax of one query row, one key block at a time; returns every intermediate state.

    ``scores_row`` (Tk,) are the scaled scores q·kⱼ of one query; ``values`` (Tk, d) its V (None: the
    identity, so the final output *is* softmax(scores_row)). After block j the state holds
    ``m`` = max of the scores seen, ``l`` = Σ exp(s − m) over them, ``acc`` = Σ exp(s − m)·v over them and
    ``alpha`` = exp(m_old − m), the factor that rescaled the old l and acc when the max grew. The last
    state's ``out`` = acc / l equals softmax(scores_row) · values exactly (up to rounding): that is the whole
    trick of FlashAttention, done here in plain torch, fp64, for one row. Introduced in 05_attention_kv_cache.ipynb.
    """
    if not isinstance(scores_row, torch.Tensor) or scores_row.dim() != 1 or scores_row.numel() == 0:
        raise ValueError(
            f"scores_row must be a non-empty 1-D tensor (Tk,), got {tuple(getattr(scores_row, 'shape', ()))}"
        )
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    s = scores_row.detach().to(torch.float64)
    tk = s.shape[0]
    v = torch.eye(tk, dtype=torch.float64) if values is None else values.detach().to(torch.float64)  # (Tk, d)
    if v.dim() != 2 or v.shape[0] != tk:
        raise ValueError(f"values must be (Tk={tk}, d), got {tuple(v.shape)}")
    m = torch.tensor(float("-inf"), dtype=torch.float64)
    total = torch.tensor(0.0, dtype=torch.float64)  # l
    acc = torch.zeros(v.shape[1], dtype=torch.float64)  # (d,)
    states = []
    for j, lo in enumerate(range(0, tk, block)):
        sj, vj = s[lo : lo + block], v[lo : lo + block]  # (n,), (n, d)
        m_new = torch.maximum(m, sj.max())
        alpha = torch.exp(m - m_new)  # 0 on the first block (m = −inf)
        p = torch.exp(sj - m_new)  # (n,) unnormalised probabilities of this block
        total = total * alpha + p.sum()
        acc = acc * alpha + p @ vj  # (d,)
        m = m_new
        states.append(
            dict(
                block=j,
                keys=(lo, lo + sj.shape[0]),
                m=float(m),
                l=float(total),
                alpha=float(alpha),
                acc=acc.clone(),
                out=acc / total,
            )
        )
    return states
