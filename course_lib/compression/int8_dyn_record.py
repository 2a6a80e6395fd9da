"""``python -m course_lib.compression.int8_dyn_record``: the quality of int8 weights × int8 activations.

``WeightOnlyLinear(path="dynamic")`` (the ``int8-dyn`` row of ``benchmarks/vs_llamacpp.py``) runs fbgemm's
``quantized.linear_dynamic``: the int8 per-channel weights of the ``int8`` format, and each call's input
rounded to 8 bits with *one* scale and zero point for the whole call (per tensor, asymmetric: min and max
over every row the call gets). So its error depends on how many rows share a scale: at decode batch 1 each
token gets its own; a 256-token window scored in one call shares one across 256 tokens, and one outlier
token stretches the grid for all of them (SmoothQuant's point, Xiao et al., 2023). This command scores,
against the dequantized Q4_1 reference on the held windows of ``requant_record`` (``requant.compare_formats``:
perplexity, teacher-forced agreement, greedy chat answers), three formats, the LM head in each as in the
speed table: ``int8 per-channel RTN`` (weight-only, bf16 activations; it must equal that record's row),
``int8-dyn, per token`` (every call cut into single rows by ``RowChunked``: decode at batch 1)
and ``int8-dyn, per window`` (a window of 256 rows a call, as a prefill would be; the head gets
``requant.score``'s 64 rows a call), then two diagnostics, per token with the down projections or the head
kept weight-only (``dynamic_layers(weight_only=...)``), to say where the rounding costs, and the same
int8 weights with activations rounded in blocks of 32 channels, each its own scale (``block_layers``:
llama.cpp's Q8_0 layout, simulated in float). It writes
``data/measurements/smollm2-int8-dyn-quality.json`` with the machine and the command, plus each layer's
input outlier ratio (max |x| ÷ RMS over a window, ``activation_outliers``), what a per-tensor grid pays for.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

OUT = "smollm2-int8-dyn-quality.json"
ALL_ROWS = 1 << 30  # every input through the layer's fast path, as in requant.quantized_layers


class RowChunked:
    """``layer`` called on at most ``rows`` rows at a time: a dynamic-activation layer then takes one
    activation scale per ``rows`` rows (``rows=1``: per token, as decode at batch 1), the same products."""

    def __init__(self, layer, rows: int) -> None:
        if not callable(getattr(layer, "forward", None)):
            raise ValueError(f"layer must have a forward(x) method, got {type(layer).__name__}")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an int >= 1, got {rows!r}")
        self.layer, self.rows = layer, rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        y = torch.cat([self.layer.forward(x2[i : i + self.rows]) for i in range(0, x2.shape[0], self.rows)])
        return y.reshape(*lead, y.shape[-1])

    __call__ = forward

    def __getattr__(self, name):  # in_features, out_features, nbytes, qw ... of the wrapped layer
        if name in ("layer", "rows"):
            raise AttributeError(name)
        return getattr(self.layer, name)


def round_blocks(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """``x`` rounded to int8 and back in blocks of ``block`` along its last axis, each with its own scale
    max |x| / 127 (symmetric): the activation layout of llama.cpp's Q8_0 dot products (``block_q8_0``)."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an int >= 1, got {block!r}")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1 or x.shape[-1] % block:
        raise ValueError(f"x must be a float tensor whose last size divides into blocks of {block}")
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    scale = xb.abs().amax(-1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (torch.round(xb / scale).clamp(-127, 127) * scale).reshape(x.shape)


class BlockRounded:
    """``layer`` fed ``round_blocks(x, block)``: int8 activations with one scale per ``block`` channels of
    a token (llama.cpp's Q8_0 layout), simulated in float, to set beside fbgemm's one scale per call."""

    def __init__(self, layer, block: int = 32) -> None:
        if not callable(getattr(layer, "forward", None)):
            raise ValueError(f"layer must have a forward(x) method, got {type(layer).__name__}")
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be an int >= 1, got {block!r}")
        self.layer, self.block = layer, block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer.forward(round_blocks(x, self.block))

    __call__ = forward

    def __getattr__(self, name):
        if name in ("layer", "block"):
            raise AttributeError(name)
        return getattr(self.layer, name)


def block_layers(engine, block: int = 32) -> dict:
    """{name: ``BlockRounded``} for every float layer, the head too: the int8 per-channel weights of
    ``dynamic_layers`` dequantized once (fp32 products, no other rounding), activations rounded per block."""
    from course_lib.compression.decode_formats import INT8, quantize_chunked
    from course_lib.compression.linear import WeightOnlyLinear
    from course_lib.compression.quantize import dequantize
    from course_lib.engine.layers import Linear

    out = {}
    for name, lin in engine.model.linears():
        if isinstance(lin, WeightOnlyLinear) or not isinstance(lin, Linear):
            raise ValueError(f"layer {name!r} is already quantized: give the float engine")
        w = dequantize(quantize_chunked(lin.weight, INT8), lin.weight.dtype)
        out[name] = BlockRounded(Linear(w, lin.bias), block)
    return out


def dynamic_layers(engine, rows_per_scale: int | None = None, weight_only: tuple[str, ...] = ()) -> dict:
    """{name: int8-dyn layer} for every float layer of ``engine``, the LM head too (as ``vs_llamacpp``'s
    ``int8-dyn``): int8 symmetric per channel, round to nearest, ``path="dynamic"``; with
    ``rows_per_scale``, each call is cut into that many rows (``RowChunked``), one activation scale each.
    Layers whose name ends with one of ``weight_only`` (e.g. ``("down",)``, ``("lm_head",)``) keep the same
    int8 weights with float activations (the ``int8`` format): to find which layers the rounding hurts."""
    from course_lib.compression.decode_formats import INT8, quantize_chunked
    from course_lib.compression.linear import WeightOnlyLinear

    if rows_per_scale is not None and (
        isinstance(rows_per_scale, bool) or not isinstance(rows_per_scale, int) or rows_per_scale < 1
    ):
        raise ValueError(f"rows_per_scale must be None or an int >= 1, got {rows_per_scale!r}")
    kinds = ("qkv", "o", "gate_up", "down", "lm_head")
    if isinstance(weight_only, str) or any(k not in kinds for k in weight_only):
        raise ValueError(f"weight_only must be a tuple of layer kinds from {kinds}, got {weight_only!r}")
    out = {}
    for name, lin in engine.model.linears():
        if isinstance(lin, WeightOnlyLinear):
            raise ValueError(f"layer {name!r} is already quantized: give the float engine")
        qw = quantize_chunked(lin.weight, INT8)
        if name.rsplit(".", 1)[-1] in weight_only:
            out[name] = WeightOnlyLinear(qw, lin.bias, max_rows=ALL_ROWS)
            continue
        layer = WeightOnlyLinear(qw, lin.bias, path="dynamic", max_rows=ALL_ROWS)
        out[name] = layer if rows_per_scale is None else RowChunked(layer, rows_per_scale)
    return out


def per_tensor_int8_error(x: torch.Tensor) -> float:
    """Relative RMS error of rounding ``x`` to uint8 with one asymmetric scale (min..max), as fbgemm's dynamic
    linear does: ‖x − x̂‖ / ‖x‖."""
    if not isinstance(x, torch.Tensor) or x.numel() < 2 or not x.is_floating_point():
        raise ValueError("x must be a floating-point tensor with at least 2 elements")
    x = x.float()
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)  # the grid holds 0, as fbgemm's does
    scale = (hi - lo) / 255 or 1.0
    zero = round(-lo / scale)
    xq = (torch.clamp(torch.round(x / scale) + zero, 0, 255) - zero) * scale
    return float((x - xq).norm() / x.norm().clamp_min(1e-30))


