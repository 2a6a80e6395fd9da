"""What every launcher of the course's kernels checks before it launches, written once.

Which path runs (``resolve_path``: Triton on a CUDA GPU, Triton through the CPU interpreter, or the torch
fallback), and the small checks the launchers share: a tensor is a tensor, is contiguous, a tile size is
a power of two in range, which ``tl.dot`` precision a dtype asks for. Plain Python that runs before any
kernel: neither bandwidth- nor compute-bound. Used by ``flash_attention``, ``paged_decode``,
``quant_matmul`` and ``intensity``. Introduced in 01_bottlenecks_1_roofline_overhead.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.kernels import HAS_TRITON, interpreter_on  # imports course_lib first (TRITON_INTERPRET)

PATHS = ("auto", "triton", "torch")


def check_path(path) -> str:
    """``path`` itself if it is one of ``PATHS``, else ValueError."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return path


def resolve_path(
    path: str, device: torch.device, *, interpreter_problem: str | None = None, auto_interprets: bool = True
) -> str:
    """'triton' or 'torch' for a call on ``device``.

    'auto' → Triton on a CUDA tensor, or on a CPU tensor when the interpreter is on (``auto_interprets=False``:
    CUDA only); torch otherwise. 'triton' raises RuntimeError where it cannot run (no Triton, a CPU without
    TRITON_INTERPRET=1, another device). ``interpreter_problem``: why this call cannot run under the
    interpreter (bf16 arithmetic, say): 'auto' then takes torch there, and 'triton' raises ValueError with it."""
    check_path(path)
    if path == "torch":
        return "torch"
    interpreted = device.type == "cpu" and interpreter_on()
    if path == "auto":
        runnable = device.type == "cuda" or (auto_interprets and interpreted and interpreter_problem is None)
        return "triton" if HAS_TRITON and runnable else "torch"
    if not HAS_TRITON:
        raise RuntimeError("path='triton' but Triton is not installed; use path='torch'")
    if device.type == "cpu" and not interpreted:
        raise RuntimeError(
            "path='triton' on a CPU tensor needs TRITON_INTERPRET=1 set before Triton is imported (import course_lib first)"
        )
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"path='triton' needs a CUDA (or, interpreted, CPU) tensor, got device {device}")
    if interpreted and interpreter_problem:
        raise ValueError(interpreter_problem)
    return "triton"


def shape_of(t) -> tuple:
    """``t.shape`` as a tuple, or () for something that is not a tensor (for error messages)."""
    return tuple(getattr(t, "shape", ()))


def require_tensor(name: str, t, form: str) -> torch.Tensor:
    """``t`` if it is a tensor, else ValueError naming the ``form`` expected, e.g. 'int8 (N, K)'."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {form}, got {type(t).__name__}")
    return t


def require_contiguous(name: str, t: torch.Tensor) -> None:
    """ValueError unless ``t`` is row-major contiguous (kernels that compute offsets from the shape)."""
    if not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous (row-major), got strides {t.stride()} for shape {tuple(t.shape)}; "
            "call .contiguous()"
        )


def check_block(name: str, value, lo: int, hi: int) -> int | None:
    """A tile size given by the caller: None (the launcher picks) or a power of two in [lo, hi]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or value > hi or value & (value - 1):
        raise ValueError(f"{name} must be None or a power of two between {lo} and {hi}, got {value!r}")
    return value


def next_pow2(v: int) -> int:
    """The smallest power of two >= v (1 for v <= 1): ``tl.arange`` spans only powers of two."""
    return 1 << max(0, v - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s ``input_precision``: 'ieee' for fp32 (no TF32 rounding), 'tf32' (ignored) for fp16/bf16."""
    return "ieee" if dtype == torch.float32 else "tf32"
