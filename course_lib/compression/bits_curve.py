"""Perplexity against bits per weight: round-to-nearest at 8, 6, 5, 4, 3 and 2 bits, in groups.

Two points (int8, int4) do not show where quality falls off. ``fake_quant`` rounds a float matrix to
``bits`` bits, asymmetric, one (scale, zero) per group of ``group_size`` inputs, and returns the float
values the integers stand for: the same grid as ``quantize`` at 8 and 4 bits (the test checks it), for any
bit width from 2 to 8, because only the bytes are stored differently. ``FakeQuantLinear`` rounds its
weight on the fly at each call (nothing but the plain weight is held, so one engine serves every width),
and ``bits_curve`` scores the engine (``requant.score``) with every decoder projection rounded at each
width; the LM head stays as given (the chapter keeps it int8 per channel, as in its other quality rows).
``bytes_per_weight`` is the storage one would ship: bits/8 plus a bf16 scale and zero per group.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.compression.quantize import bytes_per_weight
from course_lib.engine.layers import Linear

BITS = (8, 6, 5, 4, 3, 2)


def _check(bits, group_size) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int from 2 to 8, got {bits!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2, got {group_size!r}")


def fake_quant(w: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """``w`` (out, in) rounded to nearest on a ``bits``-bit asymmetric grid per group of ``group_size``
    inputs ([min, max] of each group onto 2^bits − 1 steps), returned as floats of ``w``'s dtype."""
    _check(bits, group_size)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D float (out, in) tensor, got {getattr(w, 'shape', type(w).__name__)}")
    out, inp = w.shape
    if inp % group_size:
        raise ValueError(f"group_size {group_size} does not divide the input dimension {inp}")
    x = w.float().reshape(out, inp // group_size, group_size)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = ((hi - lo) / (2**bits - 1)).clamp(min=1e-12)
    q = torch.round((x - lo) / scale).clamp_(0, 2**bits - 1)
    return (q * scale + lo).reshape(out, inp).to(w.dtype)


class FakeQuantLinear(Linear):
    """A float layer whose weight is rounded (``fake_quant``) at every call: the quality of ``bits`` bits
    without a kernel for them. Slow (it rounds per call) and exact."""

    def __init__(self, lin: Linear, bits: int, group_size: int) -> None:
        _check(bits, group_size)
        super().__init__(lin.weight, lin.bias)
        self.bits, self.group_size = bits, group_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, fake_quant(self.weight, self.bits, self.group_size).to(x.dtype), self.bias)


def bits_curve(engine, windows, bits=BITS, group_size: int = 64, head=None, batch: int = 2) -> list[dict]:
    """[{"bits", "bytes_per_weight", "perplexity", "loss"}] for ``engine`` scored on ``windows`` with every
    decoder projection rounded to each width in ``bits``; ``head`` (a layer) replaces the LM head for all
    of them if given; ``batch`` windows are scored per forward (each forward rounds every weight once).
    The engine's layers come back afterwards."""
    from course_lib.compression.requant import score, swap

    bits = list(bits)
    if not bits:
        raise ValueError("bits must list at least one width")
    for b in bits:
        _check(b, group_size)
    plain = {n: lin for n, lin in engine.model.linears() if n != "lm_head"}
    rows = []
    for b in bits:
        layers = {n: FakeQuantLinear(lin, b, group_size) for n, lin in plain.items()}
        if head is not None:
            layers["lm_head"] = head
        with swap(engine, layers):
            s = score(engine, windows, batch=batch)  # each batch rounds every weight once
        rows.append(
            {
                "bits": b,
                "bytes_per_weight": bytes_per_weight(b, group_size),  # a bf16 scale and zero per group
                "perplexity": s.perplexity,
                "loss": s.loss,
            }
        )
    return rows


__all__ = ["BITS", "FakeQuantLinear", "bits_curve", "bytes_per_weight", "fake_quant"]  # bytes_per_weight: quantize's