@torch.no_grad()
def activation_outliers(engine, window) -> dict:
    """Per layer, on one held ``window``: {"outlier": max |x| ÷ RMS of its input, "at": the position (row) of
    that max, "err_window": the relative error of one int8 grid over the window's rows, "err_token": the
    mean over its first 64 rows of one grid per row}."""
    from course_lib.compression.requant import _dense_hidden

    seen: dict[str, torch.Tensor] = {}

    class Tap:
        def __init__(self, name, layer):
            self.name, self.layer = name, layer

        def forward(self, x):
            seen[self.name] = x.detach().reshape(-1, x.shape[-1]).float().clone()
            return self.layer.forward(x)

        __call__ = forward

    from course_lib.compression.requant import swap

    taps = {n: Tap(n, lin) for n, lin in engine.model.linears()}
    x = torch.as_tensor(window[None, :-1], device=engine.device)
    with swap(engine, taps):
        h = _dense_hidden(engine.model, x)
        engine.model.head(h[-1:])
    out = {}
    for n, a in seen.items():
        rows = [per_tensor_int8_error(r) for r in a[: min(len(a), 64)]]
        out[n] = {
            "outlier": float(a.abs().max() / a.pow(2).mean().sqrt()),
            "at": int(a.abs().amax(-1).argmax()),
            "err_window": per_tensor_int8_error(a),
            "err_token": float(sum(rows) / len(rows)),
        }
    return out


