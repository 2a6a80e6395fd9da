"""Weight-only int4 skinny matmul: ``y = x · Wᵀ`` with W stored as packed 4-bit integers, dequantized in registers.

Format (gpt-fast / tinygemm convention, produced by ``course_lib.compression.quantize``; fixed): group-wise,
asymmetric. ``packed`` uint8 (N, K/2): byte j of row n holds u[n, 2j] in its LOW nibble and u[n, 2j+1] in
its HIGH nibble, u ∈ [0, 15]; ``scales``/``zeros`` (N, K/g): W[n, k] = (u[n, k] − 8) · scales[n, k // g]
+ zeros[n, k // g]. A decode step is bandwidth-bound on the weight: ~0.53 byte per weight at g = 128
against 2 for fp16, provided the nibbles become floats in registers and never travel back to memory.
Parts, in order: torch reference (+ the pack/unpack of the storage), Triton kernel, checked launcher,
torch fallback (= the reference). Tests: tests/test_quant_matmul.py. GPU timings:
benchmarks/quant_kernels_gpu.py. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.kernels import HAS_TRITON  # imports course_lib first (TRITON_INTERPRET)
from course_lib.kernels.launch import check_block, dot_precision, require_tensor, shape_of
from course_lib.kernels.quant_matmul import plan

if HAS_TRITON:
    import triton
    import triton.language as tl

FAST_GROUP_SIZES = (32, 64, 128, 256)  # one group per K chunk; other even sizes work, via a scale gather


# ----------------------------------------------------------------------------- 1. reference and storage
def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K/2) uint8 → (N, K) uint8 values in [0, 15]: low nibble → even k, high nibble → odd k."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(
            f"packed must be a 2-D uint8 (N, K/2) tensor, got "
            f"{getattr(packed, 'dtype', type(packed).__name__)} {tuple(getattr(packed, 'shape', ()))}"
        )
    lo = packed & 0xF  # k = 2j
    hi = packed >> 4  # k = 2j + 1 (uint8: logical shift)
    return torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], 2 * packed.shape[1])


def pack_int4(u: torch.Tensor) -> torch.Tensor:
    """(N, K) integers in [0, 15], K even → (N, K/2) uint8: u[:, 2j] in the low nibble, u[:, 2j+1] high."""
    if not isinstance(u, torch.Tensor) or u.dim() != 2 or u.dtype.is_floating_point or u.dtype == torch.bool:
        raise ValueError(
            f"u must be a 2-D integer (N, K) tensor, got {getattr(u, 'dtype', type(u).__name__)} "
            f"{tuple(getattr(u, 'shape', ()))}"
        )
    if u.shape[1] % 2:
        raise ValueError(f"u must have an even number of columns K (two values per byte), got K={u.shape[1]}")
    if u.numel() and (int(u.min()) < 0 or int(u.max()) > 15):
        raise ValueError(f"u values must lie in [0, 15], got [{int(u.min())}, {int(u.max())}]")
    u = u.to(torch.uint8)
    return (u[:, 0::2] | (u[:, 1::2] << 4)).contiguous()


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """fp32 (N, K): (u[n, k] − 8) · scales[n, k // g] + zeros[n, k // g]."""
    u = unpack_int4(packed).to(torch.float32)  # (N, K)
    s = scales.to(torch.float32).repeat_interleave(group_size, dim=1)  # (N, K)
    z = zeros.to(torch.float32).repeat_interleave(group_size, dim=1)
    return (u - 8.0) * s + z


def int4_matmul_ref(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Plain torch: unpack, dequantize W to fp32, then ``x · Wᵀ`` in fp32; returns x's dtype. (M, N).

    Bytes of the fused kernel: N·K/2 (two weights per byte) + 2·N·(K/g)·param_bytes (scales and zeros)
    + M·K·x_bytes + M·N·y_bytes; with g = 128 and fp16 parameters that is ~0.53 byte per weight.
    FLOPs: 2·M·N·K."""
    return (x.to(torch.float32) @ dequantize_int4(packed, scales, zeros, group_size).t()).to(x.dtype)


def int4_weight_bytes(n: int, k: int, group_size: int, param_bytes: int = 2) -> int:
    """Bytes of weight an int4 matmul streams: N·K/2 packed integers + 2·N·K/g scales and zeros."""
    return n * k // 2 + 2 * n * (k // group_size) * param_bytes


# ----------------------------------------------------------------------------- 2. Triton kernel
# The int8 kernel's structure (quant_matmul.int8): program (pid_n, pid_k) computes y[:, pid_n·BLOCK_N :
# +BLOCK_N] for all M rows over its K range; GEMV (multiply + sum) for M = 1, tl.dot for M = 2..64;
# SPLIT_K > 1 writes fp32 partial sums. What differs: each byte holds two weights (k = 2j, 2j + 1), and
# the scale and zero change every GROUP columns.
if HAS_TRITON:

    @triton.jit
    def _int4_matmul_kernel(
        x_ptr,  # *T (M, K) activations, row-major contiguous, T = fp32/fp16/bf16
        p_ptr,  # *uint8 (N, K/2) packed weights: byte j = u[2j] | u[2j+1] << 4, row-major contiguous
        s_ptr,  # *fp32 or *T (N, K/GROUP) scales, row-major contiguous
        z_ptr,  # *fp32 or *T (N, K/GROUP) zeros, row-major contiguous
        y_ptr,  # *T (M, N) output; or *fp32 (SPLIT_K, M, N) partial sums when the grid has SPLIT_K > 1
        M,  # int32: rows of x (1..64)
        N,  # int32: output channels
        K,  # int32: reduction length, a multiple of GROUP (so even)
        K_PER_SPLIT,  # int32: K range of one program along grid axis 1, a multiple of BLOCK_K
        GROUP: tl.constexpr,  # group size g: consecutive k sharing one scale and zero (even)
        BLOCK_M: tl.constexpr,  # 1 (GEMV path) or a power of two >= 16 covering M (tl.dot path)
        BLOCK_N: tl.constexpr,  # output channels per program, a power of two >= 16
        BLOCK_K: tl.constexpr,  # K chunk per iteration = BLOCK_K/2 bytes per row, a power of two >= 32
        ONE_GROUP: tl.constexpr,  # GROUP % BLOCK_K == 0: a chunk lies in one group, one scale per row
        EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: every chunk is full, no K mask (keeps loads vectorized)
        USE_DOT: tl.constexpr,  # tl.dot (tensor cores) when BLOCK_M >= 16, else multiply + sum
        DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 x (no TF32 rounding), "tf32" (ignored) for fp16/bf16
    ):
        # A chunk is BLOCK_K // 2 byte columns j; byte j holds k = 2j (low nibble) and k = 2j + 1 (high).
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_m = offs_m < M
        mask_n = offs_n < N
        n_groups = K // GROUP
        rows_p = offs_n.to(tl.int64) * (K // 2)  # (BLOCK_N,) row starts in packed (int64: no overflow)
        rows_s = offs_n.to(tl.int64) * n_groups  # (BLOCK_N,) row starts in scales/zeros
        k_lo = pid_k * K_PER_SPLIT
        k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
        if USE_DOT:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_N, BLOCK_K // 2), dtype=tl.float32)  # elementwise partial sums
        for k0 in range(k_lo, k_hi, BLOCK_K):
            offs_j = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # (BLOCK_K/2,) byte columns
            if EVEN_K:
                mask_j = tl.full((BLOCK_K // 2,), 1, tl.int1)
            else:
                mask_j = offs_j < k_hi // 2
            mask_nj = mask_n[:, None] & mask_j[None, :]
            byte = tl.load(p_ptr + rows_p[:, None] + offs_j[None, :], mask=mask_nj, other=0)  # (BLOCK_N, BLOCK_K/2)
            u_lo = (byte & 0xF).to(tl.float32)  # u[n, 2j]
            u_hi = (byte >> 4).to(tl.float32)  # u[n, 2j+1] (logical shift: byte is unsigned)
            if ONE_GROUP:  # the whole chunk shares group k0 // GROUP: one scale and zero per row
                g = k0 // GROUP
                s = tl.load(s_ptr + rows_s + g, mask=mask_n, other=0.0).to(tl.float32)[:, None]  # (BLOCK_N, 1)
                z = tl.load(z_ptr + rows_s + g, mask=mask_n, other=0.0).to(tl.float32)[:, None]
            else:  # groups smaller than the chunk or across it: gather per byte (2j and 2j+1 share a group)
                g = (2 * offs_j) // GROUP  # (BLOCK_K/2,)
                s = tl.load(s_ptr + rows_s[:, None] + g[None, :], mask=mask_nj, other=0.0).to(tl.float32)
                z = tl.load(z_ptr + rows_s[:, None] + g[None, :], mask=mask_nj, other=0.0).to(tl.float32)
            w_lo = (u_lo - 8.0) * s + z  # (BLOCK_N, BLOCK_K/2) fp32: W[n, 2j], dequantized in registers
            w_hi = (u_hi - 8.0) * s + z  # W[n, 2j+1]
            x_rows = x_ptr + offs_m[:, None] * K + 2 * offs_j[None, :]  # (BLOCK_M, BLOCK_K/2): &x[m, 2j]
            mask_mj = mask_m[:, None] & mask_j[None, :]
            x_even = tl.load(x_rows, mask=mask_mj, other=0.0)  # strided, but x is tiny and cached
            x_odd = tl.load(x_rows + 1, mask=mask_mj, other=0.0)  # x[m, 2j+1]
            if USE_DOT:  # two half-length dots instead of re-interleaving the nibbles
                acc = tl.dot(x_even, tl.trans(w_lo.to(x_even.dtype)), acc, input_precision=DOT_PRECISION)
                acc = tl.dot(x_odd, tl.trans(w_hi.to(x_odd.dtype)), acc, input_precision=DOT_PRECISION)
            else:
                acc += w_lo * x_even.to(tl.float32) + w_hi * x_odd.to(tl.float32)  # (BLOCK_N, BLOCK_K/2)
        if not USE_DOT:
            acc = tl.sum(acc, axis=1)[None, :]  # (1, BLOCK_N)
        y_offs = pid_k.to(tl.int64) * M * N + offs_m[:, None] * N + offs_n[None, :]
        tl.store(y_ptr + y_offs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# ----------------------------------------------------------------------------- 3. launcher
def _check_group_size(group_size) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise ValueError(f"group_size must be an even int >= 2 (fast: one of {FAST_GROUP_SIZES}), got {group_size!r}")
    return group_size


def _check_int4(x, packed, scales, zeros, group_size) -> tuple[int, int, int]:
    m, k = plan.check_x(x)
    g = _check_group_size(group_size)
    if k % 2:
        raise ValueError(f"x must have an even K for int4 (two weights per byte), got K={k}")
    if k % g:
        raise ValueError(f"K={k} (x.shape[1]) must be a multiple of group_size={g}")
    require_tensor("packed", packed, "uint8 (N, K/2)")
    if packed.dim() != 2 or packed.dtype != torch.uint8:
        raise ValueError(f"packed must be a 2-D uint8 (N, K/2) tensor, got {packed.dtype} {shape_of(packed)}")
    if packed.shape[1] * 2 != k:
        raise ValueError(
            f"packed must have K/2={k // 2} columns for x's K={k}: packed is {tuple(packed.shape)}, "
            f"x is {tuple(x.shape)}"
        )
    n = plan.check_weight("packed", packed, x)
    plan.check_params("scales", scales, (n, k // g), x)
    plan.check_params("zeros", zeros, (n, k // g), x)
    return m, n, k


def int4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    *,
    path: str = "auto",
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
) -> torch.Tensor:
    """``y = x · Wᵀ`` with W[n, k] = (u[n, k] − 8) · scales[n, k // g] + zeros[n, k // g], u the nibbles of
    ``packed`` uint8 (N, K/2) (low nibble = even k). x (M, K) fp32/fp16/bf16; scales, zeros (N, K/g) fp32 or
    x's dtype; K a multiple of ``group_size`` (even; 32, 64, 128, 256 are the fast ones) → y (M, N) in x's
    dtype, accumulated in fp32. ``path``: 'auto', 'triton' or 'torch'; more than 64 rows always take the
    torch reference. ``block_n`` (16..256), ``block_k`` (32..512; fastest when it divides g) and
    ``split_k`` tune the Triton kernel; None picks them (see ``plan.plan_launch``). Checks run first."""
    m, n, k = _check_int4(x, packed, scales, zeros, group_size)
    block_n = check_block("block_n", block_n, 16, 256)
    block_k = check_block("block_k", block_k, 32, 512)  # tl.dot needs BLOCK_K/2 >= 16
    split_k = plan.check_split(split_k)
    if plan.resolve_path(path, x.device, m) == "torch":
        return int4_matmul_ref(x, packed, scales, zeros, group_size)
    tiles = plan.plan_launch(m, n, k, x.device, block_n, block_k, split_k, group_size)
    grid = tiles.pop("grid")
    y = plan.new_output(x, m, n, grid[1])
    _int4_matmul_kernel[grid](
        x,
        packed,
        scales,
        zeros,
        y,
        m,
        n,
        k,
        GROUP=group_size,
        ONE_GROUP=group_size % tiles["BLOCK_K"] == 0,
        DOT_PRECISION=dot_precision(x.dtype),
        num_warps=4,
        **tiles,
    )
    return plan.finish(y, x)


# ----------------------------------------------------------------------------- 4. torch fallback
int4_matmul_torch = int4_matmul_ref  # the torch path is the reference: unpack, dequantize to fp32, matmul
