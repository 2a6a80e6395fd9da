"""GPTQ: quantize a weight matrix column by column, letting the not-yet-quantized columns absorb each error.

Frantar, Ashkboos, Hoefler & Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers" (ICLR 2023, arXiv:2210.17323), built on Optimal Brain Surgeon / Optimal Brain
Quantization (Hassibi & Stork 1993; Frantar & Alistarh 2022).

Round-to-nearest (``quantize.quantize``) makes each weight as close as it can to the original; what the
model needs is each layer's *output* to stay close on the inputs it really sees. For a layer y = xWᵀ and
calibration inputs X (n, in), GPTQ minimises, for every output row w (in,) independently,

    ‖Xwᵀ − Xŵᵀ‖² = (w − ŵ) H (w − ŵ)ᵀ / 2 · n,   with   H = 2·XᵀX / n   (the Hessian, ``calibrate.py``).

The loss is exactly quadratic, so second-order reasoning is exact (OBS): after rounding input column i
(error e_i = w_i − q_i), the change of the still-free columns F that best compensates it is

    δ_F = − e_i / [H_F⁻¹]_ii · [H_F⁻¹]_{i,F}        (H_F: H restricted to the columns not yet quantized).

Columns that are correlated with column i in the data move to cancel its error in the output. GPTQ's
three tricks make that fast and stable: (1) every row uses the same column order, so H_F⁻¹ is shared by
all rows; (2) the rows [H_F⁻¹]_{i,F} / sqrt([H_F⁻¹]_ii) for F = {i, i+1, ...} are exactly the rows of the
upper Cholesky factor U of H⁻¹ (H⁻¹ = UᵀU), computed once; (3) updates are applied to a block of
``block_size`` columns immediately and to the rest of the matrix in one matmul per block ("lazy batch").
A small damping (``damp`` × mean diagonal added to H) keeps the inverse well conditioned.

The output is a ``QuantizedWeight`` in exactly the format of ``quantize.quantize`` (int8 / packed int4,
scale and zero per output channel or per group), so ``WeightOnlyLinear`` and every kernel read it as they
read RTN weights; only the integers (and, per group, the scales) differ. A group's scale and zero come
from ``quantize.qparams`` over the group's columns *as updated so far*, at the moment the group starts
(as in the reference implementation); with ``act_order`` (columns in order of decreasing H_ii, which
helps on outlier-heavy models) they come from the original weights ("static groups"), so that groups stay
contiguous in the storage format. Per-tensor scales are not supported here.

For an engine: ``calibrate.collect_inputs`` (Hessians of every layer from the float model, one pass over
train-split windows) then ``quantize_engine_gptq``; or ``quantize_engine_gptq_sequential``, which
calibrates decoder layer by decoder layer on the already-quantized prefix, as the paper does.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from course_lib.compression.linear import PATHS, WeightOnlyLinear
from course_lib.compression.quantize import (
    QuantConfig,
    QuantizedWeight,
    check_weight,
    dequantize,
    pack_int4,
    qparams,
    quantize,
)


def _check_args(weight, H, config, damp, block_size, act_order) -> None:
    if not isinstance(config, QuantConfig):
        raise ValueError(f"config must be a QuantConfig, got {type(config).__name__}")
    if config.granularity == "tensor":
        raise ValueError(
            "config: per-tensor scales are not supported by GPTQ here; use granularity 'channel' or 'group'"
        )
    check_weight(weight, config, "weight")  # float 2-D, groups divide the input, even input for int4
    k = weight.shape[1]
    if not isinstance(H, torch.Tensor) or H.dim() != 2 or tuple(H.shape) != (k, k):
        raise ValueError(
            f"H must be a ({k}, {k}) tensor (in × in of weight {tuple(weight.shape)}), got "
            f"{tuple(getattr(H, 'shape', ())) if isinstance(H, torch.Tensor) else type(H).__name__}"
        )
    if not H.is_floating_point() or not bool(torch.isfinite(H).all()):
        raise ValueError("H must be a floating-point matrix with finite values")
    if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not damp >= 0 or damp == float("inf"):
        raise ValueError(f"damp must be a number >= 0, got {damp!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    if not isinstance(act_order, bool):
        raise ValueError(f"act_order must be a bool, got {act_order!r}")


def inverse_cholesky(H: torch.Tensor, damp: float = 0.01, retries: int = 4) -> torch.Tensor:
    """Upper Cholesky factor U of (H + λI)⁻¹ (so that (H + λI)⁻¹ = UᵀU), λ = damp · mean(diag H).
    Computed in float64. If H + λI is not positive definite, λ is raised ×10 (up to ``retries`` times)."""
    dev = H.device if H.device.type in ("cpu", "cuda") else torch.device("cpu")  # float64 where it exists
    Hd = H.to(dev, torch.float64)
    mean_diag = Hd.diagonal().mean().clamp(min=1e-12)
    eye = torch.eye(Hd.shape[0], dtype=Hd.dtype, device=dev)
    for _ in range(retries + 1):
        L, info = torch.linalg.cholesky_ex(Hd + damp * mean_diag * eye)
        if int(info) == 0:
            Hinv = torch.cholesky_inverse(L)  # (H + λI)⁻¹ from its Cholesky factor
            return torch.linalg.cholesky(Hinv, upper=True).to(H.device, torch.float32)
        damp = max(damp * 10, 1e-4)
    raise ValueError(f"H is not positive definite even with damp={damp / 10:g}; is it XᵀX of real inputs?")


@torch.no_grad()
def gptq_quantize(
    weight: torch.Tensor,
    H: torch.Tensor,
    config: QuantConfig,
    *,
    damp: float = 0.01,
    block_size: int = 128,
    act_order: bool = False,
) -> QuantizedWeight:
    """Quantize ``weight`` (out, in) with GPTQ for inputs whose Hessian is ``H`` (in, in), in the storage
    format of ``quantize.quantize(weight, config)``. ``dequantize`` of the result is the GPTQ weight."""
    _check_args(weight, H, config, damp, block_size, act_order)
    W = weight.detach().float().clone()  # the working copy: columns are updated as others are quantized
    H = H.detach().to(W.device, torch.float32).clone()
    out, k = W.shape
    g = config.group_size if config.granularity == "group" else k
    row_config = dataclasses.replace(config, granularity="channel")  # qparams of one group, row by row

    dead = H.diagonal() == 0  # inputs that were always 0: they cannot matter, so quantize them as 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0

    dynamic = config.granularity == "group" and not act_order  # group params fixed when the group starts
    if dynamic:
        scale = torch.empty(out, k // g, device=W.device)
        zero = torch.empty(out, k // g, device=W.device)
        block_size = max(g, block_size // g * g)  # blocks hold whole groups
    else:  # per channel, or static groups for act_order: from the (original) weights
        scale, zero = qparams(W, config)

    perm = None
    if act_order:  # quantize the inputs with the largest H_ii (largest activations) first
        perm = torch.argsort(H.diagonal(), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
    U = inverse_cholesky(H, damp)  # row i: how quantizing column i moves the columns after it
    Q = torch.empty(out, k, dtype=torch.int32, device=W.device)  # the integers, in processing order

    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        W1 = W[:, i1:i2].clone()  # this block, updated column by column
        E1 = torch.zeros_like(W1)  # the scaled errors, for the lazy update of the columns after the block
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if dynamic and col % g == 0:
                s, z = qparams(W1[:, i : i + g], row_config)  # (out, 1): this group, as updated so far
                scale[:, col // g], zero[:, col // g] = s[:, 0], z[:, 0]
            grp = (col if perm is None else int(perm[col])) // g
            s, z = scale[:, grp], zero[:, grp]
            w = W1[:, i]
            q = torch.round((w - z) / s).clamp_(config.qmin, config.qmax)  # round to nearest on the grid
            Q[:, col] = q.to(torch.int32)
            err = (w - (q * s + z)) / U1[i, i]  # (w − ŵ) / sqrt([H_F⁻¹]_ii)
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]  # OBS update of the rest of the block
            E1[:, i] = err
        W[:, i2:] -= E1 @ U[i1:i2, i2:]  # the same updates, applied at once to every later column

    if perm is not None:
        Q = Q[:, torch.argsort(perm)]  # back to the input order of the storage format
    data = Q.to(torch.int8) if config.bits == 8 else pack_int4((Q + 8).to(torch.uint8))
    return QuantizedWeight(data, scale.float().contiguous(), zero.float().contiguous(), config, (out, k))


@torch.no_grad()
def relative_output_error(weight: torch.Tensor, w_hat: torch.Tensor, H: torch.Tensor) -> float:
    """‖X(W − Ŵ)ᵀ‖² / ‖XWᵀ‖² computed from H ∝ XᵀX alone: tr(ΔHΔᵀ) / tr(WHWᵀ)."""
    W = weight.detach().float()
    D = W - w_hat.float().to(W.device)
    H = H.to(W.device, torch.float32)
    return float(((D @ H) * D).sum() / ((W @ H) * W).sum().clamp(min=1e-30))


def _targets(engine, include_lm_head: bool, names=None) -> list[str]:
    """The layers to quantize, in forward order: ``names`` (default: all but the LM head unless asked)."""
    all_names = [n for n, _ in engine.model.linears()]
    if names is None:
        return [n for n in all_names if include_lm_head or n != "lm_head"]
    unknown = [n for n in names if n not in all_names]
    if unknown:
        raise ValueError(f"names has unknown layers {unknown}; names look like 'layers.0.qkv' or 'lm_head'")
    return [n for n in all_names if n in names]


@torch.no_grad()
def gptq_qweights(
    engine,
    config: QuantConfig,
    hessians: dict[str, torch.Tensor],
    *,
    include_lm_head: bool = False,
    names=None,
    damp: float = 0.01,
    block_size: int = 128,
    act_order: bool = False,
) -> tuple[dict[str, QuantizedWeight], dict]:
    """GPTQ weights for the engine's linear layers (``names``, default all but the LM head unless
    ``include_lm_head``), without touching the engine: ({name: qw}, report). The dict can also go to
    ``apply.quantize_engine(engine, config, qweights=...)``."""
    if not isinstance(hessians, dict):
        raise ValueError(
            f"hessians must be a dict {{layer name: H}} (see calibrate.collect_inputs), got {type(hessians).__name__}"
        )
    if not isinstance(config, QuantConfig) or config.granularity == "tensor":
        raise ValueError(f"config must be a QuantConfig with granularity 'channel' or 'group', got {config!r}")
    targets = _targets(engine, include_lm_head, names)
    missing = [n for n in targets if n not in hessians]
    if missing:
        raise ValueError(f"hessians has no entry for layers {missing}; calibrate them with collect_inputs")
    start = time.perf_counter()
    layers = dict(engine.model.linears())
    qweights: dict[str, QuantizedWeight] = {}
    report_layers: dict[str, dict] = {}
    for name in targets:
        lin = layers[name]
        if isinstance(lin, WeightOnlyLinear):
            raise ValueError(f"layer {name!r} is already quantized; quantize a fresh Engine(engine.hf_model, ...)")
        t = time.perf_counter()
        H = hessians[name]
        qw = gptq_quantize(lin.weight, H, config, damp=damp, block_size=block_size, act_order=act_order)
        seconds = time.perf_counter() - t
        qweights[name] = qw
        report_layers[name] = {
            "seconds": seconds,
            "gptq_error": relative_output_error(lin.weight, dequantize(qw), H),
            "rtn_error": relative_output_error(lin.weight, dequantize(quantize(lin.weight, config)), H),
        }
    report = {"config": config.name, "layers": report_layers, "seconds": time.perf_counter() - start}
    return qweights, report


def _check_path(path: str) -> None:
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")


def quantize_engine_gptq(
    engine,
    config: QuantConfig,
    hessians: dict[str, torch.Tensor],
    *,
    include_lm_head: bool = False,
    path: str = "auto",
    damp: float = 0.01,
    block_size: int = 128,
    act_order: bool = False,
) -> dict:
    """Replace each linear layer of ``engine`` (the LM head only if ``include_lm_head``) by a
    ``WeightOnlyLinear`` holding its GPTQ weights. Returns {"config", "layers": {name: {"seconds",
    "gptq_error", "rtn_error"}}, "seconds"}, the errors being relative output errors on the calibration
    inputs (``relative_output_error``). The ``transformers`` model keeps its float weights."""
    _check_path(path)
    qweights, report = gptq_qweights(
        engine,
        config,
        hessians,
        include_lm_head=include_lm_head,
        damp=damp,
        block_size=block_size,
        act_order=act_order,
    )
    layers = dict(engine.model.linears())
    for name, qw in qweights.items():
        engine.model.set_linear(name, WeightOnlyLinear.from_linear(layers[name], config, path=path, qw=qw))
    return report


def quantize_engine_gptq_sequential(
    engine,
    config: QuantConfig,
    *,
    n_samples: int = 32,
    seq_len: int = 256,
    include_lm_head: bool = False,
    path: str = "auto",
    seed: int = 0,
    damp: float = 0.01,
    block_size: int = 128,
    act_order: bool = False,
) -> dict:
    """GPTQ as in the paper's reference code: decoder layer by decoder layer, each calibrated on the
    outputs of the layers before it *already quantized*, so it also compensates their errors. One
    calibration pass (``calibrate.collect_inputs`` on the train split) per decoder layer, against one
    for ``collect_inputs`` + ``quantize_engine_gptq``. Within a decoder layer, q/k/v, o, gate/up and
    down share one pass. Returns the report of ``quantize_engine_gptq`` plus "calibration_seconds"."""
    from course_lib.compression.calibrate import collect_inputs

    _check_path(path)
    targets = _targets(engine, include_lm_head)
    stages: dict[str, list[str]] = {}
    for name in targets:  # "layers.3.o" → stage "layers.3"; "lm_head" alone
        stages.setdefault(name.rsplit(".", 1)[0] if name.startswith("layers.") else name, []).append(name)
    report = {"config": config.name, "layers": {}, "seconds": 0.0, "calibration_seconds": 0.0}
    for names in stages.values():
        t = time.perf_counter()
        hessians = collect_inputs(engine, names, n_samples, seq_len, seed=seed)
        report["calibration_seconds"] += time.perf_counter() - t
        qweights, part = gptq_qweights(
            engine, config, hessians, names=names, damp=damp, block_size=block_size, act_order=act_order
        )
        layers = dict(engine.model.linears())
        for name, qw in qweights.items():
            engine.model.set_linear(name, WeightOnlyLinear.from_linear(layers[name], config, path=path, qw=qw))
        report["layers"].update(part["layers"])
        report["seconds"] += part["seconds"]
    return report


__all__ = [
    "gptq_qweights",
    "gptq_quantize",
    "inverse_cholesky",
    "quantize_engine_gptq",
    "quantize_engine_gptq_sequential",
    "relative_output_error",
]
