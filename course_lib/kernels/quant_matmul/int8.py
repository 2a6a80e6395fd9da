"""Weight-only int8 skinny matmul: ``y = x · (q · scale[:, None])ᵀ`` with the int8 weight dequantized in registers.

Format (produced by ``course_lib.compression.quantize``; fixed): per output channel, symmetric: ``q`` int8
(N, K), ``scale`` (N,): W[n, k] = q[n, k] · scale[n]. A decode step (M = 1..16 rows) is bandwidth-bound:
its time is the N·K bytes of weight it streams, half of fp16's. Parts, in order: torch reference, Triton
kernel, checked launcher, torch fallback (= the reference). Tests: tests/test_quant_matmul.py. GPU
timings: benchmarks/quant_kernels_gpu.py. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.kernels import HAS_TRITON  # imports course_lib first (TRITON_INTERPRET)
from course_lib.kernels.launch import check_block, dot_precision, require_tensor, shape_of
from course_lib.kernels.quant_matmul import plan

if HAS_TRITON:
    import triton
    import triton.language as tl


# ----------------------------------------------------------------------------- 1. reference
def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 (N, K): q[n, k] · scale[n]."""
    return q.to(torch.float32) * scale.to(torch.float32)[:, None]


def int8_matmul_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Plain torch: dequantize W to fp32, then ``x · Wᵀ`` in fp32; returns x's dtype. (M, N).

    Bytes of the fused kernel: N·K·1 (int8 weights) + N·scale_bytes + M·K·x_bytes + M·N·y_bytes — against
    N·K·2 for an fp16 weight. This reference itself writes and reads an fp32 copy of W (8·N·K more).
    FLOPs: 2·M·N·K."""
    return (x.to(torch.float32) @ dequantize_int8(q, scale).t()).to(x.dtype)


def int8_weight_bytes(n: int, k: int, scale_bytes: int = 4) -> int:
    """Bytes of weight an int8 matmul streams: N·K integers + N scales."""
    return n * k + n * scale_bytes


# ----------------------------------------------------------------------------- 2. Triton kernel
# Program (pid_n, pid_k) computes y[:, pid_n·BLOCK_N : +BLOCK_N] for ALL M rows, over the K range
# [pid_k·K_PER_SPLIT, +K_PER_SPLIT), in BLOCK_K chunks. Each weight byte is read by exactly one program;
# the activations (≤ 64 rows) are re-read by every program but stay in L2. Two inner products:
# - BLOCK_M == 1 (USE_DOT false, M = 1): GEMV on the CUDA cores, in fp32. The products of each chunk are
#   added elementwise into a (BLOCK_N, BLOCK_K) register tile that is summed along K once, after the loop
#   (one cross-thread reduction per program instead of one per chunk).
# - BLOCK_M >= 16 (USE_DOT true, M = 2..64): tl.dot on the tensor cores (x padded to 16 rows; the
#   wasted MMA work is free in a bandwidth-bound kernel), W cast to x's dtype, fp32 accumulator.
# SPLIT_K > 1 (grid axis 1) gives a small N enough programs to fill the GPU: each split writes fp32
# partial sums to its own slice of a workspace, which the launcher sums (deterministic, no atomics).
# The int4 kernel (quant_matmul.int4) has the same structure.
if HAS_TRITON:

    @triton.jit
    def _int8_matmul_kernel(
        x_ptr,  # *T (M, K) activations, row-major contiguous, T = fp32/fp16/bf16
        q_ptr,  # *int8 (N, K) weights, row-major contiguous
        scale_ptr,  # *fp32 or *T (N,) per-output-channel scales
        y_ptr,  # *T (M, N) output; or *fp32 (SPLIT_K, M, N) partial sums when the grid has SPLIT_K > 1
        M,  # int32: rows of x (1..64)
        N,  # int32: output channels
        K,  # int32: reduction length (any value: edges masked)
        K_PER_SPLIT,  # int32: K range of one program along grid axis 1, a multiple of BLOCK_K
        BLOCK_M: tl.constexpr,  # 1 (GEMV path) or a power of two >= 16 covering M (tl.dot path)
        BLOCK_N: tl.constexpr,  # output channels per program, a power of two >= 16
        BLOCK_K: tl.constexpr,  # K chunk per loop iteration, a power of two >= 16
        EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: every chunk is full, no K mask (keeps loads vectorized)
        USE_DOT: tl.constexpr,  # tl.dot (tensor cores) when BLOCK_M >= 16, else multiply + sum
        DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 x (no TF32 rounding), "tf32" (ignored) for fp16/bf16
    ):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        mask_m = offs_m < M
        mask_n = offs_n < N  # N is not a multiple of BLOCK_N in general
        rows_q = offs_n.to(tl.int64) * K  # (BLOCK_N,) row starts in q; int64: N·K may pass 2**31
        k_lo = pid_k * K_PER_SPLIT
        k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
        if USE_DOT:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)  # elementwise partial sums, reduced at the end
        for k0 in range(k_lo, k_hi, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
            if EVEN_K:  # k_hi is a multiple of BLOCK_K: an all-true mask, which the compiler folds away
                mask_k = tl.full((BLOCK_K,), 1, tl.int1)
            else:
                mask_k = offs_k < k_hi
            q = tl.load(
                q_ptr + rows_q[:, None] + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0
            )  # (BLOCK_N, BLOCK_K) int8: the only big read
            x = tl.load(
                x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0
            )  # (BLOCK_M, BLOCK_K) T
            if USE_DOT:
                # int8 values are exact in fp16 and bf16 (|q| <= 128 <= 2**8): no rounding before the MMA.
                acc = tl.dot(x, tl.trans(q.to(x.dtype)), acc, input_precision=DOT_PRECISION)
            else:
                acc += q.to(tl.float32) * x.to(tl.float32)  # (BLOCK_N, BLOCK_K) * (1, BLOCK_K)
        if not USE_DOT:
            acc = tl.sum(acc, axis=1)[None, :]  # (1, BLOCK_N)
        # The scale is per output channel, so it factors out of the sum over k: one multiply per output
        # instead of one per weight.
        scale = tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)  # (BLOCK_N,)
        acc = acc * scale[None, :]
        y_offs = pid_k.to(tl.int64) * M * N + offs_m[:, None] * N + offs_n[None, :]
        tl.store(y_ptr + y_offs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# ----------------------------------------------------------------------------- 3. launcher
def _check_int8(x, q, scale) -> tuple[int, int, int]:
    m, k = plan.check_x(x)
    require_tensor("q", q, "int8 (N, K)")
    if q.dim() != 2 or q.dtype != torch.int8:
        raise ValueError(f"q must be a 2-D int8 (N, K) tensor, got {q.dtype} {shape_of(q)}")
    if q.shape[1] != k:
        raise ValueError(f"q must have x's K={k} columns: q is {tuple(q.shape)}, x is {tuple(x.shape)}")
    n = plan.check_weight("q", q, x)
    plan.check_params("scale", scale, (n,), x)
    return m, n, k


def int8_matmul(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    *,
    path: str = "auto",
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
) -> torch.Tensor:
    """``y = x · (q · scale[:, None])ᵀ``: x (M, K) fp32/fp16/bf16, q int8 (N, K), scale (N,) fp32 or x's
    dtype → y (M, N) in x's dtype, accumulated in fp32. ``path``: 'auto', 'triton' or 'torch'; more than
    64 rows always take the torch reference. ``block_n`` (16..256), ``block_k`` (16..512) and ``split_k``
    tune the Triton kernel; None picks them (see ``plan.plan_launch``). Checks run first."""
    m, n, k = _check_int8(x, q, scale)
    block_n = check_block("block_n", block_n, 16, 256)
    block_k = check_block("block_k", block_k, 16, 512)
    split_k = plan.check_split(split_k)
    if plan.resolve_path(path, x.device, m) == "torch":
        return int8_matmul_ref(x, q, scale)
    tiles = plan.plan_launch(m, n, k, x.device, block_n, block_k, split_k)
    grid = tiles.pop("grid")
    y = plan.new_output(x, m, n, grid[1])
    _int8_matmul_kernel[grid](x, q, scale, y, m, n, k, DOT_PRECISION=dot_precision(x.dtype), num_warps=4, **tiles)
    return plan.finish(y, x)


# ----------------------------------------------------------------------------- 4. torch fallback
int8_matmul_torch = int8_matmul_ref  # the torch path is the reference: correct everywhere, not bandwidth-saving
