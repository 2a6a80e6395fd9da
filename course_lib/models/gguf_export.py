"""Write a course checkpoint (a Llama ``config.json`` + ``model.safetensors`` + ``tokenizer.json`` folder) as an
F32 GGUF file that llama.cpp runs, so the course's own tiny models can be timed against llama.cpp too.

llama.cpp's converter (``convert_hf_to_gguf.py``) ships with its source, not with the ``llama-cpp-python``
wheel. This module does the part of it a Llama needs, with the ``gguf`` package it uses: the ``llama.*``
hyper-parameters, the byte-level BPE vocabulary (``tokenizer.ggml.model = "gpt2"``: the course tokenizer
is GPT-2's byte-level BPE, whose pre-tokenizer regex llama.cpp names ``"gpt-2"``; its hash is unknown to the
converter, hence this module), and the tensors under llama.cpp's names. One step is not a rename: HF's
rotary embedding rotates the two halves of each head (``rotate_half``), llama.cpp's rotates adjacent pairs,
so the converter permutes the rows of ``q_proj`` and ``k_proj`` (``permute`` below, as in
``LlamaModel.modify_tensors``). A tied LM head is written once, as ``token_embd.weight``. Tested in
tests/test_gguf_export.py against the shipped SmolLM2 GGUF (every tensor equal to its F32 re-encoding) and,
where llama.cpp is installed, by greedy tokens equal to the engine's. Used by ``benchmarks/vs_llamacpp.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: HF tensor name (after ``model.layers.{i}.``) → llama.cpp's (after ``blk.{i}.``)
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a (n_head·head_dim, in) q/k weight from HF's half-split rotary order to llama.cpp's pairs."""
    if w.ndim != 2 or w.shape[0] % (2 * n_head):
        raise ValueError(f"w must be (n_head·head_dim, in) with an even head_dim, got {w.shape} for n_head={n_head}")
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def _tokenizer_fields(folder: Path) -> dict:
    tok = json.loads((folder / "tokenizer.json").read_text())
    model = tok.get("model", {})
    if model.get("type") != "BPE" or (tok.get("pre_tokenizer") or {}).get("type") not in ("ByteLevel", "Sequence"):
        raise ValueError(f"{folder}/tokenizer.json is not a byte-level BPE tokenizer; only those are exported")
    vocab = dict(model["vocab"])
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = [None] * (max(vocab.values()) + 1)
    for text, i in vocab.items():
        tokens[i] = text
    if any(t is None for t in tokens):
        raise ValueError(f"{folder}/tokenizer.json leaves token ids unassigned; cannot write a dense vocabulary")
    special = {a["id"] for a in tok.get("added_tokens", []) if a.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    cfg = (
        json.loads((folder / "tokenizer_config.json").read_text())
        if (folder / "tokenizer_config.json").is_file()
        else {}
    )
    ids = {k: vocab.get(cfg.get(f"{k}_token")) for k in ("bos", "eos", "pad", "unk")}
    return dict(tokens=tokens, types=[3 if i in special else 1 for i in range(len(tokens))], merges=merges, ids=ids)


def gguf_tensors(cfg: dict, weights: dict):
    """Yield (llama.cpp name, F32 array in HF's (out, in) layout) for every tensor of the checkpoint."""
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])

    def f32(t):
        return np.ascontiguousarray(t, dtype=np.float32)

    yield "token_embd.weight", f32(weights["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        for hf, ours in LAYER_NAMES.items():
            t = weights[f"model.layers.{i}.{hf}"]
            if hf.startswith("self_attn.q_proj"):
                t = permute(t, heads)
            elif hf.startswith("self_attn.k_proj"):
                t = permute(t, kv_heads)
            yield f"blk.{i}.{ours}", f32(t)
    yield "output_norm.weight", f32(weights["model.norm.weight"])
    if not cfg.get("tie_word_embeddings", False):
        yield "output.weight", f32(weights["lm_head.weight"])


def export_llama(folder: str | Path, dst: str | Path, name: str | None = None) -> Path:
    """Write ``dst`` (F32 GGUF) from the checkpoint ``folder``; returns ``dst``."""
    from gguf import GGUFWriter
    from safetensors.numpy import load_file

    folder, dst = Path(folder), Path(dst)
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (folder / f).is_file()]
    if missing:
        raise ValueError(f"folder {str(folder)!r} must hold a Llama checkpoint; it lacks {missing}")
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise ValueError(
            f"only Llama checkpoints are exported, {folder}/config.json has model_type={cfg.get('model_type')!r}"
        )
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type {rope.get('rope_type')!r} is not exported: only the default rotary embedding")
    weights = load_file(str(folder / "model.safetensors"))
    tok = _tokenizer_fields(folder)

    w = GGUFWriter(dst, "llama")
    w.add_name(name or folder.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    if head_dim * heads != cfg["hidden_size"]:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id),
                     ("unk", w.add_unk_token_id)):  # fmt: skip
        if tok["ids"][key] is not None:
            add(tok["ids"][key])
    w.add_add_bos_token(False)  # the course tokenizers add no BOS (add_special_tokens changes nothing)

    for gguf_name, t in gguf_tensors(cfg, weights):
        w.add_tensor(gguf_name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


__all__ = ["LAYER_NAMES", "export_llama", "gguf_tensors", "permute"]
