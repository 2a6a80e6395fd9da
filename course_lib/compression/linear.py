"""Weight-only quantized linear layers for the engine's linear seam: int8/int4 weights, float activations.

``WeightOnlyLinear`` has the ``forward(x)`` of ``engine.layers.Linear`` and three paths, each tested
against the first:
- ``reference``: dequantize the weight to float and call ``F.linear`` (gpt-fast's
  ``WeightOnlyInt8Linear.forward`` in spirit). Correct, not fast: it rebuilds the float weight per call.
- ``cpu``: PyTorch's packed CPU kernels, the ones gpt-fast uses on a CPU:
  ``aten._weight_int8pack_mm`` (int8, symmetric per channel) and ``aten._weight_int4pack_mm_for_cpu``
  (int4 in groups, the (u − 8)·scale + zero format). Their fast path takes bf16 activations, so the
  layer rounds x to bf16 and returns x's dtype; results agree with the reference to bf16 precision.
- ``dynamic`` (opt-in, int8 per channel on an x86 CPU; ``auto`` never picks it): fbgemm's
  ``quantized.linear_dynamic``, which also rounds each call's activations to 8 bits (7 on a CPU without
  VNNI, ``dynamic_reduce_range``) and multiplies
  integers (VNNI). It reads the same int8 bytes faster than ``cpu`` on this course's CPU
  (``compression.gemv_roof`` times both) at the price of int8 activations (its error is measured there).
- ``gemv`` (what ``auto`` picks on a CPU where ``kernels.cpu_gemv`` is built): the course's hand-written
  CPU kernels, int8 per channel or int4 in groups of 32·j inputs, with the activations kept in fp32 (no
  bf16 rounding) at one row (``GEMV_ROWS``, measured); more rows take the ``cpu`` path where it applies,
  else these kernels up to 4 rows, else the reference.
- ``triton``: the course's kernels (``course_lib.kernels.quant_matmul``: ``int8``, ``int4``), which
  dequantize in registers on a GPU (and run, slowly, in the Triton interpreter for tests).
A decode step reads the integers and scales instead of fp32 weights: ~4× fewer bytes for int8 and ~8×
for int4, which is the whole speed-up of a bandwidth-bound step. Prefill-shaped inputs (more than
``max_rows`` rows) take the reference path: they are compute-bound and gain nothing from fewer bytes.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import functools
import platform

import torch
import torch.nn.functional as F

from course_lib.compression.quantize import QuantConfig, QuantizedWeight, dequantize, quantize, unpack_int4
from course_lib.engine.layers import Linear
from course_lib.kernels import cpu_gemv

PATHS = ("auto", "reference", "cpu", "gemv", "gemv-q8", "triton", "dynamic")
# Rows the gemv path sends to the course's kernels when torch's packed kernel also takes the format: the
# kernels widen every weight to fp32 once per row, so on a 2-core AVX2 VM (gemv_roof, 4096 x 4096) int8
# read 9.7 GB/s at 1 row but 7.6 and 4.2 at 2 and 4, where torch's bf16 kernel read 10.3 and 6.2.
GEMV_ROWS = 1
CPU_INT4_GROUPS = (32, 64, 128, 256)


def cpu_supports(qw: QuantizedWeight) -> bool:
    """Whether PyTorch's packed CPU kernels take this format and shape."""
    c = qw.config
    if c.bits == 8:
        return c.symmetric and c.granularity == "channel" and hasattr(torch.ops.aten, "_weight_int8pack_mm")
    return (
        c.granularity == "group"
        and c.group_size in CPU_INT4_GROUPS
        and qw.shape[0] % 16 == 0  # the packing kernel wants N divisible by 16
        and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
    )


@functools.lru_cache(maxsize=1)
def dynamic_reduce_range() -> bool:
    """Whether fbgemm's dynamic linear must round activations to 7 bits, not 8: without VNNI (an AVX2
    CPU) it sums pairs of u8·s8 products in int16 (``vpmaddubsw``), which saturates at 8 bits; measured on
    a 2-core AVX2 VM, a (32, 64) product was off by up to 21% of max |y| at 8 bits, ~1% at 7. With VNNI
    (``avx512_vnni``/``avx_vnni``) the sums are int32 and the full 8 bits are kept. (PyTorch's default
    fbgemm qconfig sets ``reduce_range=True`` everywhere for this reason.)"""
    from course_lib.measure.hardware.cpu_probe import _cpu_flags, _cpuinfo

    flags = _cpu_flags(_cpuinfo())
    return not ({"avx512_vnni", "avx_vnni"} & flags) and platform.machine() in ("x86_64", "AMD64")


