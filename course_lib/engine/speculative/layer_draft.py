"""A draft built from the target's own shape: a few decoder layers, its final norm, its input embedding
(shared, not copied), and an LM head over only N of its V tokens, mapped back to the target's ids.

The truncated head is the point (FR-Spec; EAGLE-3's reduced draft vocabulary): a draft token costs
about the bytes it reads, and SmolLM2's tied 49,152 × 576 head is a fifth of the model, so a draft that
keeps it can never be cheap. ``TruncatedHead`` computes logits for its N ids and scatters them into a
(M, V) row of −inf, so the draft engine looks like any other to ``DraftProposer`` and the verifier:
token ids mean the target's tokens, a draft can never propose a token outside its N (the target then
rejects and corrects as usual), and sampling stays exact (q is 0 outside the N). Weights are shipped
by ``decoding.layer_draft_train`` in ``data/models/<name>/``. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

WEIGHTS_NAME = "draft.safetensors"
CONFIG_NAME = "draft_config.json"


class TruncatedHead:
    """Final-layer projection onto ``ids`` (N,) only: ``forward(x (M, D))`` → logits (M, V), −inf outside ``ids``."""

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> None:
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ValueError(f"weight must be a 2-D tensor (N, D), got {getattr(weight, 'shape', type(weight))}")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.shape[0] != weight.shape[0]:
            raise ValueError(f"ids must be a 1-D tensor of {weight.shape[0]} token ids (one per row of weight)")
        ids = ids.long()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise ValueError(f"ids must lie in [0, {vocab_size}), got min {int(ids.min())}, max {int(ids.max())}")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("ids must be distinct token ids")
        self.weight, self.ids, self.vocab_size = weight, ids.to(weight.device), vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = x @ self.weight.T  # (M, N): reads N·D weights, not V·D
        out = small.new_full((x.shape[0], self.vocab_size), float("-inf"))  # (M, V)
        out[:, self.ids] = small
        return out

    __call__ = forward


def build_hf_draft(target_hf, layers: list[int], copy_weights: bool = True):
    """A ``transformers`` Llama with the target's config but only the decoder layers ``layers`` (copied
    from the target, in that order, when ``copy_weights``: training starts there; loading a shipped draft
    overwrites them anyway, and a target built with ``linear="packed"`` has no plain weights to copy) and a
    1-token placeholder vocabulary: the caller supplies the input embedding (training passes
    ``inputs_embeds``; ``load_layer_draft`` shares the target's)."""
    from transformers import LlamaForCausalLM

    n = target_hf.config.num_hidden_layers
    if not layers or any(not isinstance(i, int) or not 0 <= i < n for i in layers):
        raise ValueError(f"layers must be a non-empty list of layer indices in [0, {n}), got {layers!r}")
    cfg = copy.deepcopy(target_hf.config)
    cfg.num_hidden_layers, cfg.vocab_size, cfg.pad_token_id = len(layers), 1, None
    cfg.layer_types = None if getattr(cfg, "layer_types", None) is None else cfg.layer_types[: len(layers)]
    draft = LlamaForCausalLM(cfg).to(target_hf.dtype)
    with torch.no_grad():
        for j, i in enumerate(layers if copy_weights else []):
            draft.model.layers[j].load_state_dict(target_hf.model.layers[i].state_dict())
        draft.model.norm.weight.copy_(target_hf.model.norm.weight)
    return draft.eval()


def resolve_draft(name_or_path: str | Path) -> Path:
    """A folder with the draft's files: a path, or a name under ``data/models``."""
    from course_lib.core.paths import data_dir

    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path):
        raise ValueError(f"name_or_path must be a draft's name or folder, got {name_or_path!r}")
    path = Path(name_or_path)
    if not path.is_dir():
        path = data_dir() / "models" / str(name_or_path)
    if not (path / WEIGHTS_NAME).is_file() or not (path / CONFIG_NAME).is_file():
        raise ValueError(f"no layer draft at {path}: expected {WEIGHTS_NAME} and {CONFIG_NAME} there")
    return path


def load_layer_draft(target, name_or_path: str | Path = "smollm2-135m-draft", config=None, linear: str = "auto"):
    """An ``Engine`` for the shipped draft next to ``target`` (an ``Engine``): its layers and truncated head
    from the folder, the input embedding and tokenizer shared with the target. ``config``: the draft's
    ``SchedulerConfig`` (default: the target's); ``linear``: its layers' kernels, as ``Engine``'s."""
    from safetensors.torch import load_file

    from course_lib.engine.engine import Engine

    if not isinstance(target, Engine):
        raise ValueError(f"target must be an Engine, got {type(target).__name__}")
    path = resolve_draft(name_or_path)
    meta = json.loads((path / CONFIG_NAME).read_text())
    state = load_file(str(path / WEIGHTS_NAME))
    hf = target.hf_model
    D = hf.config.hidden_size
    head = state.pop("lm_head.weight")
    ids = state.pop("vocab_ids").long()
    if head.shape[1] != D:
        raise ValueError(f"the draft at {path} has hidden size {head.shape[1]}; the target's is {D}")
    draft = build_hf_draft(hf, list(range(int(meta["num_layers"]))), copy_weights=False)
    dt = target.model.dtype
    missing = draft.model.load_state_dict({k: v.to(dt) for k, v in state.items()}, strict=False)
    if [k for k in missing.missing_keys if not k.startswith("embed_tokens")] or missing.unexpected_keys:
        raise ValueError(f"the draft at {path} does not match the target's layers: {missing}")
    return layer_draft_engine(target, draft, head.to(dt), ids, config, linear)


def layer_draft_engine(
    target, hf_draft, head_weight: torch.Tensor, ids: torch.Tensor, config=None, linear: str = "auto"
):
    """An ``Engine`` over ``hf_draft`` (from ``build_hf_draft``) whose input embedding is the target's (shared)
    and whose LM head is ``TruncatedHead(head_weight (N, D), ids (N,))``: the draft's logits are over the
    target's V ids, −inf outside ``ids``."""
    from course_lib.engine.engine import Engine

    if not isinstance(target, Engine):
        raise ValueError(f"target must be an Engine, got {type(target).__name__}")
    hf = target.hf_model
    V = hf.config.vocab_size
    head = TruncatedHead(head_weight.to(target.model.dtype).to(target.device), ids, V)  # checks ids first
    hf_draft.model.embed_tokens.weight = hf.model.embed_tokens.weight  # shared with the target, not copied
    hf_draft.config.vocab_size = V
    cfg = config or target.config
    eng = Engine(hf_draft.to(target.device), target.tokenizer, device=target.device, config=cfg, linear=linear)
    eng.model.set_linear("lm_head", head)
    return eng
