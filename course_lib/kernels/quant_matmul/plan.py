"""What the int8 and int4 launchers share: the checks of the activations and of the scale tensors, the
choice of path, and the plan of tiles and K splits that fills a GPU.

Plain Python run before each launch (neither bandwidth- nor compute-bound itself); the plan is what
keeps the kernels bandwidth-bound: enough programs to occupy every SM, each weight byte read by one
program only. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.kernels import HAS_TRITON, launch  # imports course_lib first (TRITON_INTERPRET)
from course_lib.kernels.launch import next_pow2, require_contiguous, require_tensor, shape_of

if HAS_TRITON:
    import triton

X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_TRITON_ROWS = 64  # more rows than this (prefill) take the torch path: compute-bound, nothing to gain
GEMV_TILE = 4096  # weights per chunk on the GEMV path: BLOCK_N·BLOCK_K, 32 fp32 registers a thread at 4 warps


# ----------------------------------------------------------------------------- checks
def check_x(x) -> tuple[int, int]:
    """(M, K) of the activations: a 2-D, non-empty, contiguous fp32/fp16/bf16 tensor."""
    require_tensor("x", x, "(M, K)")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K) activations, got shape {shape_of(x)}")
    if x.dtype not in X_DTYPES:
        raise ValueError(f"x.dtype must be one of {[str(d) for d in X_DTYPES]}, got {x.dtype}")
    m, k = x.shape
    if m == 0 or k == 0:
        raise ValueError(f"x must have at least one row and one column, got shape {tuple(x.shape)}")
    require_contiguous("x", x)
    return m, k


def check_weight(name: str, w: torch.Tensor, x: torch.Tensor) -> int:
    """N, the rows of an integer weight already checked for dtype and columns: at least one, on x's
    device, contiguous."""
    n = w.shape[0]
    if n == 0:
        raise ValueError(f"{name} must have at least one row (N >= 1)")
    if w.device != x.device:
        raise ValueError(f"{name} must be on x's device {x.device}, got {w.device}")
    require_contiguous(name, w)
    return n


def check_params(name: str, t, shape: tuple, x: torch.Tensor) -> None:
    """Scales or zeros: exactly ``shape``, fp32 or x's dtype, on x's device, contiguous."""
    form = f"{shape} of torch.float32 or x's dtype {x.dtype}"
    require_tensor(name, t, form)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype not in (torch.float32, x.dtype):
        raise ValueError(f"{name}.dtype must be torch.float32 or x's dtype {x.dtype}, got {t.dtype}")
    if t.device != x.device:
        raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
    require_contiguous(name, t)


def check_split(split_k) -> int | None:
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1):
        raise ValueError(f"split_k must be None (automatic) or a positive int, got {split_k!r}")
    return split_k


def resolve_path(path: str, device: torch.device, rows: int = 1) -> str:
    """'auto' → Triton on a CUDA tensor, or on a CPU tensor when the interpreter is on; torch otherwise.
    More than ``MAX_TRITON_ROWS`` rows (prefill) take the torch path, whatever ``path`` says."""
    launch.check_path(path)
    if rows > MAX_TRITON_ROWS:
        return "torch"
    return launch.resolve_path(path, device)


# ----------------------------------------------------------------------------- the plan
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pow2_divisor(v: int) -> int:
    return v & -v


def plan_launch(m: int, n: int, k: int, device: torch.device, block_n, block_k, split_k, group_size=None) -> dict:
    """Tile sizes and grid; None picks. ``group_size``: None for int8, g for int4.

    GPU: the widest ``BLOCK_N`` in 64, 32, 16 giving at least ~1.5 programs per SM without a K split, but
    no narrower than 2·BLOCK_M on the tl.dot path (every program re-reads all of x from L2: narrow tiles
    re-read it too often). Only when N is still too small is K split, into splits of at least 4 chunks.
    Interpreter: BLOCK_N 64 and no split (fewer programs run faster there). ``BLOCK_K``: GEMV chunks of
    GEMV_TILE weights (at most 256 long); tl.dot chunks of 128; int4 chunks divide g when they can
    (one scale per row per chunk), else 128 with a per-byte scale gather."""
    use_dot = m > 1
    block_m = max(16, next_pow2(m)) if use_dot else 1
    target = 3 * _sm_count(device) // 2
    if block_n is None:
        if device.type == "cuda":
            narrowest = min(64, 2 * block_m) if use_dot else 16
            block_n = next((b for b in (64, 32, 16) if b >= narrowest and triton.cdiv(n, b) >= target), narrowest)
        else:
            block_n = 64
    if block_k is None:
        block_k = max(16, min(256, GEMV_TILE // block_n)) if not use_dot else 128
        if group_size is not None:  # int4
            fits = min(_pow2_divisor(group_size), block_k)
            block_k = fits if fits >= 32 else max(32, min(block_k, 128))
    chunks = triton.cdiv(k, block_k)
    if split_k is None:
        n_tiles = triton.cdiv(n, block_n)
        split_k = 1
        if device.type == "cuda" and n_tiles < target:
            split_k = max(1, min(triton.cdiv(target, n_tiles), chunks // 4))
    split_k = min(split_k, chunks)
    k_per_split = triton.cdiv(chunks, split_k) * block_k
    split_k = triton.cdiv(k, k_per_split)  # no empty splits
    return dict(
        grid=(triton.cdiv(n, block_n), split_k),
        K_PER_SPLIT=k_per_split,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=k % block_k == 0,
        USE_DOT=use_dot,
    )


def new_output(x: torch.Tensor, m: int, n: int, split_k: int) -> torch.Tensor:
    """y (M, N) in x's dtype, or fp32 partial sums (SPLIT_K, M, N) that ``finish`` adds up."""
    if split_k == 1:
        return torch.empty((m, n), dtype=x.dtype, device=x.device)
    return torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)  # partial sums


def finish(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The sum over K splits (deterministic, no atomics), in x's dtype."""
    return y if y.dim() == 2 else y.sum(dim=0).to(x.dtype)