def dynamic_supports(qw: QuantizedWeight) -> bool:
    """Whether fbgemm's dynamic int8 linear takes this weight: int8 symmetric per channel, on a CPU."""
    c = qw.config
    return (
        c.bits == 8
        and c.symmetric
        and c.granularity == "channel"
        and qw.data.device.type == "cpu"
        and "fbgemm" in torch.backends.quantized.supported_engines
    )


def gemv_supports(qw: QuantizedWeight) -> bool:
    """Whether the course's CPU kernels (``kernels.cpu_gemv``) take this format: int8 symmetric per channel,
    or int4 in groups of a multiple of 32 inputs, on a CPU where they are built."""
    c = qw.config
    if qw.data.device.type != "cpu":
        return False
    if c.bits == 8:
        ok = c.symmetric and c.granularity == "channel"
    else:
        ok = c.granularity == "group" and qw.group_size % cpu_gemv.INT4_GROUP_MULTIPLE == 0
    return ok and cpu_gemv.available()


def gemv_q8_supports(qw: QuantizedWeight) -> bool:
    """Whether ``path="gemv-q8"`` takes this weight: int4 in groups of a multiple of 32 with in-features a
    multiple of 64, on a CPU where ``kernels.cpu_gemv`` is built (its ``gemv_int4_q8``: activations rounded
    to int8 per block of 32, llama.cpp's trade; never chosen by ``auto``)."""
    return qw.config.bits == 4 and qw.shape[1] % 64 == 0 and gemv_supports(qw)


def triton_supports(qw: QuantizedWeight) -> bool:
    """Whether the course's Triton kernels take this format: int8 per channel, int4 in groups."""
    c = qw.config
    return (c.bits == 8 and c.granularity == "channel" and c.symmetric) or (c.bits == 4 and c.granularity == "group")


