"""Unstructured magnitude pruning: zero the smallest |w|, per layer or globally, and count the zeros.

Quality degrades gracefully up to ~50% on big models, but the matrices keep their shape: a dense kernel
still reads every zero, so a bandwidth-bound decode step is exactly as slow (``timing`` measures it). The
engine's weights are the Hugging Face model's tensors, so zeroing one in place also zeroes
``engine.hf_model``'s, and ``finetune.recover`` can win back quality by training the HF model.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.compression.checks import check_fraction
from course_lib.compression.prune.targets import float_weight, prunable, reset_packed

SCOPES = ("layer", "global")


def keep_mask(scores: torch.Tensor, n_prune: int) -> torch.Tensor:
    """True everywhere but at the ``n_prune`` smallest scores (exactly that many, ties broken by topk)."""
    keep = torch.ones(scores.numel(), dtype=torch.bool, device=scores.device)
    if n_prune > 0:
        keep[torch.topk(scores.flatten(), n_prune, largest=False, sorted=False).indices] = False
    return keep.view(scores.shape)


@torch.no_grad()
def magnitude_masks(
    engine, sparsity: float, *, scope: str = "layer", include_lm_head: bool = False
) -> dict[str, torch.Tensor]:
    """Boolean keep-masks (True = keep) that zero the ``sparsity`` fraction of smallest-|w| weights.

    ``scope="layer"``: every layer loses the same fraction. ``scope="global"``: one threshold over all
    layers together, so layers whose weights are small overall (often the wide MLP matrices) lose more
    and layers with large weights lose less; the total fraction is the same."""
    sparsity = check_fraction("sparsity", sparsity)
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    layers = prunable(engine, include_lm_head)
    if scope == "layer":
        return {name: keep_mask(lin.weight.abs(), round(sparsity * lin.weight.numel())) for name, lin in layers.items()}
    scores = torch.cat([lin.weight.detach().abs().flatten().float().cpu() for lin in layers.values()])
    keep = keep_mask(scores, round(sparsity * scores.numel()))
    out, start = {}, 0
    for name, lin in layers.items():
        n = lin.weight.numel()
        out[name] = keep[start : start + n].view(lin.weight.shape).to(lin.weight.device)
        start += n
    return out


@torch.no_grad()
def apply_masks(engine, masks: dict[str, torch.Tensor]) -> None:
    """Zero, in place, every weight whose mask entry is False. The tensors are shared with
    ``engine.hf_model`` (so the HF model is pruned too); ``SkinnyLinear`` packed copies are dropped so
    the next decode repacks the pruned weight."""
    layers = dict(engine.model.linears())
    checked = []
    for name, mask in masks.items():  # validate everything before touching any weight
        if name not in layers:
            raise ValueError(f"no linear layer named {name!r}; names look like 'layers.0.qkv' or 'lm_head'")
        w = float_weight(name, layers[name])
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != w.shape:
            raise ValueError(
                f"mask for {name} must be a bool tensor of shape {tuple(w.shape)}, got "
                f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}"
            )
        checked.append((layers[name], w, mask))
    for lin, w, mask in checked:
        w.masked_fill_(~mask.to(w.device), 0)
        reset_packed(lin)


def layer_sparsity(engine, *, include_lm_head: bool = False) -> dict[str, float]:
    """Fraction of exactly-zero weights in each prunable layer."""
    return {
        name: (lin.weight == 0).sum().item() / lin.weight.numel()
        for name, lin in prunable(engine, include_lm_head).items()
    }


def sparsity_of(engine, *, include_lm_head: bool = False) -> float:
    """Fraction of exactly-zero weights over all prunable linear layers together."""
    layers = prunable(engine, include_lm_head)
    zeros = sum((lin.weight == 0).sum().item() for lin in layers.values())
    return zeros / sum(lin.weight.numel() for lin in layers.values())
