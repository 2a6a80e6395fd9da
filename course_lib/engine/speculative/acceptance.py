"""The two acceptance rules of speculative decoding, applied to one row after its verify forward.

Sampled rows: the rejection rule of Leviathan et al. 2023 / Chen et al. 2023 makes the output
distribution exactly the target's. Accept draft x with probability min(1, p(x)/q(x)); at the first
rejection draw from norm(max(0, p − q)); after all k acceptances draw a bonus token from p. Greedy rows
are the special case "accept while draft == argmax", token-identical to plain greedy decoding. Python
over k + 1 positions per row: negligible next to the forward that produced p. Introduced in
04_decoding.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.engine.speculative.distributions import draw


def accept_greedy(drafts: list[int], argmax: list[int]) -> list[int]:
    """``argmax`` (k+1,): the target's top-1 after the pending token and after each draft. Returns the
    drafts that equal it, left to right, followed by the target's own token (the correction, or the bonus
    after all k)."""
    n = 0
    while n < len(drafts) and drafts[n] == argmax[n]:
        n += 1
    return drafts[:n] + [argmax[n]]


def accept_sampled(
    drafts: list[int], q: torch.Tensor | None, p: torch.Tensor, generator: torch.Generator | None
) -> list[int]:
    """The speculative sampling rule on one row. ``p`` (k+1, V): the target's distributions at each
    draft position and after the last; ``q`` (k, V) the draft's (None: deterministic drafts, q one-hot).
    Returns the accepted drafts followed by one token from the residual (or the bonus from p)."""
    out: list[int] = []
    for j, x in enumerate(drafts):
        px = float(p[j, x])
        qx = 1.0 if q is None else float(q[j, x])
        u = float(torch.rand((), generator=generator, device=p.device))
        if u * qx < px:  # accept with probability min(1, p(x)/q(x))
            out.append(x)
            continue
        # rejected: draw from norm(max(0, p − q)); with a one-hot q that is p with x zeroed
        if q is None:
            residual = p[j].clone()
            residual[x] = 0.0
        else:
            residual = (p[j] - q[j]).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # only by rounding (p ≈ q): fall back to p
            residual = p[j]
        out.append(draw(residual / residual.sum(), generator))
        return out
    out.append(draw(p[len(drafts)], generator))  # all accepted: the bonus token from p
    return out