class WeightOnlyLinear(Linear):
    """``y = x · dequant(W)ᵀ + b`` with W stored as a ``QuantizedWeight``."""

    def __init__(
        self, qw: QuantizedWeight, bias: torch.Tensor | None = None, path: str = "auto", max_rows: int = 16
    ) -> None:
        if not isinstance(qw, QuantizedWeight):
            raise ValueError(f"qw must be a QuantizedWeight (see compression.quantize), got {type(qw).__name__}")
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        if bias is not None and (bias.dim() != 1 or bias.shape[0] != qw.shape[0]):
            raise ValueError(f"bias must have shape ({qw.shape[0]},), got {tuple(bias.shape)}")
        self.qw = qw
        self.bias = bias
        self.max_rows = max_rows
        self.path = self._choose(path)
        self._prepared = None  # the chosen kernel's layout, made on first use
        self._gemv = None  # the gemv path's layout, made on first use
        self._reduce_range = self.path == "dynamic" and dynamic_reduce_range()  # 7-bit activations without VNNI

    # Linear's interface reads .weight: expose the dequantized view lazily for tools that want it
    @property
    def weight(self) -> torch.Tensor:
        """The float matrix the integers stand for (computed on each access: use for inspection only)."""
        return dequantize(self.qw)

    @property
    def in_features(self) -> int:
        return self.qw.shape[1]

    @property
    def out_features(self) -> int:
        return self.qw.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes a decode-shaped forward reads: the integers, scales and zero points (and bias)."""
        b = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return self.qw.nbytes + b

    def _choose(self, path: str) -> str:
        dev = self.qw.data.device.type
        if path == "cpu" and not cpu_supports(self.qw):
            raise ValueError(
                f"path='cpu' needs int8 symmetric per-channel or int4 groups of {CPU_INT4_GROUPS} with out "
                f"divisible by 16; got {self.qw.config.name} for a {self.qw.shape} weight"
            )
        if path == "triton" and not triton_supports(self.qw):
            raise ValueError(
                f"path='triton' needs int8 per-channel symmetric or int4 groups, got {self.qw.config.name}"
            )
        if path == "gemv" and not gemv_supports(self.qw):
            raise ValueError(
                f"path='gemv' needs int8 symmetric per-channel or int4 groups of a multiple of 32 on a CPU where "
                f"kernels.cpu_gemv is built ({cpu_gemv.unavailable_reason() or 'it is'}); got {self.qw.config.name}"
            )
        if path == "gemv-q8" and not gemv_q8_supports(self.qw):
            raise ValueError(
                "path='gemv-q8' needs int4 groups of a multiple of 32, in-features a multiple of 64 and "
                f"kernels.cpu_gemv built; got {self.qw.config.name} for a {tuple(self.qw.shape)} weight"
            )
        if path == "dynamic" and not dynamic_supports(self.qw):
            raise ValueError(
                f"path='dynamic' needs int8 symmetric per-channel weights on a CPU with torch's fbgemm engine; "
                f"got {self.qw.config.name} on {self.qw.data.device.type}"
            )
        if path != "auto":
            return path
        if dev == "cuda" and triton_supports(self.qw):
            return "triton"
        if dev == "cpu" and gemv_supports(self.qw):
            return "gemv"
        if dev == "cpu" and cpu_supports(self.qw):
            return "cpu"
        return "reference"

    @classmethod
    def from_linear(cls, lin: Linear, config: QuantConfig, path: str = "auto", qw: QuantizedWeight | None = None):
        """Quantize an engine ``Linear`` (round to nearest unless ``qw`` is given, e.g. by GPTQ)."""
        if isinstance(lin, WeightOnlyLinear):
            raise ValueError("this layer is already quantized; quantize the original float layer instead")
        qw = quantize(lin.weight, config) if qw is None else qw
        return cls(qw, lin.bias, path=path)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantize, then the float matmul: what every other path must match."""
        return F.linear(x, dequantize(self.qw, x.dtype), self.bias)

    def _prepare_cpu(self) -> tuple:
        qw = self.qw
        if qw.config.bits == 8:
            return ("int8", qw.data.contiguous(), qw.scale[:, 0].to(torch.bfloat16).contiguous())
        u = unpack_int4(qw.data).to(torch.int32)  # (N, K) values in [0, 15]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u.contiguous(), 1)
        sz = torch.stack([qw.scale, qw.zero], dim=2).transpose(0, 1).contiguous()  # (K/g, N, 2)
        return ("int4", packed, sz.to(torch.bfloat16))

    def _prepare_gemv(self):
        qw = self.qw
        if qw.config.bits == 8:
            return qw.data.contiguous(), qw.scale[:, 0].float().contiguous()
        return cpu_gemv.int4_layout(qw.data, qw.scale, qw.zero, qw.group_size)

    def gemv_operands(self) -> tuple | None:
        """What a caller of the course's kernels needs (``engine.native_step``, which cannot import this
        module: the layout's arrows go down): ``("int8", q, scale)``, ``("int4", Int4Layout)`` or
        ``("int4-q8", Int4Layout)`` on the ``gemv``/``gemv-q8`` paths, else None."""
        if self.path not in ("gemv", "gemv-q8"):
            return None
        if self._gemv is None:
            self._gemv = self._prepare_gemv()
        if self.qw.config.bits == 8:
            return ("int8", *self._gemv)
        return ("int4-q8" if self.path == "gemv-q8" else "int4", self._gemv)

    def _forward_gemv(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 (rows <= cpu_gemv.MAX_ROWS, in) → (rows, out) fp32, on the course's kernels."""
        if self._gemv is None:
            self._gemv = self._prepare_gemv()
        x2 = x2.float().contiguous()
        if self.qw.config.bits == 8:
            q, scale = self._gemv
            return cpu_gemv.run_int8(x2, q, scale, torch.get_num_threads())
        if self.path == "gemv-q8":
            return cpu_gemv.run_int4_q8(x2, self._gemv, torch.get_num_threads())
        return cpu_gemv.run_int4(x2, self._gemv, torch.get_num_threads())

    def _prepare_dynamic(self):
        import warnings

        qw = self.qw
        scale = qw.scale[:, 0].double()
        with warnings.catch_warnings():  # torch 2.13 marks quantized tensors deprecated
            warnings.simplefilter("ignore")
            q = torch._make_per_channel_quantized_tensor(qw.data, scale, torch.zeros_like(scale, dtype=torch.long), 0)
            prev, torch.backends.quantized.engine = torch.backends.quantized.engine, "fbgemm"
            try:
                return torch.ops.quantized.linear_prepack(q, None)
            finally:
                torch.backends.quantized.engine = prev

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.path in ("gemv", "gemv-q8") and x.dim() == 2 and x.shape[0] <= GEMV_ROWS and x.dtype == torch.float32:
            y = self._forward_gemv(x)  # a decode step's few rows: the shortest way to the kernel
            return y if self.bias is None else y.add_(self.bias)
        rows = x.numel() // max(x.shape[-1], 1)
        if self.path == "reference" or rows > self.max_rows or (self.path == "dynamic" and x.dtype != torch.float32):
            return self.reference(x)
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        path = self.path
        if path in ("gemv", "gemv-q8") and rows > GEMV_ROWS:  # more: torch's packed kernel, or ours to MAX_ROWS
            if cpu_supports(self.qw):
                path = "cpu"
            elif rows > cpu_gemv.MAX_ROWS:
                return self.reference(x)
        if path in ("gemv", "gemv-q8"):
            y = self._forward_gemv(x2).to(x.dtype)
        elif path == "dynamic":
            if self._prepared is None:
                self._prepared = self._prepare_dynamic()
            y = torch.ops.quantized.linear_dynamic(x2.contiguous(), self._prepared, self._reduce_range)
        elif path == "cpu":
            if self._prepared is None:
                self._prepared = self._prepare_cpu()
            kind, data, params = self._prepared
            xb = x2.to(torch.bfloat16)
            if kind == "int8":
                y = torch.ops.aten._weight_int8pack_mm(xb, data, params)
            else:
                y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, data, self.qw.group_size, params)
            y = y.to(x.dtype)
        else:
            from course_lib.kernels.quant_matmul.int4 import int4_matmul
            from course_lib.kernels.quant_matmul.int8 import int8_matmul

            c = self.qw.config
            if c.bits == 8:
                y = int8_matmul(x2.contiguous(), self.qw.data, self.qw.scale[:, 0].contiguous(), path="triton")
            else:
                y = int4_matmul(
                    x2.contiguous(),
                    self.qw.data,
                    self.qw.scale.contiguous(),
                    self.qw.zero.contiguous(),
                    self.qw.group_size,
                    path="triton",
                )
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def __repr__(self) -> str:
        return (
            f"WeightOnlyLinear({self.qw.config.name}, in={self.in_features}, out={self.out_features}, path={self.path})"
        )


