"""What pruning acts on: the engine's linear layers and their float weights, and the size of the model.

Every kind of pruning (magnitude, structured, 2:4) starts from ``prunable(engine)``; ``model_size`` counts
parameters and bytes (each tensor once: the tied LM head is the embedding), the number a pruned model is
judged by, since the bytes a decode step streams are its time (bandwidth-bound). Introduced in
03_compression.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.engine.layers import Linear, SkinnyLinear


def float_weight(name: str, lin) -> torch.Tensor:
    """The (out, in) float weight of a linear layer, or ValueError (a quantized layer has none)."""
    w = getattr(lin, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"{name} is a {type(lin).__name__} without a float (out, in) weight: prune before quantizing")
    return w


def reset_packed(lin) -> None:
    """Drop a ``SkinnyLinear``'s packed copy of its weight: it is rebuilt from the edited weight."""
    if hasattr(lin, "_packed"):
        lin._packed = None


def like(old, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
    """A fresh layer of the same kind as ``old`` (SkinnyLinear stays skinny, so decode speed compares)."""
    if isinstance(old, SkinnyLinear):
        return SkinnyLinear(weight, bias, max_packed_rows=old.max_packed_rows)
    return Linear(weight, bias)


def prunable(engine, include_lm_head: bool = False) -> dict[str, Linear]:
    """The engine's linear layers pruning acts on, by name (``layers.{i}.{qkv|o|gate_up|down}``, and
    ``lm_head`` if asked: it is tied to the embedding in the course's models, so pruning it also zeroes
    embedding entries)."""
    out = {}
    for name, lin in engine.model.linears():
        if name == "lm_head" and not include_lm_head:
            continue
        float_weight(name, lin)
        out[name] = lin
    return out


def model_size(engine) -> dict[str, int]:
    """Parameters and bytes of the engine's model: embedding, norms and every linear layer, each tensor
    counted once (the tied LM head is the embedding)."""
    m = engine.model
    tensors = [m.embed_weight, m.final_norm]
    for layer in m.layers:
        tensors += [layer.attn_norm, layer.mlp_norm]
    for _, lin in m.linears():
        tensors += [t for t in (getattr(lin, "weight", None), getattr(lin, "bias", None)) if t is not None]
    seen, params, nbytes = set(), 0, 0
    for t in tensors:
        key = (t.data_ptr(), t.numel(), t.dtype)
        if key in seen:
            continue
        seen.add(key)
        params += t.numel()
        nbytes += t.numel() * t.element_size()
    return {"params": params, "bytes": nbytes}