def measure(n_windows: int = 8, max_new_tokens: int = 48, threads: int | None = None) -> dict:
    """The comparison (see the module docstring) as a JSON-ready dict."""
    from course_lib.compression import requant
    from course_lib.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.measure.hardware import detect_device

    if threads:
        torch.set_num_threads(threads)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t0 = time.perf_counter()
    eng = Engine("smollm2-135m-instruct", config=SchedulerConfig(max_model_len=512, max_num_seqs=4), linear="reference")
    windows = requant.held_windows(eng, n_windows)
    ids = requant.chat_ids(eng.tokenizer)
    formats = {
        "int8 per-channel RTN": lambda e: requant.quantized_layers(e, requant.INT8),
        "int8-dyn, per token": lambda e: dynamic_layers(e, rows_per_scale=1),
        "int8-dyn, per window": lambda e: dynamic_layers(e, rows_per_scale=256),
        "int8-dyn/token, down w-only": lambda e: dynamic_layers(e, 1, weight_only=("down",)),
        "int8-dyn/token, head w-only": lambda e: dynamic_layers(e, 1, weight_only=("lm_head",)),
        "int8 acts per 32 (Q8_0)": lambda e: block_layers(e, 32),
    }
    rows = requant.compare_formats(eng, windows, ids, formats, max_new_tokens)
    by = {r["format"]: r for r in rows}
    z = {
        f: requant.paired_z(by[f]["losses"], by["int8 per-channel RTN"]["losses"])
        for f in formats
        if f != "int8 per-channel RTN"
    }
    layers = activation_outliers(eng, windows[0])
    return {
        "what": "SmolLM2-135M-Instruct, int8 per channel with int8 dynamic activations (fbgemm "
        "quantized.linear_dynamic, vs_llamacpp's int8-dyn) vs weight-only int8; reference = the dequantized Q4_1",
        "machine": detect_device().describe(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "load_average_before": load_before,
        "seconds": time.perf_counter() - t0,
        "command": "python -m course_lib.compression.int8_dyn_record " + " ".join(sys.argv[1:]),
        "held_text": f"course corpus validation split, {rows[0]['tokens']} tokens in windows of 256 "
        "(the held windows of smollm2-requant.json)",
        "chat": f"{len(ids)} chat prompts, greedy, up to {max_new_tokens} tokens",
        "rows": [{k: v for k, v in r.items() if k != "losses"} for r in rows],
        "paired_z_vs_int8": z,
        "layer_activations": layers,
    }


def load_record(path=None) -> dict:
    """The stored record, its fields checked (a missing one named)."""
    from course_lib.core.paths import data_dir

    path = Path(path) if path is not None else data_dir() / "measurements" / OUT
    d = json.loads(path.read_text())
    for k in ("machine", "command", "rows", "held_text"):
        if k not in d:
            raise ValueError(f"{path} has no {k!r}: re-run python -m course_lib.compression.int8_dyn_record")
    return d


def main(argv: list[str] | None = None) -> int:
    from course_lib.compression.requant import quality_table
    from course_lib.core.paths import data_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=8, help="held windows of 256 tokens to score")
    p.add_argument("--tokens", type=int, default=48, help="greedy chat tokens per answer")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=data_dir() / "measurements" / OUT)
    a = p.parse_args(argv)
    if a.windows < 1 or a.tokens < 1:
        p.error(f"--windows and --tokens must be >= 1, got {a.windows} and {a.tokens}")
    result = measure(a.windows, a.tokens, threads=a.threads)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out} ({result['seconds']:.0f} s)")
    print(quality_table(result["rows"]))
    print("paired z vs int8 weight-only:", {k: round(v, 1) for k, v in result["paired_z_vs_int8"].items()})
    worst = sorted(result["layer_activations"].items(), key=lambda kv: -kv[1]["outlier"])[:5]
    for n, v in worst:
        print(
            f"  {n:<18} max|x|/rms {v['outlier']:7.1f} at position {v['at']:<4} int8 error: one grid per window {v['err_window']:.2%}, "
            f"per token {v['err_token']:.2%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
