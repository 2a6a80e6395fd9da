"""2:4 semi-structured sparsity: in every group of 4 consecutive input weights keep the 2 largest.

NVIDIA GPUs from Ampere (compute capability 8.0) on have sparse tensor cores that skip the zeros for
fp16/bf16: only the kept half of the values (plus 2 bits of metadata each) is read and multiplied, at
most 2× fewer bytes for a bandwidth-bound decode step and 2× fewer multiply-adds for a compute-bound
prefill. Everywhere else it is a mask on a dense matrix: the quality of 2:4, none of the speed.
``apply_two_four`` takes whichever path this machine has and says which in its report.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from course_lib.compression.prune.magnitude import apply_masks, sparsity_of
from course_lib.compression.prune.targets import prunable
from course_lib.engine.layers import Linear

SPARSE_KERNEL_CHOICES = ("auto", True, False)


def two_four_mask(weight: torch.Tensor) -> torch.Tensor:
    """Keep-mask (out, in) with, in every group of 4 consecutive input weights of a row, the 2 largest |w|."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(
            f"weight must be a 2-D (out, in) tensor, got {getattr(weight, 'shape', type(weight).__name__)}"
        )
    out_f, in_f = weight.shape
    if in_f % 4:
        raise ValueError(
            f"2:4 sparsity needs in_features divisible by 4; weight of shape {tuple(weight.shape)} has {in_f}"
        )
    groups = weight.detach().abs().reshape(out_f, in_f // 4, 4)
    mask = torch.zeros(groups.shape, dtype=torch.bool, device=weight.device)
    mask.scatter_(-1, groups.topk(2, dim=-1).indices, True)
    return mask.view(out_f, in_f)


def _semi_structured_class():
    """The torch class ``to_sparse_semi_structured`` should build: cuSPARSELt if present, else CUTLASS."""
    sss = torch.sparse.SparseSemiStructuredTensor
    cusparselt = getattr(torch.backends, "cusparselt", None)
    if sss._FORCE_CUTLASS or cusparselt is None or not cusparselt.is_available():
        return torch.sparse.SparseSemiStructuredTensorCUTLASS
    return torch.sparse.SparseSemiStructuredTensorCUSPARSELT


def to_semi_structured(weight: torch.Tensor):
    """``torch.sparse.to_sparse_semi_structured(weight)``; when cuSPARSELt is missing, the CUTLASS tensor
    it would build with ``SparseSemiStructuredTensor._FORCE_CUTLASS`` set (without setting the global)."""
    from torch.sparse import to_sparse_semi_structured

    cls = _semi_structured_class()
    if (
        cls is torch.sparse.SparseSemiStructuredTensorCUSPARSELT
        or torch.sparse.SparseSemiStructuredTensor._FORCE_CUTLASS
    ):
        return to_sparse_semi_structured(weight.contiguous())
    return cls.from_dense(weight.contiguous())


def semi_structured_shape_problem(shape: tuple[int, int], dtype: torch.dtype) -> str | None:
    """Why torch's 2:4 GPU kernel cannot take a weight of this shape and dtype, or None. Constraints are
    read from torch (cuSPARSELt fp16/bf16: rows and cols multiples of 16; CUTLASS fp16/bf16: rows a
    multiple of 32, cols of 64)."""
    cls = _semi_structured_class()
    c = cls._DTYPE_SHAPE_CONSTRAINTS.get(dtype)
    if c is None:
        return f"dtype {dtype} is not supported by torch's {cls.BACKEND} 2:4 kernels"
    rows, cols = shape
    if rows < c.sparse_min_rows or rows % c.sparse_min_rows or cols < c.sparse_min_cols or cols % c.sparse_min_cols:
        return (
            f"shape {tuple(shape)} is not a multiple of ({c.sparse_min_rows}, {c.sparse_min_cols}), which torch's "
            f"{cls.BACKEND} 2:4 kernel needs for {dtype}"
        )
    return None


def sparse_kernel_problem(device, dtype: torch.dtype) -> str | None:
    """Why no 2:4 sparse-tensor-core path exists for weights on ``device`` in ``dtype``, or None."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"weights are on {device.type}: torch's 2:4 kernels run only on CUDA GPUs"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"GPU compute capability {major}.{minor} < 8.0: sparse tensor cores arrived with Ampere"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"weights are {dtype}: the 2:4 path here is for fp16/bf16 (convert the engine first)"
    return None


class SemiStructuredLinear(Linear):
    """``y = x Wᵀ + b`` with W in torch's 2:4 compressed format (values + metadata) on sparse tensor
    cores. ``weight`` keeps the dense, 2:4-masked matrix for reference and inspection."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__(weight, bias)
        problem = sparse_kernel_problem(weight.device, weight.dtype) or semi_structured_shape_problem(
            tuple(weight.shape), weight.dtype
        )
        if problem:
            raise ValueError(f"cannot build a 2:4 sparse layer: {problem}")
        self.sparse_weight = to_semi_structured(weight)

    @property
    def nbytes(self) -> int:
        """Bytes of the compressed weight (kept values + metadata) and bias."""
        parts = [getattr(self.sparse_weight, a, None) for a in ("packed", "meta", "compressed_swizzled_bitmask")]
        w = sum(t.numel() * t.element_size() for t in parts if isinstance(t, torch.Tensor))
        b = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return w + b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.reshape(-1, x.shape[-1]).contiguous(), self.sparse_weight, self.bias)
        return y.view(*x.shape[:-1], -1)


