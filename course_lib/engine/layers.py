"""The linear seam: every projection of the model is an object with ``forward(x)``.

A decode step is a chain of skinny matmuls ``(tokens, in) @ (in, out)``: each reads its whole weight
for a handful of rows, so it is bandwidth-bound and its speed is bytes of weight ÷ memory bandwidth.
The model never calls ``F.linear`` itself; it calls these objects. A weight-only int8/int4 layer
(chapter 03) or a column/row-parallel layer (chapter 07) replaces one with ``model.set_linear(name, new)``
without touching the model code. Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.kernels import cpu_gemv


class Linear:
    """``y = x Wᵀ + b`` with ``weight`` (out, in): the reference every other linear layer is tested against."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ValueError(
                f"weight must be a 2-D (out_features, in_features) tensor, got "
                f"{getattr(weight, 'shape', type(weight).__name__)}"
            )
        if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
        self.weight = weight  # (out, in)
        self.bias = bias  # (out,) or None

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes a forward must read from memory: the weight (and bias), whatever the batch."""
        b = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return self.weight.numel() * self.weight.element_size() + b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) → (..., out)."""
        return F.linear(x, self.weight, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)  # so that a subclass only overrides forward

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(in={self.in_features}, out={self.out_features}, "
            f"bias={self.bias is not None}, dtype={self.weight.dtype})"
        )

    @classmethod
    def fuse(cls, *linears: torch.nn.Linear) -> "Linear":
        """One layer for several ``nn.Linear`` that read the same input (q/k/v, gate/up): their weights
        stacked along ``out``, one matmul instead of several. The modules' parameters become views of the
        stacked tensor, so the HF model keeps working and no memory is duplicated."""
        if not linears:
            raise ValueError("fuse needs at least one torch.nn.Linear")
        if len(linears) == 1:  # nothing to stack: share the tensors as they are
            lin = linears[0]
            return cls(lin.weight.data, None if lin.bias is None else lin.bias.data)
        weight = torch.cat([lin.weight.data for lin in linears], dim=0)  # (sum out, in)
        has_bias = [lin.bias is not None for lin in linears]
        bias = torch.cat([lin.bias.data for lin in linears], dim=0) if all(has_bias) else None
        start = 0
        for lin in linears:
            rows = lin.weight.shape[0]
            lin.weight.data = weight[start : start + rows]  # shared storage
            if bias is not None:
                lin.bias.data = bias[start : start + rows]
            start += rows
        return cls(weight, bias)


