"""Weight-only quantized skinny matmul: ``y = x · Wᵀ`` with W stored as int8 or int4 and dequantized in registers.

A decode step multiplies a few rows of activations (M = 1..16) by every weight matrix of the model: it
is bandwidth-bound, and its time is the bytes of weight it streams (chapter 01). Storing W in 8 or 4
bits divides those bytes by 2 or ~4 against fp16, *provided* the kernel reads the integers and turns
them into floats in registers, never writing a float copy of W back to memory. That is what the two
kernels here do. Formats (produced by ``course_lib.compression.quantize``; fixed):

- int8, per output channel, symmetric: ``q`` int8 (N, K), ``scale`` (N,): W[n, k] = q[n, k] · scale[n].
- int4, group-wise, asymmetric (gpt-fast / tinygemm convention): ``packed`` uint8 (N, K/2), byte j of
  row n holds u[n, 2j] in its LOW nibble and u[n, 2j+1] in its HIGH nibble, u ∈ [0, 15];
  ``scales``/``zeros`` (N, K/g): W[n, k] = (u[n, k] − 8) · scales[n, k // g] + zeros[n, k // g].

Parts, in order: torch references (+ pack/unpack helpers), Triton kernels, checked launchers, torch
fallbacks (= the references). Tests: tests/test_quant_matmul.py. GPU timings:
benchmarks/quant_kernels_gpu.py. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.kernels import HAS_TRITON, interpreter_on  # imports course_lib first (TRITON_INTERPRET)

if HAS_TRITON:
    import triton
    import triton.language as tl

_X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PATHS = ("auto", "triton", "torch")
MAX_TRITON_ROWS = 64  # more rows than this (prefill) take the torch path: compute-bound, nothing to gain
FAST_GROUP_SIZES = (32, 64, 128, 256)  # one group per K chunk; other even sizes work, via a scale gather


# ----------------------------------------------------------------------------- 1. references and helpers
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


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 (N, K): q[n, k] · scale[n]."""
    return q.to(torch.float32) * scale.to(torch.float32)[:, None]


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """fp32 (N, K): (u[n, k] − 8) · scales[n, k // g] + zeros[n, k // g]."""
    u = unpack_int4(packed).to(torch.float32)  # (N, K)
    s = scales.to(torch.float32).repeat_interleave(group_size, dim=1)  # (N, K)
    z = zeros.to(torch.float32).repeat_interleave(group_size, dim=1)
    return (u - 8.0) * s + z


def int8_matmul_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Plain torch: dequantize W to fp32, then ``x · Wᵀ`` in fp32; returns x's dtype. (M, N).

    Bytes of the fused kernel: N·K·1 (int8 weights) + N·scale_bytes + M·K·x_bytes + M·N·y_bytes — against
    N·K·2 for an fp16 weight. This reference itself writes and reads an fp32 copy of W (8·N·K more).
    FLOPs: 2·M·N·K."""
    return (x.to(torch.float32) @ dequantize_int8(q, scale).t()).to(x.dtype)


def int4_matmul_ref(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Plain torch: unpack, dequantize W to fp32, then ``x · Wᵀ`` in fp32; returns x's dtype. (M, N).

    Bytes of the fused kernel: N·K/2 (two weights per byte) + 2·N·(K/g)·param_bytes (scales and zeros)
    + M·K·x_bytes + M·N·y_bytes; with g = 128 and fp16 parameters that is ~0.53 byte per weight.
    FLOPs: 2·M·N·K."""
    return (x.to(torch.float32) @ dequantize_int4(packed, scales, zeros, group_size).t()).to(x.dtype)


def int8_weight_bytes(n: int, k: int, scale_bytes: int = 4) -> int:
    """Bytes of weight an int8 matmul streams: N·K integers + N scales."""
    return n * k + n * scale_bytes


def int4_weight_bytes(n: int, k: int, group_size: int, param_bytes: int = 2) -> int:
    """Bytes of weight an int4 matmul streams: N·K/2 packed integers + 2·N·K/g scales and zeros."""
    return n * k // 2 + 2 * n * (k // group_size) * param_bytes


# ----------------------------------------------------------------------------- 2. Triton kernels
# Both kernels: program (pid_n, pid_k) computes y[:, pid_n·BLOCK_N : +BLOCK_N] for ALL M rows, over the
# K range [pid_k·K_PER_SPLIT, +K_PER_SPLIT), in BLOCK_K chunks. Each weight byte is read by exactly one
# program; the activations (≤ 64 rows) are re-read by every program but stay in L2. Two inner products:
# - BLOCK_M == 1 (USE_DOT false, M = 1): GEMV on the CUDA cores, in fp32. The products of each chunk are
#   added elementwise into a (BLOCK_N, BLOCK_K) register tile that is summed along K once, after the loop
#   (one cross-thread reduction per program instead of one per chunk).
# - BLOCK_M >= 16 (USE_DOT true, M = 2..64): tl.dot on the tensor cores (x padded to 16 rows; the
#   wasted MMA work is free in a bandwidth-bound kernel), W cast to x's dtype, fp32 accumulator.
# SPLIT_K > 1 (grid axis 1) gives a small N enough programs to fill the GPU: each split writes fp32
# partial sums to its own slice of a workspace, which the launcher sums (deterministic, no atomics).
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


