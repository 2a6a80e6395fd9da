"""llama.cpp's Q4_1 is the course's int4: import a GGUF file's blocks as they are, without rounding again.

A Q4_1 block is 20 bytes for 32 consecutive weights of a row: ``d`` (fp16), ``m`` (fp16), then 16 bytes of
nibbles u ∈ [0, 15], weight j = d·u_j + m, byte j holding u_j (low nibble) and u_{j+16} (high nibble).
The course's int4 (``compression.quantize``, ``kernels.quant_matmul.int4``) is asymmetric in groups of
``g`` inputs, w = (u − 8)·scale + zero, byte j holding u_{2j} (low) and u_{2j+1} (high). So Q4_1 *is*
int4 asym g32: scale = d, zero = m + 8·d, the same u, only the nibbles move within their byte pairs.
Neither the integers nor the scales are rounded again: ``d`` and ``m`` widen exactly to fp32, and
zero = m + 8·d is exact in fp32 (checked per tensor: two fp16 values and a power of two), so
(u − 8)·d + zero = d·u + m before the one rounding that the ``gguf`` package's own fp32 dequantization
(what ``transformers`` loads) also does — the two agree bit for bit (tests/test_gguf_int4.py).
The embedding is Q8_0 (34 bytes per 32 weights: ``d`` fp16, 32 int8 q; w = d·q), the course's int8
symmetric in groups of 32. llama.cpp stores q and k with their rows permuted for its RoPE (pairs
(i, i + hd/2) of a head made adjacent); ``transformers`` undoes that on the float rows, and permuting
whole rows moves whole blocks, so we undo it on the blocks. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from course_lib.compression.quantize import QuantConfig, QuantizedWeight, pack_int4

Q4_1_CONFIG = QuantConfig(bits=4, symmetric=False, granularity="group", group_size=32)
Q8_0_CONFIG = QuantConfig(bits=8, symmetric=True, granularity="group", group_size=32)
BLOCK = 32
Q4_1_BYTES = 20  # d (2) + m (2) + 16 bytes of nibbles
Q8_0_BYTES = 34  # d (2) + 32 int8

#: GGUF leaf name → the Hugging Face Llama module (transformers' map, gguf-py's TensorNameMap)
HF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
#: the engine's fused layers (engine.model.LINEAR_NAMES) from the HF modules, rows stacked in this order
ENGINE_FUSION = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}


def _check_blocks(raw, in_features: int, block_bytes: int, name: str) -> np.ndarray:
    if not isinstance(in_features, int) or isinstance(in_features, bool) or in_features < BLOCK:
        raise ValueError(f"in_features must be a positive multiple of {BLOCK}, got {in_features!r}")
    if in_features % BLOCK:
        raise ValueError(f"in_features must be a multiple of the block size {BLOCK}, got {in_features}")
    raw = raw.numpy() if isinstance(raw, torch.Tensor) else raw
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D uint8 array (rows, blocks·{block_bytes} bytes), got "
            f"{getattr(raw, 'dtype', type(raw).__name__)} {tuple(getattr(raw, 'shape', ()))}"
        )
    want = in_features // BLOCK * block_bytes
    if raw.shape[1] != want:
        raise ValueError(
            f"{name} has {raw.shape[1]} bytes per row; {in_features} inputs need {want} ({block_bytes} per block)"
        )
    return np.ascontiguousarray(raw)


def _fp16(raw: np.ndarray, start: int) -> np.ndarray:
    """(rows, blocks, bytes) → fp32 (rows, blocks) from the little-endian fp16 at byte ``start``: exact."""
    return np.ascontiguousarray(raw[..., start : start + 2]).view("<f2")[..., 0].astype(np.float32)


def q4_1_to_int4(raw, in_features: int, name: str = "raw") -> QuantizedWeight:
    """Q4_1 blocks (rows, in/32·20) uint8 → the course's int4 asym g32, bit-exact (see the module docstring)."""
    raw = _check_blocks(raw, in_features, Q4_1_BYTES, name)
    rows = raw.shape[0]
    blocks = raw.reshape(rows, in_features // BLOCK, Q4_1_BYTES)  # (rows, nb, 20)
    d, m = _fp16(blocks, 0), _fp16(blocks, 2)  # (rows, nb) each
    qs = blocks[..., 4:]  # (rows, nb, 16): byte j = u_j | u_{j+16} << 4
    u = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, in_features)  # (rows, in), u ∈ [0, 15]
    zero = m + np.float32(8) * d  # (rows, nb) fp32
    exact = zero.astype(np.float64) == m.astype(np.float64) + 8 * d.astype(np.float64)
    if not exact.all():
        raise ValueError(
            f"{name}: zero = m + 8·d is not exact in fp32 for {int((~exact).sum())} of {exact.size} blocks; "
            "these would be rounded a second time"
        )
    data = pack_int4(torch.from_numpy(u))  # (rows, in/2): the course's nibble order
    return QuantizedWeight(
        data, torch.from_numpy(d).contiguous(), torch.from_numpy(zero).contiguous(), Q4_1_CONFIG, (rows, in_features)
    )


