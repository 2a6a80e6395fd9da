"""A rank's model straight from the safetensors file and config.json, without importing ``transformers``.

Each tensor-parallel rank is its own interpreter. Importing ``transformers`` (and building a meta-device
model to learn the shapes) costs every rank ~120 MB of private memory — code objects and module state no
other process shares — for a model the course engine never runs: the engine reads only the weights, the
config's numbers and the RoPE frequencies. ``load_standalone`` builds exactly that: a tree of plain
objects with the attribute paths ``LlamaEngineModel`` reads (``model.layers[i].self_attn.q_proj.weight``,
...), each projection already cut to rank's slice (``tp_load.read_slice``), RoPE's inverse frequencies
for the default rope type computed as ``transformers`` computes them, and a tokenizer from
``tokenizer.json`` (the ``tokenizers`` library, without ``transformers``' wrapper). Other rope types
(llama3, yarn, ...) return None and the caller falls back to the ``transformers`` path. Introduced in
07_parallelism.ipynb.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

ROPE_TYPES = (None, "default")


class _Config(SimpleNamespace):
    """config.json as attributes (``getattr(cfg, "head_dim", None)`` works as on a ``PretrainedConfig``)."""


def read_config(folder: str | Path) -> _Config:
    """The model's config.json as attributes, with ``transformers``' defaults for the fields the engine reads."""
    raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    cfg = _Config(**raw)
    cfg.num_key_value_heads = raw.get("num_key_value_heads") or raw["num_attention_heads"]
    cfg.tie_word_embeddings = raw.get("tie_word_embeddings", False)
    return cfg


def rope_type(cfg) -> str | None:
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return params.get("rope_type", params.get("type"))


def rope_theta(cfg) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def default_inv_freq(cfg) -> torch.Tensor:
    """1 / θ^(2i/d) for i < d/2: the default RoPE frequencies (transformers' ``_compute_default_rope_parameters``)."""
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 1.0 / (rope_theta(cfg) ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))  # (hd/2,)


class RankTokenizer:
    """The two calls the engine makes of a tokenizer — ``tok(text)["input_ids"]`` and ``decode`` — on the
    ``tokenizers`` library (what ``transformers``' fast tokenizer wraps)."""

    def __init__(self, folder: Path, eos_token_id) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.eos_token_id = eos_token_id

    def __call__(self, text: str) -> dict:
        return {"input_ids": self._tok.encode(text, add_special_tokens=True).ids}  # as transformers does

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _node(**kw) -> SimpleNamespace:
    return SimpleNamespace(**kw)


def _lin(tensors: dict, name: str) -> SimpleNamespace:
    return _node(weight=tensors[f"{name}.weight"], bias=tensors.get(f"{name}.bias"))


def load_standalone(folder: str | Path, read_tensors):
    """(model-like object, tokenizer) or None when the rope type needs ``transformers``. ``read_tensors(names)``
    returns {name: tensor} already cut to this rank's slices (``tp_load`` supplies it)."""
    folder = Path(folder)
    cfg = read_config(folder)
    if rope_type(cfg) not in ROPE_TYPES:
        return None
    L = cfg.num_hidden_layers
    layer_keys = [
        f"model.layers.{i}.{k}"
        for i in range(L)
        for k in (
            *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
            *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
        )
    ]
    tensors = read_tensors(["model.embed_tokens.weight", "model.norm.weight", *layer_keys])
    if "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]  # tied: the same tensor
    layers = []
    for i in range(L):
        pre = f"model.layers.{i}"
        attn = _node(**{f"{p}_proj": _lin(tensors, f"{pre}.self_attn.{p}_proj") for p in "qkvo"})
        mlp = _node(**{f"{p}_proj": _lin(tensors, f"{pre}.mlp.{p}_proj") for p in ("gate", "up", "down")})
        layers.append(
            _node(
                self_attn=attn,
                mlp=mlp,
                input_layernorm=_node(weight=tensors[f"{pre}.input_layernorm.weight"]),
                post_attention_layernorm=_node(weight=tensors[f"{pre}.post_attention_layernorm.weight"]),
            )
        )
    emb = tensors["model.embed_tokens.weight"]
    base = _node(
        embed_tokens=_node(weight=emb),
        norm=_node(weight=tensors["model.norm.weight"]),
        layers=layers,
        rotary_emb=_node(inv_freq=default_inv_freq(cfg), attention_scaling=1.0),
    )
    gen_file = folder / "generation_config.json"
    gen = json.loads(gen_file.read_text(encoding="utf-8")) if gen_file.is_file() else {}
    eos = gen.get("eos_token_id", getattr(cfg, "eos_token_id", None))
    model = _node(
        config=cfg,
        model=base,
        lm_head=_node(weight=tensors["lm_head.weight"]),
        generation_config=_node(eos_token_id=eos),
        dtype=emb.dtype,
        device=emb.device,
    )
    return model, RankTokenizer(folder, eos)


__all__ = ["RankTokenizer", "default_inv_freq", "load_standalone", "read_config", "rope_type"]