# ----------------------------------------------------------------------------- 3. launchers
def _shape(t) -> tuple:
    return tuple(getattr(t, "shape", ()))


def _tensor(name: str, t, form: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {form}, got {type(t).__name__}")
    return t


def _contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous (row-major), got strides {t.stride()} for shape {tuple(t.shape)}; "
            "call .contiguous()"
        )


def _check_x(x) -> tuple[int, int]:
    _tensor("x", x, "(M, K)")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K) activations, got shape {_shape(x)}")
    if x.dtype not in _X_DTYPES:
        raise ValueError(f"x.dtype must be one of {[str(d) for d in _X_DTYPES]}, got {x.dtype}")
    m, k = x.shape
    if m == 0 or k == 0:
        raise ValueError(f"x must have at least one row and one column, got shape {tuple(x.shape)}")
    _contiguous("x", x)
    return m, k


def _check_params(name: str, t, shape: tuple, x: torch.Tensor) -> None:
    form = f"{shape} of torch.float32 or x's dtype {x.dtype}"
    _tensor(name, t, form)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype not in (torch.float32, x.dtype):
        raise ValueError(f"{name}.dtype must be torch.float32 or x's dtype {x.dtype}, got {t.dtype}")
    if t.device != x.device:
        raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
    _contiguous(name, t)


def _check_int8(x, q, scale) -> tuple[int, int, int]:
    m, k = _check_x(x)
    _tensor("q", q, "int8 (N, K)")
    if q.dim() != 2 or q.dtype != torch.int8:
        raise ValueError(f"q must be a 2-D int8 (N, K) tensor, got {q.dtype} {_shape(q)}")
    if q.shape[1] != k:
        raise ValueError(f"q must have x's K={k} columns: q is {tuple(q.shape)}, x is {tuple(x.shape)}")
    n = q.shape[0]
    if n == 0:
        raise ValueError("q must have at least one row (N >= 1)")
    if q.device != x.device:
        raise ValueError(f"q must be on x's device {x.device}, got {q.device}")
    _contiguous("q", q)
    _check_params("scale", scale, (n,), x)
    return m, n, k


def _check_group_size(group_size) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise ValueError(f"group_size must be an even int >= 2 (fast: one of {FAST_GROUP_SIZES}), got {group_size!r}")
    return group_size


