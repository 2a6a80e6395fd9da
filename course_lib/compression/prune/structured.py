"""Structured pruning that really shrinks the model: drop whole MLP intermediate channels.

gate_up (2F, D) and down (D, F) become (2F', D) and (D, F'), so every kernel reads fewer bytes and a
bandwidth-bound decode step gets faster in proportion. It costs more quality per removed weight than
unstructured pruning, because a whole channel is a coarse unit. The new layers are new tensors: after
``prune_mlp_channels`` the engine no longer shares its weights with ``engine.hf_model``.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from course_lib.compression.checks import check_fraction, check_int
from course_lib.compression.prune.targets import float_weight, like, model_size


@dataclass
class StructuredReport:
    """What ``prune_mlp_channels`` did: MLP width, parameters and bytes of the engine's model."""

    fraction: float
    ffn_before: int
    ffn_after: int
    params_before: int
    params_after: int
    bytes_before: int
    bytes_after: int
    kept: list[torch.Tensor] = field(default_factory=list, repr=False)  # kept channel ids per layer

    @property
    def params_removed(self) -> float:
        return 1 - self.params_after / self.params_before


def channel_importance(engine, layer: int) -> torch.Tensor:
    """Score (F,) of each MLP intermediate channel of one layer: channel j computes
    silu(g_j·h)·(u_j·h) and adds it times down[:, j] to the residual, so ‖g_j‖·‖u_j‖·‖down[:, j]‖ is a
    data-free bound on how much it can contribute."""
    m = engine.model
    w = m.layers[layer]
    gu = float_weight(f"layers.{layer}.gate_up", w.gate_up).float()
    down = float_weight(f"layers.{layer}.down", w.down).float()
    Fs = m.ffn_size
    return gu[:Fs].norm(dim=1) * gu[Fs:].norm(dim=1) * down.norm(dim=0)


@torch.no_grad()
def prune_mlp_channels(engine, fraction: float, *, multiple_of: int = 1) -> StructuredReport:
    """Remove ``fraction`` of the MLP intermediate channels in every layer (the least important by
    ``channel_importance``; the same count everywhere, since the model has one ``ffn_size``, rounded down
    to ``multiple_of``). gate_up (2F, D) → (2F', D) and down (D, F) → (D, F') become new ``Linear``
    objects over new tensors, and ``engine.model.ffn_size`` becomes F'. The engine is modified in place;
    ``engine.hf_model`` is untouched and no longer in sync with it (evaluate with
    ``compression.evaluate``, which runs the engine's forward)."""
    fraction = check_fraction("fraction", fraction)
    check_int("multiple_of", multiple_of, 1)
    m = engine.model
    ffn = m.ffn_size
    keep_n = (ffn - round(fraction * ffn)) // multiple_of * multiple_of
    if keep_n < 1:
        raise ValueError(
            f"fraction={fraction} (multiple_of={multiple_of}) would keep no MLP channel of {ffn}; use a smaller fraction"
        )
    before = model_size(engine)
    plans = []
    for i, layer in enumerate(m.layers):  # check and plan every layer before replacing any
        gu = float_weight(f"layers.{i}.gate_up", layer.gate_up)
        down = float_weight(f"layers.{i}.down", layer.down)
        if gu.shape[0] != 2 * ffn or down.shape[1] != ffn:
            raise ValueError(
                f"layers.{i}: gate_up {tuple(gu.shape)} / down {tuple(down.shape)} do not match ffn_size={ffn}"
            )
        keep = torch.topk(channel_importance(engine, i), keep_n).indices.sort().values.to(gu.device)
        plans.append((i, layer, keep))
    kept = []
    for i, layer, keep in plans:
        gu, down = layer.gate_up, layer.down
        rows = torch.cat([keep, keep + ffn])  # gate rows then up rows
        gu_b = None if gu.bias is None else gu.bias[rows].clone()
        m.set_linear(f"layers.{i}.gate_up", like(gu, gu.weight[rows].contiguous(), gu_b))
        d_b = None if down.bias is None else down.bias.clone()
        m.set_linear(f"layers.{i}.down", like(down, down.weight[:, keep].contiguous(), d_b))
        kept.append(keep.cpu())
    m.ffn_size = keep_n
    after = model_size(engine)
    return StructuredReport(
        fraction, ffn, keep_n, before["params"], after["params"], before["bytes"], after["bytes"], kept
    )
