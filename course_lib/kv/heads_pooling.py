"""Fewer KV heads for a trained checkpoint: mean-pool each group's K and V projections (Ainslie et al. 2023).

``convert_kv_heads`` builds a copy of a Hugging Face Llama-family model with ``num_key_value_heads``
lowered; each new K (and V) head is the mean of the old heads of its group (``pool_kv_weight``), every
other weight copied. The converted model runs unchanged in the engine, with a cache smaller by old / new,
but loses some quality until it is uptrained (``uptraining``). Weight arithmetic on the CPU, once.

    mqa = convert_kv_heads(hf_model, 1)

Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import copy

import torch


def _attention_modules(hf_model):
    layers = getattr(getattr(hf_model, "model", None), "layers", None)
    if layers is None:
        raise ValueError("hf_model must be a Llama-family causal LM (model.model.layers[i].self_attn)")
    return [layer.self_attn for layer in layers]


def pool_kv_weight(weight: torch.Tensor, old_kv_heads: int, new_kv_heads: int) -> torch.Tensor:
    """Mean of the grouped heads' rows. ``weight`` (old_kv_heads·hd, D) (or a bias, (old_kv_heads·hd,)) →
    (new_kv_heads·hd, D). New head j averages old heads j·r … j·r + r − 1 (r = old / new): the same
    contiguous grouping that maps query heads to KV heads, so every query head keeps attending to the
    average of the heads it (and its neighbours) used before."""
    r = old_kv_heads // new_kv_heads
    hd = weight.shape[0] // old_kv_heads
    rest = weight.shape[1:]
    grouped = weight.reshape(new_kv_heads, r, hd, *rest)  # (new, r, hd, D)
    return grouped.mean(dim=1).reshape(new_kv_heads * hd, *rest)  # (new·hd, D)


def check_new_kv_heads(config, new_kv_heads) -> int:
    """Raise ValueError unless ``new_kv_heads`` is a positive int dividing the current KV heads (and heads)."""
    heads = config.num_attention_heads
    old = getattr(config, "num_key_value_heads", None) or heads
    if isinstance(new_kv_heads, bool) or not isinstance(new_kv_heads, int) or new_kv_heads <= 0:
        raise ValueError(
            f"new_kv_heads must be a positive int dividing the current {old} KV heads, got {new_kv_heads!r}"
        )
    if heads % new_kv_heads:
        raise ValueError(f"new_kv_heads={new_kv_heads} must divide num_attention_heads={heads}")
    if old % new_kv_heads:
        raise ValueError(
            f"new_kv_heads={new_kv_heads} must divide the current num_key_value_heads={old} "
            f"(mean-pooling merges whole groups of heads; valid: {[d for d in range(1, old + 1) if old % d == 0]})"
        )
    return new_kv_heads


@torch.no_grad()
def convert_kv_heads(hf_model, new_kv_heads: int):
    """A new model like ``hf_model`` with ``num_key_value_heads = new_kv_heads``: each new K (and V) head is
    the mean of the old heads of its group (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query
    Transformer Models from Multi-Head Checkpoints"); every other weight is copied. The same number of
    heads gives an identical copy. ``hf_model`` is not modified; the copy has its dtype, device and mode."""
    config = getattr(hf_model, "config", None)
    if config is None or not hasattr(config, "num_attention_heads"):
        raise ValueError(f"hf_model must be a transformers causal LM with a config, got {type(hf_model).__name__}")
    check_new_kv_heads(config, new_kv_heads)
    old = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    attn = _attention_modules(hf_model)
    new_config = copy.deepcopy(config)
    new_config.num_key_value_heads = new_kv_heads
    if getattr(new_config, "head_dim", None) is None:
        new_config.head_dim = config.hidden_size // config.num_attention_heads
    state = {k: v.clone() for k, v in hf_model.state_dict().items()}
    prefix = {id(m): name for name, m in hf_model.named_modules()}
    for a in attn:
        for proj in (a.k_proj, a.v_proj):
            name = prefix[id(proj)]
            state[f"{name}.weight"] = pool_kv_weight(proj.weight, old, new_kv_heads)  # (new·hd, D)
            if getattr(proj, "bias", None) is not None:
                state[f"{name}.bias"] = pool_kv_weight(proj.bias, old, new_kv_heads)  # (new·hd,)
    param = next(hf_model.parameters())
    with torch.device(param.device):
        new = type(hf_model)(new_config).to(param.dtype)
    new.load_state_dict(state, strict=True)
    if getattr(hf_model, "generation_config", None) is not None:
        new.generation_config = copy.deepcopy(hf_model.generation_config)
    new.train(hf_model.training)
    return new
