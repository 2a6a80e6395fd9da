"""Calibration for GPTQ: what inputs does each linear layer of the engine actually see?

GPTQ (``compression.gptq``) does not minimise the error on the weights, ‖W − Ŵ‖², as round-to-nearest
does; it minimises the error on the layer's *outputs* over real inputs X (rows = tokens):
‖XWᵀ − XŴᵀ‖². That error is a quadratic form in the weight error whose matrix, the Hessian, is the
same for every output row: H = 2·XᵀX / n (in, in). So a layer's calibration is summed into one
(in, in) matrix, whatever the number of tokens, and the activations themselves are never stored.

``collect_inputs`` runs ``n_samples`` windows of ``seq_len`` tokens from the corpus's *train* split
(never the validation split the perplexity is measured on) through ``engine.model.dense_logits``,
with each target layer temporarily wrapped by an object that adds its input's XᵀX to a running sum.

Called once on the float engine, it gives every layer's Hessian from the *float* model in one pass:
the simple variant. The GPTQ paper (and its reference code) quantizes *sequentially*: decoder layer k's
inputs are collected after layers < k are already quantized, so each layer also corrects the error its
predecessors introduced. That is a little better and costs one calibration pass per decoder layer;
``gptq.quantize_engine_gptq_sequential`` does it by calling ``collect_inputs`` once per decoder layer.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import numpy as np
import torch


class HessianRecorder:
    """Stands in for a ``Linear`` during calibration: forwards to it and accumulates XᵀX of its inputs."""

    def __init__(self, inner) -> None:
        self.inner = inner
        k = inner.weight.shape[1]
        self.xtx = torch.zeros(k, k, dtype=torch.float32, device=inner.weight.device)  # Σ xᵀx, fp32
        self.rows = 0

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.detach().reshape(-1, x.shape[-1]).float()  # (rows, in)
        self.xtx.addmm_(x2.T, x2)
        self.rows += x2.shape[0]
        return self.inner(x)

    __call__ = forward

    def hessian(self) -> torch.Tensor:
        """H = 2·XᵀX / n: the Hessian of the mean squared output error ‖XWᵀ − XŴᵀ‖² / n per output row."""
        if self.rows == 0:
            raise RuntimeError("this layer saw no input during calibration")
        return 2.0 * self.xtx / self.rows


def calibration_windows(
    engine, n_samples: int = 32, seq_len: int = 256, split: str = "train", seed: int = 0, data=None
) -> torch.Tensor:
    """``n_samples`` windows (n_samples, seq_len) of token ids at random (seeded) offsets of ``data``
    (default: the corpus ``split`` in ``engine.tokenizer``'s ids)."""
    for name, value in (("n_samples", n_samples), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if seq_len > engine.model.max_position:
        raise ValueError(f"seq_len={seq_len} exceeds the model's context window of {engine.model.max_position}")
    if data is None:
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        from course_lib.models.tokenizer import token_ids

        data = token_ids(engine.tokenizer, split)
    data = np.asarray(data)
    if data.ndim != 1 or not np.issubdtype(data.dtype, np.integer):
        raise ValueError(f"data must be a 1-D array of token ids, got shape {data.shape} dtype {data.dtype}")
    if len(data) < seq_len:
        raise ValueError(f"data has {len(data)} tokens, fewer than seq_len={seq_len}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - seq_len + 1, (n_samples,), generator=gen).tolist()
    windows = np.stack([data[s : s + seq_len].astype(np.int64) for s in starts])
    return torch.from_numpy(windows).to(engine.device)


@torch.no_grad()
def layer_names(engine, names) -> list[str]:
    """``names`` (None: every linear layer; one name; or a list) checked against the engine's layers."""
    layers = [n for n, _ in engine.model.linears()]
    names = list(layers) if names is None else [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in layers]
    if unknown:
        raise ValueError(f"names has unknown layers {unknown}; names look like 'layers.0.qkv' or 'lm_head'")
    if not names:
        raise ValueError("names is empty: no layer to record")
    return names


def _forward_until(model, ids: torch.Tensor, names) -> None:
    """Run (B, T) ids through the model only as far as the last layer in ``names`` needs: no LM head (and
    its (B, T, V) logits) unless ``lm_head`` is recorded, no decoder layer after the last recorded one."""
    if "lm_head" in names:
        model.dense_logits(ids)
        return
    from course_lib.engine.attention import NoCacheBackend

    stop = 1 + max(int(n.split(".")[1]) for n in names)
    B, T = ids.shape
    backend = NoCacheBackend(max(T, 1))
    positions = torch.arange(T, device=ids.device).repeat(B)
    meta = backend.prepare([backend.allocate() for _ in range(B)], [T] * B, positions)
    model.run_layers(model.embed(ids.reshape(-1)), positions, meta, backend, stop=stop)


def record_linear_inputs(engine, names, batches, make_recorder) -> dict:
    """Run ``batches`` of token ids ((B, T) tensors) through ``engine.model`` with every linear layer in
    ``names`` (None: all) temporarily replaced by ``make_recorder(layer)``, a wrapper that sees the
    layer's inputs and calls it; returns {name: recorder}. The model always gets its own layers back."""
    layers = dict(engine.model.linears())
    names = layer_names(engine, names)
    recorders = {n: make_recorder(layers[n]) for n in names}
    try:
        for n, rec in recorders.items():
            engine.model.set_linear(n, rec)
        for ids in batches:
            _forward_until(engine.model, ids, names)
    finally:
        for n in recorders:
            engine.model.set_linear(n, layers[n])
    return recorders


def collect_inputs(
    engine,
    names=None,
    n_samples: int = 32,
    seq_len: int = 256,
    split: str = "train",
    *,
    seed: int = 0,
    batch: int = 8,
    data=None,
) -> dict[str, torch.Tensor]:
    """{layer name: H (in, in) fp32} for the engine's linear layers ``names`` (default: all, in forward
    order), from ``n_samples`` calibration windows of ``seq_len`` tokens of the ``split`` (or ``data``)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    names = layer_names(engine, names)  # before any work
    windows = calibration_windows(engine, n_samples, seq_len, split, seed, data)
    batches = [windows[first : first + batch] for first in range(0, len(windows), batch)]
    recorders = record_linear_inputs(engine, names, batches, HessianRecorder)
    return {n: rec.hessian() for n, rec in recorders.items()}


__all__ = ["HessianRecorder", "calibration_windows", "collect_inputs", "record_linear_inputs"]
