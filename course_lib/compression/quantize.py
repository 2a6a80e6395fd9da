"""Weight quantization formats and round-to-nearest (RTN): what int8/int4 weights are, and what they cost.

A decode step is bandwidth-bound (chapter 01): its time is the bytes of weight it streams. Storing a
weight in 8 or 4 bits instead of 32 or 16 divides those bytes, at the price of a rounding error.
``quantize(w, QuantConfig(...))`` maps a float matrix (out, in) to integers and a scale (and, when
asymmetric, a zero point) per tensor, per output channel or per group of ``group_size`` inputs;
``dequantize`` maps back. Round-to-nearest puts every value within half a step (scale / 2) of the
original, the bound ``max_error`` returns and the tests check.

Storage: int8 values one per byte; int4 values two per byte (low nibble = even input index). An int4
value u ∈ [0, 15] means (u − 8)·scale + zero (the gpt-fast / tinygemm convention that the packed CPU
kernels and the course's Triton kernel read); an int8 value q ∈ [−128, 127] means q·scale + zero.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.kernels.quant_matmul.int4 import pack_int4, unpack_int4  # the storage the kernels read

BITS = (8, 4)
GRANULARITIES = ("tensor", "channel", "group")


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize a weight matrix: ``bits`` 8 or 4; ``symmetric`` (zero point 0) or not;
    scale per ``tensor``, per output ``channel`` or per ``group`` of ``group_size`` inputs."""

    bits: int = 8
    symmetric: bool = True
    granularity: str = "channel"
    group_size: int = 128

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"QuantConfig.bits must be one of {BITS}, got {self.bits!r}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"QuantConfig.granularity must be one of {GRANULARITIES}, got {self.granularity!r}")
        if not isinstance(self.symmetric, bool):
            raise ValueError(f"QuantConfig.symmetric must be a bool, got {self.symmetric!r}")
        if not isinstance(self.group_size, int) or isinstance(self.group_size, bool) or self.group_size < 2:
            raise ValueError(f"QuantConfig.group_size must be an int >= 2, got {self.group_size!r}")
        if self.granularity == "group" and self.group_size % 2:
            raise ValueError(f"QuantConfig.group_size must be even, got {self.group_size}")

    @property
    def name(self) -> str:
        g = {"tensor": "per-tensor", "channel": "per-channel", "group": f"g{self.group_size}"}[self.granularity]
        return f"int{self.bits} {'sym' if self.symmetric else 'asym'} {g}"

    @property
    def qmin(self) -> int:
        return -(2 ** (self.bits - 1))  # -128 or -8 (stored as u = q + 8 for int4)

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1  # 127 or 7

    def groups(self, in_features: int) -> int:
        """Scales per output row."""
        return {"tensor": 1, "channel": 1, "group": in_features // self.group_size}[self.granularity]


@dataclass
class QuantizedWeight:
    """A quantized (out, in) matrix. ``data``: int8 (out, in) for 8 bits, uint8 (out, in/2) packed for
    4 bits. ``scale``/``zero``: fp32 (out, groups) (one column for per-tensor/per-channel; per-tensor
    repeats one value). Dequantized: (q − offset)·scale + zero per group, offset 8 for int4 (its u ∈ [0, 15])."""

    data: torch.Tensor
    scale: torch.Tensor  # (out, groups) fp32
    zero: torch.Tensor  # (out, groups) fp32 (zeros when symmetric)
    config: QuantConfig
    shape: tuple[int, int]  # (out, in)

    @property
    def group_size(self) -> int:
        """Inputs that share one scale."""
        return self.shape[1] // self.scale.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes actually stored: the integers plus every scale and zero point (fp32 here)."""
        n = 1 if self.config.granularity == "tensor" else self.scale.numel()  # per-tensor: one value, repeated here
        params = 1 if self.config.symmetric else 2
        return self.data.numel() * self.data.element_size() + params * n * self.scale.element_size()

    def int_values(self) -> torch.Tensor:
        """The signed integer grid values q (out, in) as int8 (int4 unpacked: u − 8)."""
        if self.config.bits == 8:
            return self.data
        return unpack_int4(self.data).to(torch.int8) - 8


def expected_nbytes(shape: tuple[int, int], config: QuantConfig, scale_bytes: int = 4) -> int:
    """The formula: out·in·bits/8 for the integers, plus (1 or 2)·scale_bytes per scale group."""
    out, inp = shape
    n_scales = 1 if config.granularity == "tensor" else out * config.groups(inp)
    params = 1 if config.symmetric else 2  # a scale, and a zero point when asymmetric
    return out * inp * config.bits // 8 + params * scale_bytes * n_scales


def bytes_per_weight(bits: int, group_size: int, scale_bytes: float = 2.0, zero_bytes: float = 2.0) -> float:
    """Stored bytes per weight of a grouped format: bits/8 for the integer, plus one scale of ``scale_bytes``
    and one zero of ``zero_bytes`` shared by ``group_size`` weights (``QuantizedWeight.nbytes`` keeps fp32:
    4 and 4; the CPU int4 kernel reads bf16: 2 and 2; GPTQ/AWQ checkpoints store an fp16 scale and a
    4-bit integer zero point: 2 and 0.5; llama.cpp's Q4_1 an fp16 scale and minimum per 32: 2 and 2)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 32:
        raise ValueError(f"bits must be an int from 1 to 32, got {bits!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if scale_bytes < 0 or zero_bytes < 0:
        raise ValueError(f"scale_bytes and zero_bytes must be >= 0, got {scale_bytes!r}, {zero_bytes!r}")
    return bits / 8 + (scale_bytes + zero_bytes) / group_size


def check_weight(w: torch.Tensor, config: QuantConfig, name: str = "w") -> None:
    """Raise a ValueError naming ``name`` unless ``w`` is a float (out, in) matrix that ``config`` can take."""
    if isinstance(w, QuantizedWeight):
        raise ValueError(f"{name} is already quantized (a QuantizedWeight); dequantize it first or keep it as it is")
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(
            f"{name} must be a 2-D floating-point (out, in) tensor, got {getattr(w, 'dtype', type(w).__name__)} "
            f"{tuple(getattr(w, 'shape', ()))}"
        )
    inp = w.shape[1]
    if config.granularity == "group" and inp % config.group_size:
        raise ValueError(
            f"{name}: group_size {config.group_size} does not divide the input dimension {inp} of {tuple(w.shape)}"
        )
    if config.bits == 4 and inp % 2:
        raise ValueError(f"{name}: int4 packs two values per byte, so the input dimension must be even, got {inp}")


def qparams(w: torch.Tensor, config: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero (out, groups) fp32 for round-to-nearest over each group's [min, max] range."""
    check_weight(w, config)
    out, inp = w.shape
    g = {"tensor": inp, "channel": inp, "group": config.group_size}[config.granularity]
    # detach: a weight that requires grad (a tied LM head is the embedding's Parameter) would otherwise
    # record every temporary here in an autograd graph that the scales keep alive (~4× the chunk's bytes)
    x = w.detach().float().reshape(out, inp // g, g)  # (out, groups, g)
    if config.granularity == "tensor":
        x = x.reshape(1, 1, -1)
    levels = 2**config.bits - 1
    if config.symmetric:
        absmax = x.abs().amax(dim=-1)
        scale = (absmax / config.qmax).clamp(min=1e-12)
        zero = torch.zeros_like(scale)
    else:
        lo, hi = x.amin(dim=-1), x.amax(dim=-1)
        scale = ((hi - lo) / levels).clamp(min=1e-12)
        zero = lo - scale * config.qmin  # value of the grid's middle point: q = qmin maps to lo
    if config.granularity == "tensor":
        scale, zero = scale.expand(out, 1).contiguous(), zero.expand(out, 1).contiguous()
    return scale, zero


def quantize_with(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, config: QuantConfig) -> QuantizedWeight:
    """Round ``w`` to the grid given by ``scale``/``zero`` (out, groups): q = clamp(round((w − zero)/scale))."""
    check_weight(w, config)
    out, inp = w.shape
    groups = scale.shape[1]
    x = w.detach().float().reshape(out, groups, inp // groups)  # detach: see qparams
    q = torch.round((x - zero[..., None]) / scale[..., None]).clamp_(config.qmin, config.qmax).reshape(out, inp)
    if config.bits == 8:
        data = q.to(torch.int8)
    else:
        data = pack_int4((q + 8).to(torch.uint8))
    return QuantizedWeight(data, scale.float().contiguous(), zero.float().contiguous(), config, (out, inp))


def quantize(w: torch.Tensor, config: QuantConfig | None = None) -> QuantizedWeight:
    """Round-to-nearest quantization of a float (out, in) matrix."""
    config = config or QuantConfig()
    scale, zero = qparams(w, config)
    return quantize_with(w, scale, zero, config)


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float matrix the integers stand for: q·scale + zero, group by group. (out, in)."""
    if not isinstance(qw, QuantizedWeight):
        raise ValueError(f"qw must be a QuantizedWeight, got {type(qw).__name__}")
    out, inp = qw.shape
    groups = qw.scale.shape[1]
    q = qw.int_values().float().reshape(out, groups, inp // groups)
    w = q * qw.scale[..., None] + qw.zero[..., None]
    return w.reshape(out, inp).to(dtype)


def max_error(qw: QuantizedWeight) -> torch.Tensor:
    """Round-to-nearest's bound per group: half a step, scale / 2 (values inside the clamp range)."""
    return qw.scale / 2


def fp8_roundtrip(w: torch.Tensor) -> torch.Tensor | None:
    """``w`` stored as fp8 e4m3 with a per-channel scale, then read back in fp32 — or None where this torch
    has no float8 dtype. Storage works on any device; fast fp8 *matmuls* need an Hopper/Ada GPU."""
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is None:
        return None
    scale = (w.float().abs().amax(dim=1, keepdim=True) / torch.finfo(f8).max).clamp(min=1e-12)  # (out, 1)
    return (w.float() / scale).to(f8).float() * scale


__all__ = [
    "QuantConfig",
    "QuantizedWeight",
    "check_weight",
    "dequantize",
    "bytes_per_weight",
    "expected_nbytes",
    "fp8_roundtrip",
    "max_error",
    "pack_int4",
    "qparams",
    "quantize",
    "quantize_with",
    "unpack_int4",
]
