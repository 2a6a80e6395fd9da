"""A kernel whose arithmetic intensity is a dial: ``y = x; repeat k times: y = y·a + b``.

Each element is read once and written once whatever k is, while the work grows as 2·k FLOPs per
element, so the intensity is k / bytes-per-element (fp32: k/4 FLOP/byte). Small k is
bandwidth-bound, large k compute-bound; sweeping k walks a point along the roofline and across the
ridge. Parts, in order: torch reference, Triton kernel, checked launcher, torch fallback (the path
timed on a CPU: chunks small enough to stay in cache, so DRAM traffic is one read and one write
like the fused kernel), sweep helper. Tests: tests/test_intensity_kernel.py.
Introduced in 01_bottlenecks_1_roofline_overhead.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.core.dtypes import canonical
from course_lib.kernels import HAS_TRITON, launch  # imports course_lib first (TRITON_INTERPRET)
from course_lib.measure.costs import check_positive_int, fma_chain_cost

if HAS_TRITON:
    import triton
    import triton.language as tl

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------- 1. reference
def intensity_ref(x: torch.Tensor, k: int, a: float = 0.9, b: float = 0.1) -> torch.Tensor:
    """Plain torch: the meaning of the kernel. Computes in fp32, returns x's dtype.

    Bytes: reads x once (n · elt) and writes y once (n · elt) — in the fused kernel; this reference
    itself makes 2k temporaries and moves far more. FLOPs: 2·k·n (one multiply and one add per step).
    """
    y = x.to(torch.float32)  # (n,) fp32 accumulator
    for _ in range(k):
        y = y * a + b
    return y.to(x.dtype)


# ----------------------------------------------------------------------------- 2. Triton kernel
if HAS_TRITON:

    @triton.jit
    def _intensity_kernel(
        x_ptr,  # *T: input, n contiguous elements, read once
        y_ptr,  # *T: output, n contiguous elements, written once
        n,  # int32: number of elements
        a,  # fp32 scalar: multiplier of each step
        b,  # fp32 scalar: addend of each step
        K: tl.constexpr,  # steps per element: the intensity dial (2·K FLOPs per element)
        BLOCK: tl.constexpr,  # elements per program instance, a power of two
    ):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
        mask = offs < n  # always mask: the interpreter does not catch out-of-bounds loads
        y = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # (BLOCK,) in registers
        for _ in range(K):  # stays in registers: FLOPs without bytes
            y = y * a + b
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- 3. launcher
def _check_block(block) -> int:
    if isinstance(block, bool) or not isinstance(block, int) or block < 16 or block > 65536 or block & (block - 1):
        raise ValueError(f"block must be a power of two between 16 and 65536 (e.g. 1024), got {block!r}")
    return block


def _check_input(x, k) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x.dtype must be one of {[str(d) for d in _DTYPES]}, got {x.dtype}")
    if x.numel() == 0:
        raise ValueError("x must have at least one element")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous (strides {x.stride()} for shape {tuple(x.shape)}); call .contiguous()")
    check_positive_int("k", k)


def resolve_path(path: str, device: torch.device) -> str:
    """'auto' -> Triton on a CUDA tensor (when Triton is installed), torch otherwise: on a CPU the cache-blocked
    torch loop is what is timed, not the interpreter; 'triton' on a CPU runs it through the interpreter."""
    return launch.resolve_path(path, device, auto_interprets=False)


def _check_out(out, x) -> None:
    if out is None:
        return
    if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out must be a tensor of x's shape {tuple(x.shape)}, dtype {x.dtype} and device {x.device}")
    if not out.is_contiguous():
        raise ValueError(f"out must be contiguous (strides {out.stride()})")


def intensity(
    x: torch.Tensor,
    k: int,
    *,
    a: float = 0.9,
    b: float = 0.1,
    block: int = 1024,
    path: str = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = x; repeat k: y = y·a + b`` elementwise. ``path``: 'auto', 'triton' (GPU, or the
    interpreter on CPU) or 'torch' (the cache-blocked fallback). ``out``: a preallocated result
    (timing loops pass one, so that page faults of a fresh CPU allocation are not timed).
    Checks run before any allocation."""
    _check_input(x, k)
    block = _check_block(block)
    _check_out(out, x)
    path = resolve_path(path, x.device)
    if path == "torch":
        return intensity_torch(x, k, a=a, b=b, out=out)
    y = torch.empty_like(x) if out is None else out
    n = x.numel()
    grid = (triton.cdiv(n, block),)
    _intensity_kernel[grid](x, y, n, float(a), float(b), K=k, BLOCK=block)
    return y


# ----------------------------------------------------------------------------- 4. torch fallback
def intensity_torch(
    x: torch.Tensor, k: int, *, a: float = 0.9, b: float = 0.1, chunk: int = 1 << 16, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Same math as the kernel with torch ops, processed in chunks that stay in the CPU's cache:
    memory traffic is one read of x and one write of y, as in the fused kernel."""
    _check_input(x, k)
    check_positive_int("chunk", chunk)
    _check_out(out, x)
    flat = x.reshape(-1)  # (n,) view: x is contiguous
    y = torch.empty_like(flat) if out is None else out.view(-1)
    buf = torch.empty(min(chunk, flat.numel()), dtype=torch.float32, device=x.device)  # (chunk,) cache-resident
    for start in range(0, flat.numel(), chunk):
        piece = buf[: min(chunk, flat.numel() - start)]
        piece.copy_(flat[start : start + piece.numel()])  # the one read from memory
        for _ in range(k):
            piece.mul_(a).add_(b)
        y[start : start + piece.numel()].copy_(piece)  # the one write to memory
    return y.view_as(x)


# ----------------------------------------------------------------------------- sweep
def intensity_sweep(
    ks,
    *,
    n: int,
    dtype: str = "fp32",
    device=None,
    path: str = "auto",
    repeats: int | None = None,
    warmup: int | None = None,
):
    """Time the kernel for each k in ``ks`` on n elements; returns ``[(k, bench.Timing)]`` with the
    counted FLOPs and bytes, ready for ``roofline.Point.from_timing``."""
    from course_lib.core.dtypes import torch_dtype
    from course_lib.measure.bench import benchmark

    check_positive_int("n", n)
    name = canonical(dtype)
    if torch_dtype(name) not in _DTYPES:
        raise ValueError(f"dtype must be one of ('fp32', 'fp16', 'bf16'), got {dtype!r}")
    ks = list(ks)
    if not ks:
        raise ValueError("ks must hold at least one k")
    for k in ks:
        check_positive_int("k", k)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    chosen = resolve_path(path, dev)
    x = torch.rand(n, generator=torch.Generator(device=dev).manual_seed(0), device=dev).to(torch_dtype(name))
    y = torch.zeros_like(x)  # written by every call: allocated (and its pages touched) once, outside the clock
    results = []
    for k in ks:
        cost = fma_chain_cost(n, k, name)
        timing = benchmark(
            lambda k=k: intensity(x, k, path=chosen, out=y),
            flops=cost.flops,
            bytes=cost.bytes,
            device=dev.type,
            label=f"fma-chain k={k} ({chosen})",
            dtype="fp32",
            repeats=repeats,
            warmup=warmup,
        )
        results.append((k, timing))
    return results