@dataclass
class TwoFourReport:
    layers: int
    sparsity: float  # fraction of zeros over the pruned layers, now 0.5 (or a bit more)
    sparse_kernels: bool  # True if the layers now run on 2:4 sparse tensor cores
    note: str
    masks: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)


@torch.no_grad()
def apply_two_four(engine, use_sparse_kernels="auto", *, include_lm_head: bool = False) -> TwoFourReport:
    """Prune every linear layer to 2:4 (in place, shared with the HF model). With sparse kernels (a CUDA
    GPU of compute capability ≥ 8.0, fp16/bf16 weights; ``"auto"`` uses them when present, ``True``
    requires them) each layer is then replaced by a ``SemiStructuredLinear``; otherwise only the mask is
    applied: the quality of 2:4 sparsity, computed by dense kernels at dense speed."""
    if not (use_sparse_kernels is True or use_sparse_kernels is False or use_sparse_kernels == "auto"):
        raise ValueError(f"use_sparse_kernels must be 'auto', True or False, got {use_sparse_kernels!r}")
    layers = prunable(engine, include_lm_head)
    problem = sparse_kernel_problem(engine.model.device, engine.model.dtype)
    if use_sparse_kernels is True and problem:
        raise ValueError(f"use_sparse_kernels=True, but {problem}")
    use = use_sparse_kernels is not False and problem is None
    for name, lin in layers.items():  # check every shape before changing anything
        if lin.weight.shape[1] % 4:
            raise ValueError(
                f"{name}: 2:4 sparsity needs in_features divisible by 4; weight shape {tuple(lin.weight.shape)}"
            )
        shape_problem = semi_structured_shape_problem(tuple(lin.weight.shape), lin.weight.dtype) if use else None
        if shape_problem:
            raise ValueError(f"{name}: {shape_problem}")
    masks = {name: two_four_mask(lin.weight) for name, lin in layers.items()}
    apply_masks(engine, masks)
    if use:
        for name, lin in layers.items():
            engine.model.set_linear(name, SemiStructuredLinear(lin.weight, lin.bias))
        note = "2:4 sparse tensor-core kernels (torch.sparse semi-structured)"
    else:
        why = "use_sparse_kernels=False" if use_sparse_kernels is False else problem
        note = f"mask only, dense kernels: no 2:4 speed-up path here ({why})"
    return TwoFourReport(len(layers), sparsity_of(engine, include_lm_head=include_lm_head), use, note, masks)