def timing_copy(layer):
    """A copy of ``layer`` with its own storage for exactly what its forward reads (the chosen kernel's
    layout of a quantized layer, the packed copy of a ``PackedLinear``, the weight of a float one) and
    nothing else, so that timing many copies in turn reads their bytes from memory, not from the cache."""
    import copy

    from course_lib.engine.layers import PackedLinear

    c = copy.copy(layer)
    if isinstance(layer, WeightOnlyLinear) and layer.path == "dynamic":
        c._prepared = layer._prepare_dynamic()  # fbgemm's own packed copy
    elif isinstance(layer, WeightOnlyLinear) and layer.path in ("gemv", "gemv-q8"):
        g = layer._gemv if layer._gemv is not None else layer._prepare_gemv()
        if isinstance(g, tuple):
            c._gemv = tuple(t.clone() for t in g)
        else:
            c._gemv = cpu_gemv.Int4Layout(g.packed.clone(), g.s.clone(), g.c.clone(), g.group_size)
        if layer._prepared is not None:  # its rows beyond GEMV_ROWS ran torch's kernel: that layout too
            c._prepared = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in layer._prepared)
    elif isinstance(layer, WeightOnlyLinear) and layer._prepared is not None:
        c._prepared = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in layer._prepared)
    elif isinstance(layer, PackedLinear):
        c._packed = layer._packed.clone()
    else:
        c.weight = layer.weight.clone()
    return c


def layer_bytes(lin) -> int:
    """Bytes one decode-shaped forward of ``lin`` reads, as its kernel stores them."""
    if isinstance(lin, WeightOnlyLinear) and lin.path in ("gemv", "gemv-q8"):
        n, k = lin.qw.shape
        if lin.qw.config.bits == 8:
            return n * k + n * 4  # int8 + one fp32 scale per row
        return n * k // 2 + (k // lin.qw.group_size) * n * 2 * 2  # nibbles + an fp16 (s, c) per group
    if isinstance(lin, WeightOnlyLinear) and lin.path == "cpu":
        n, k = lin.qw.shape
        if lin.qw.config.bits == 8:
            return n * k + n * 2  # int8 + one bf16 scale per row
        return n * k // 2 + (k // lin.qw.group_size) * n * 2 * 2  # nibbles + a bf16 (scale, zero) per group
    return int(lin.nbytes)


__all__ = [
    "PATHS",
    "WeightOnlyLinear",
    "cpu_supports",
    "gemv_q8_supports",
    "dynamic_reduce_range",
    "dynamic_supports",
    "gemv_supports",
    "layer_bytes",
    "timing_copy",
    "triton_supports",
]