class SkinnyLinear(Linear):
    """The same ``y = x Wᵀ + b``, routed by shape to the kernel that streams W fastest on a CPU.

    A decode step multiplies each weight by a handful of rows: a GEMV-like product whose speed is how
    fast W comes from memory. Measured on a 2-core AVX-512 CPU with a 314 MB fp32 model, torch's default
    (MKL) path streams W at ~13 GB/s at 1 row and 7-10 GB/s at 2-8 rows; oneDNN with the weight packed
    once into its blocked layout streams it at 20-30 GB/s there, and at 12-17 GB/s on a 2-core AVX2 VM,
    where the course's own kernel (``kernels.cpu_gemv``, plain layout) reads it at 15-17 GB/s.
    (OpenBLAS sgemv through numpy is as fast alone, but its thread pool fights torch's for the two cores
    inside a real step.) So:
    - 1..``gemv_rows`` rows (``cpu_gemv.MAX_ROWS``; 0 turns it off), where the kernels are built: the
      course's GEMV (``gemv_f32``) on the plain weight, no second copy;
    - up to ``max_packed_rows`` rows, W ≥ ``min_bytes``: oneDNN ``_linear_pointwise`` on a weight packed on
      first use (a private torch op, as inductor uses it: if it is missing or fails, this layer switches
      itself off and uses F.linear);
    - anything else (a prefill, a small W, not fp32 on a CPU): ``F.linear``, the reference.
    Results agree with ``F.linear`` to fp32 rounding (~1e-6 relative), not bit for bit. The packed copy,
    made only when a 5..16-row product comes, doubles this layer's weight memory.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        min_bytes: int = 1 << 16,
        max_packed_rows: int = 16,
        gemv_rows: int | None = None,
    ) -> None:
        super().__init__(weight, bias)
        if gemv_rows is None:
            gemv_rows = cpu_gemv.MAX_ROWS
        if not isinstance(gemv_rows, int) or not 0 <= gemv_rows <= cpu_gemv.MAX_ROWS:
            raise ValueError(f"gemv_rows must be an int in 0..{cpu_gemv.MAX_ROWS}, got {gemv_rows!r}")
        self.enabled = (
            weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and weight.numel() * 4 >= min_bytes
            and torch.backends.mkldnn.is_available()
        )
        self.max_packed_rows = max_packed_rows
        self._packed = None  # oneDNN's blocked copy of W, made on the first 5..16-row call
        plain = weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.is_contiguous()
        self.gemv_rows = gemv_rows if gemv_rows and plain and cpu_gemv.available() else 0

    @classmethod
    def from_linear(cls, lin: Linear, **kwargs) -> "SkinnyLinear":
        return cls(lin.weight, lin.bias, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] <= self.gemv_rows and x.dtype == torch.float32 and x.device.type == "cpu":
            y = cpu_gemv.run_f32(x.contiguous(), self.weight, torch.get_num_threads())
            return y if self.bias is None else y.add_(self.bias)
        if self.enabled and x.dim() == 2 and x.shape[0] <= self.max_packed_rows and x.dtype == torch.float32:
            try:
                if self._packed is None:
                    self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, self.max_packed_rows)
                y = torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, None, "none", [], "")
                return y if self.bias is None else y.add_(self.bias)
            except (AttributeError, RuntimeError):  # a torch without these private ops: the reference from now on
                self.enabled, self._packed = False, None
        return F.linear(x, self.weight, self.bias)


_BF16_PACKING: list = []


def bf16_packing_supported() -> bool:
    """Whether oneDNN packs bf16 weights on this CPU: it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT (an AVX2-only
    CPU, e.g. a Zen 3 VM, refuses: "bf16 path needs the cpu support ..."). Tried once on a tiny weight."""
    if not _BF16_PACKING:
        try:
            _pack(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
            _BF16_PACKING.append(True)
        except (RuntimeError, AttributeError):
            _BF16_PACKING.append(False)
    return _BF16_PACKING[0]


def _pack(weight: torch.Tensor, rows_hint: int) -> torch.Tensor:
    """oneDNN's blocked copy of ``weight`` (out, in), tuned for ``rows_hint`` rows (a private torch op)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)


class PackedLinear(Linear):
    """``SkinnyLinear`` without the plain copy: the weight lives only in oneDNN's blocked layout, and every
    shape (a decode step's few rows or a prefill's thousands) runs through the packed kernel. Half the memory
    of ``SkinnyLinear``, whose plain weight stays for prefill and for the HF model that shares it; the price
    is that the plain weight is gone (``weight`` is a meta tensor: its shape and dtype only). ``unpacked()``
    rebuilds it exactly, as ``I · Wᵀ`` (a product with the identity adds only zeros). ``Engine(...,
    linear="packed")`` uses it for a real model on a small-memory machine (Binder's 1-2 GB). fp32 or bf16
    weights (bf16 on a CPU with AVX-512 BF16 runs oneDNN's bf16 kernel; chapter 03 times it); the input is
    cast to the weight's dtype and the output back to the input's."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, rows_hint: int = 16) -> None:
        super().__init__(weight, bias)
        if not self.available(weight):
            raise ValueError(
                f"PackedLinear needs an fp32 or bf16 weight on a CPU with oneDNN (torch.backends.mkldnn); got "
                f"{weight.dtype} on {weight.device}"
            )
        self._packed = _pack(weight.detach().contiguous(), rows_hint)
        self.weight = torch.empty(weight.shape, dtype=weight.dtype, device="meta")  # shape and dtype only

    @staticmethod
    def available(weight: torch.Tensor) -> bool:
        return (
            weight.device.type == "cpu"
            and weight.dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available()
            and (weight.dtype != torch.bfloat16 or bf16_packing_supported())
        )

    @classmethod
    def from_linear(cls, lin: Linear, **kwargs) -> "PackedLinear":
        return cls(lin.weight, lin.bias, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, self.weight.dtype
        x2 = x.reshape(-1, shape[-1]).to(dtype).contiguous()  # (rows, in)
        y = torch.ops.mkldnn._linear_pointwise(x2, self._packed, None, "none", [], "")
        if self.bias is not None:
            y.add_(self.bias.to(dtype))
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def unpacked(self) -> torch.Tensor:
        """The plain (out, in) weight again, bit for bit."""
        eye = torch.eye(self.in_features, dtype=self.weight.dtype)
        return torch.ops.mkldnn._linear_pointwise(eye, self._packed, None, "none", [], "").t().contiguous()