def q8_0_to_int8(raw, in_features: int, name: str = "raw") -> QuantizedWeight:
    """Q8_0 blocks (rows, in/32·34) uint8 → the course's int8 symmetric g32: q as stored, scale = d, zero 0."""
    raw = _check_blocks(raw, in_features, Q8_0_BYTES, name)
    rows = raw.shape[0]
    blocks = raw.reshape(rows, in_features // BLOCK, Q8_0_BYTES)  # (rows, nb, 34)
    d = _fp16(blocks, 0)  # (rows, nb)
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(rows, in_features)  # (rows, in)
    scale = torch.from_numpy(d).contiguous()
    return QuantizedWeight(torch.from_numpy(q.copy()), scale, torch.zeros_like(scale), Q8_0_CONFIG, (rows, in_features))


def reverse_permute_rows(x: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (``transformers``' ``LlamaTensorProcessor._reverse_permute_weights``):
    rows (n_head, hd/2, 2) → (n_head, 2, hd/2). Whole rows move, so it applies to blocks as to floats."""
    if not isinstance(n_head, int) or isinstance(n_head, bool) or n_head < 1:
        raise ValueError(f"n_head must be a positive int, got {n_head!r}")
    if not isinstance(x, np.ndarray) or x.ndim < 1 or x.shape[0] % (2 * n_head):
        raise ValueError(
            f"x must be an array whose rows divide into {n_head} heads of an even size, got "
            f"shape {tuple(getattr(x, 'shape', ()))}"
        )
    dim = x.shape[0] // n_head // 2
    return x.reshape(n_head, dim, 2, *x.shape[1:]).swapaxes(2, 1).reshape(x.shape)


_KEYS = ("general.architecture", "llama.attention.head_count", "llama.attention.head_count_kv")


def _reader(path):
    """(the file's ``GGUFTable``, query heads, KV heads): only the tensor table and three metadata values are
    read (``models.gguf_table.read_gguf_table``), not the vocabulary's ~147k metadata parts."""
    from course_lib.models.gguf_table import read_gguf_table

    if not isinstance(path, (str, Path)):
        raise ValueError(f"path must be a str or Path to a .gguf file, got {type(path).__name__}")
    table = read_gguf_table(path, _KEYS)  # missing, truncated or corrupt: a clear error before any block is read
    if table.byte_order != "I":
        raise ValueError(f"{path}: a byte-swapped GGUF file (big-endian) is not supported")

    def field(key: str):
        if key not in table.metadata:
            raise ValueError(f"{path}: the GGUF metadata has no {key!r}")
        return table.metadata[key]

    arch = field("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}; only 'llama' GGUF files are imported")
    return table, int(field("llama.attention.head_count")), int(field("llama.attention.head_count_kv"))


def gguf_qweights(path: str | Path) -> dict[str, QuantizedWeight]:
    """Every Q4_1 projection (as int4) and the Q8_0 embedding (as int8) of a Llama GGUF file, keyed by the
    Hugging Face parameter's module (``model.layers.3.self_attn.q_proj``, ``model.embed_tokens``), rows in
    transformers' order. A projection stored in another type raises: it is not the course's int4."""
    from gguf import GGMLQuantizationType as T

    table, heads, kv_heads = _reader(path)
    out: dict[str, QuantizedWeight] = {}
    for t in table.tensors:
        parts = t.name.split(".")  # blk.N.attn_q.weight | token_embd.weight | output.weight | output_norm.weight
        if t.name in ("token_embd.weight", "output.weight"):
            module = "model.embed_tokens" if t.name == "token_embd.weight" else "lm_head"
        elif len(parts) == 4 and parts[0] == "blk" and parts[2] in HF_NAMES:
            module = f"model.layers.{int(parts[1])}.{HF_NAMES[parts[2]]}"
        else:
            continue  # norms stay float (F32 in the file)
        in_features = int(t.shape[0])  # GGUF shapes are (ne0 = inputs, ne1 = rows)
        raw = np.asarray(t.data)
        if parts[-2] == "attn_q":
            raw = reverse_permute_rows(raw, heads)
        elif parts[-2] == "attn_k":
            raw = reverse_permute_rows(raw, kv_heads)
        if t.tensor_type == T.Q4_1:
            out[module] = q4_1_to_int4(raw, in_features, name=t.name)
        elif t.tensor_type == T.Q8_0:
            out[module] = q8_0_to_int8(raw, in_features, name=t.name)
        elif module.startswith("model.layers."):
            raise ValueError(f"{t.name} is {t.tensor_type.name}, not Q4_1: it has no exact int4 form")
    return out


def concat_rows(*weights: QuantizedWeight) -> QuantizedWeight:
    """One quantized matrix from several with the same inputs and format, rows stacked (q/k/v → qkv): exact,
    since every group lies within one row."""
    if not weights or not all(isinstance(w, QuantizedWeight) for w in weights):
        raise ValueError("concat_rows needs one or more QuantizedWeight")
    first = weights[0]
    for w in weights[1:]:
        if w.config != first.config or w.shape[1] != first.shape[1]:
            raise ValueError(
                f"concat_rows needs one format and one input size: {first.config.name} in={first.shape[1]} vs "
                f"{w.config.name} in={w.shape[1]}"
            )
    if len(weights) == 1:
        return first
    return QuantizedWeight(
        torch.cat([w.data for w in weights]),
        torch.cat([w.scale for w in weights]),
        torch.cat([w.zero for w in weights]),
        first.config,
        (sum(w.shape[0] for w in weights), first.shape[1]),
    )


def fuse_for_engine(hf: dict[str, QuantizedWeight], include_lm_head: bool = False) -> dict[str, QuantizedWeight]:
    """``gguf_qweights``' output under the engine's linear names (``layers.{i}.qkv|o|gate_up|down``, fused as
    ``engine.model`` fuses them). ``include_lm_head``: also ``lm_head``, the (tied) Q8_0 embedding as int8 g32."""
    if not isinstance(hf, dict) or not all(isinstance(v, QuantizedWeight) for v in hf.values()):
        raise ValueError("hf must be a dict of QuantizedWeight by module name, as gguf_qweights returns")
    if not isinstance(include_lm_head, bool):
        raise ValueError(f"include_lm_head must be a bool, got {include_lm_head!r}")
    layers = sorted({int(k.split(".")[2]) for k in hf if k.startswith("model.layers.")})
    out = {}
    for i in layers:
        for fused, parts in ENGINE_FUSION.items():
            names = [f"model.layers.{i}.{p}" for p in parts]
            missing = [n for n in names if n not in hf]
            if missing:
                raise ValueError(f"hf lacks {missing}: the file does not hold every projection of layer {i}")
            out[f"layers.{i}.{fused}"] = concat_rows(*(hf[n] for n in names))
    if include_lm_head:
        out["lm_head"] = hf.get("lm_head", hf["model.embed_tokens"])
    return out


def engine_qweights(path: str | Path, include_lm_head: bool = False) -> dict[str, QuantizedWeight]:
    """A GGUF file's weights under the engine's linear names, for
    ``compression.apply.quantize_engine(engine, Q4_1_CONFIG, qweights=...)``."""
    if not isinstance(include_lm_head, bool):
        raise ValueError(f"include_lm_head must be a bool, got {include_lm_head!r}")
    return fuse_for_engine(gguf_qweights(path), include_lm_head)


def quantize_engine_gguf(engine, path: str | Path, path_choice: str = "auto", include_lm_head: bool = False):
    """Put the file's own Q4_1 blocks into ``engine`` (an Engine of the same model) through its linear seam:
    int4 decode of the real model with no second rounding of the stored weights. Returns
    ``compression.apply``'s ``QuantReport``. On a CPU the packed kernel (``path_choice="auto"`` → "cpu")
    takes bf16 activations, scales and zeros (``compression.linear``); the "reference" and "triton" paths
    keep the fp32 scales. The LM head (Q8_0, int8 in groups of 32) runs on the slow reference path."""
    from course_lib.compression.apply import quantize_engine

    if not hasattr(engine, "model") or not hasattr(engine.model, "linears"):
        raise ValueError(f"engine must be a course Engine, got {type(engine).__name__}")
    qweights = engine_qweights(path, include_lm_head=include_lm_head)
    shapes = {name: (lin.out_features, lin.in_features) for name, lin in engine.model.linears()}
    wrong = [n for n, qw in qweights.items() if shapes.get(n) != qw.shape]
    if wrong:
        raise ValueError(
            f"the GGUF's weights do not fit this engine's layers {wrong[:3]}: "
            f"{[(shapes.get(n), qweights[n].shape) for n in wrong[:3]]}; load the model from the same file"
        )
    return quantize_engine(engine, Q4_1_CONFIG, qweights=qweights, path=path_choice, include_lm_head=include_lm_head)


__all__ = [
    "ENGINE_FUSION",
    "HF_NAMES",
    "Q4_1_CONFIG",
    "Q8_0_CONFIG",
    "concat_rows",
    "engine_qweights",
    "fuse_for_engine",
    "gguf_qweights",
    "q4_1_to_int4",
    "q8_0_to_int8",
    "quantize_engine_gguf",
    "reverse_permute_rows",
]