def _check_int4(x, packed, scales, zeros, group_size) -> tuple[int, int, int]:
    m, k = _check_x(x)
    g = _check_group_size(group_size)
    if k % 2:
        raise ValueError(f"x must have an even K for int4 (two weights per byte), got K={k}")
    if k % g:
        raise ValueError(f"K={k} (x.shape[1]) must be a multiple of group_size={g}")
    _tensor("packed", packed, "uint8 (N, K/2)")
    if packed.dim() != 2 or packed.dtype != torch.uint8:
        raise ValueError(f"packed must be a 2-D uint8 (N, K/2) tensor, got {packed.dtype} {_shape(packed)}")
    if packed.shape[1] * 2 != k:
        raise ValueError(
            f"packed must have K/2={k // 2} columns for x's K={k}: packed is {tuple(packed.shape)}, "
            f"x is {tuple(x.shape)}"
        )
    n = packed.shape[0]
    if n == 0:
        raise ValueError("packed must have at least one row (N >= 1)")
    if packed.device != x.device:
        raise ValueError(f"packed must be on x's device {x.device}, got {packed.device}")
    _contiguous("packed", packed)
    _check_params("scales", scales, (n, k // g), x)
    _check_params("zeros", zeros, (n, k // g), x)
    return m, n, k


def _check_block(name: str, value, lo: int, hi: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or value > hi or value & (value - 1):
        raise ValueError(f"{name} must be None or a power of two between {lo} and {hi}, got {value!r}")
    return value


def _check_split(split_k) -> int | None:
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1):
        raise ValueError(f"split_k must be None (automatic) or a positive int, got {split_k!r}")
    return split_k


def resolve_path(path: str, device: torch.device, rows: int = 1) -> str:
    """'auto' → Triton on a CUDA tensor, or on a CPU tensor when the interpreter is on; torch otherwise.
    More than ``MAX_TRITON_ROWS`` rows (prefill) take the torch path, whatever ``path`` says."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "torch" or rows > MAX_TRITON_ROWS:
        return "torch"
    if path == "auto":
        runnable = device.type == "cuda" or (device.type == "cpu" and interpreter_on())
        return "triton" if HAS_TRITON and runnable else "torch"
    if not HAS_TRITON:
        raise RuntimeError("path='triton' but Triton is not installed; use path='torch'")
    if device.type == "cpu" and not interpreter_on():
        raise RuntimeError(
            "path='triton' on a CPU tensor needs TRITON_INTERPRET=1 set before Triton is imported (import course_lib first)"
        )
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"path='triton' needs a CUDA (or, interpreted, CPU) tensor, got device {device}")
    return "triton"


def _next_pow2(v: int) -> int:
    return 1 << (v - 1).bit_length()


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


GEMV_TILE = 4096  # weights per chunk on the GEMV path: BLOCK_N·BLOCK_K, 32 fp32 registers a thread at 4 warps


def _pow2_divisor(v: int) -> int:
    return v & -v


def _plan(m: int, n: int, k: int, device: torch.device, block_n, block_k, split_k, group_size=None) -> dict:
    """Tile sizes and grid; None picks. ``group_size``: None for int8, g for int4.

    GPU: the widest ``BLOCK_N`` in 64, 32, 16 giving at least ~1.5 programs per SM without a K split, but
    no narrower than 2·BLOCK_M on the tl.dot path (every program re-reads all of x from L2: narrow tiles
    re-read it too often). Only when N is still too small is K split, into splits of at least 4 chunks.
    Interpreter: BLOCK_N 64 and no split (fewer programs run faster there). ``BLOCK_K``: GEMV chunks of
    GEMV_TILE weights (at most 256 long); tl.dot chunks of 128; int4 chunks divide g when they can
    (one scale per row per chunk), else 128 with a per-byte scale gather."""
    use_dot = m > 1
    block_m = max(16, _next_pow2(m)) if use_dot else 1
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


def _output(x: torch.Tensor, m: int, n: int, split_k: int) -> torch.Tensor:
    if split_k == 1:
        return torch.empty((m, n), dtype=x.dtype, device=x.device)
    return torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)  # partial sums


def _finish(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return y if y.dim() == 2 else y.sum(dim=0).to(x.dtype)


def _precision(x: torch.Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"


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
    tune the Triton kernel; None picks them (see ``_plan``). Checks run first."""
    m, n, k = _check_int8(x, q, scale)
    block_n = _check_block("block_n", block_n, 16, 256)
    block_k = _check_block("block_k", block_k, 16, 512)
    split_k = _check_split(split_k)
    if resolve_path(path, x.device, m) == "torch":
        return int8_matmul_torch(x, q, scale)
    plan = _plan(m, n, k, x.device, block_n, block_k, split_k)
    grid = plan.pop("grid")
    y = _output(x, m, n, grid[1])
    _int8_matmul_kernel[grid](x, q, scale, y, m, n, k, DOT_PRECISION=_precision(x), num_warps=4, **plan)
    return _finish(y, x)


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
    ``split_k`` tune the Triton kernel; None picks them (see ``_plan``). Checks run first."""
    m, n, k = _check_int4(x, packed, scales, zeros, group_size)
    block_n = _check_block("block_n", block_n, 16, 256)
    block_k = _check_block("block_k", block_k, 32, 512)  # tl.dot needs BLOCK_K/2 >= 16
    split_k = _check_split(split_k)
    if resolve_path(path, x.device, m) == "torch":
        return int4_matmul_torch(x, packed, scales, zeros, group_size)
    plan = _plan(m, n, k, x.device, block_n, block_k, split_k, group_size)
    grid = plan.pop("grid")
    y = _output(x, m, n, grid[1])
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
        ONE_GROUP=group_size % plan["BLOCK_K"] == 0,
        DOT_PRECISION=_precision(x),
        num_warps=4,
        **plan,
    )
    return _finish(y, x)


# ----------------------------------------------------------------------------- 4. torch fallbacks
def int8_matmul_torch(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The torch path: the reference (dequantize to fp32, matmul). Correct everywhere; not bandwidth-saving."""
    return int8_matmul_ref(x, q, scale)


def int4_matmul_torch(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The torch path: the reference (unpack, dequantize to fp32, matmul)."""
    return int4_matmul_ref(x, packed, scales, zeros, group_size)


__all__ = [
    "FAST_GROUP_SIZES",
    "MAX_TRITON_ROWS",
    "PATHS",
    "dequantize_int4",
    "dequantize_int8",
    "int4_matmul",
    "int4_matmul_ref",
    "int4_matmul_torch",
    "int4_weight_bytes",
    "int8_matmul",
    "int8_matmul_ref",
    "int8_matmul_torch",
    "int8_weight_bytes",
    "pack_int4",
    "resolve_path",
    "unpack_int4",
]
