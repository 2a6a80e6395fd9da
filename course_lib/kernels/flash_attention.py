"""FlashAttention forward: softmax(q kᵀ · scale + mask) v without ever writing the score matrix to memory.

Naive attention materialises the (Tq, Tk) scores of every head, reads them back for the softmax and
again for the product with V: its memory and its traffic grow with T². FlashAttention (Dao et al., 2022)
tiles queries into blocks of BLOCK_M rows and streams keys and values in blocks of BLOCK_N; each
program keeps its (BLOCK_M, BLOCK_N) scores in registers and folds them into a running max ``m``, a
running sum ``l`` and a running output ``acc`` (the *online softmax*), rescaling the old ``acc`` when
the max grows. Traffic falls to reading q, k, v once per query block and writing o once; memory for the
scores falls to zero. Prefill attention is then compute-bound (4·Tq·Tk·d FLOPs per head against
O((Tq + Tk)·d) bytes); decode (Tq = 1) stays bandwidth-bound on the KV cache, and one query block per
head leaves most of a GPU idle there (flash-decoding splits the keys; not done here).

Parts, in order: torch references (``online_softmax_steps``, ``attention_naive``, the byte formulas and
a peak-memory probe), the Triton kernel, the checked launcher ``flash_attention_fwd``, the torch fallback
(SDPA). Tests: tests/test_flash_attention.py. GPU timings: benchmarks/flash_attention_gpu.py.
Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from typing import Callable

import torch
import torch.nn.functional as F

from course_lib.kernels import HAS_TRITON, interpreter_on  # imports course_lib first (TRITON_INTERPRET)

if HAS_TRITON:
    import triton
    import triton.language as tl

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_DIMS = (16, 32, 64, 128)  # tl.dot needs a power of two >= 16; 128 fills the registers of one program
PATHS = ("auto", "triton", "torch")
LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e): exp2 is the fast hardware instruction


# ----------------------------------------------------------------------------- 1. references
def online_softmax_steps(scores_row: torch.Tensor, block: int, values: torch.Tensor | None = None) -> list[dict]:
    """The online softmax of one query row, one key block at a time; returns every intermediate state.

    ``scores_row`` (Tk,) are the scaled scores q·kⱼ of one query; ``values`` (Tk, d) its V (None: the
    identity, so the final output *is* softmax(scores_row)). After block j the state holds
    ``m`` = max of the scores seen, ``l`` = Σ exp(s − m) over them, ``acc`` = Σ exp(s − m)·v over them and
    ``alpha`` = exp(m_old − m), the factor that rescaled the old l and acc when the max grew. The last
    state's ``out`` = acc / l equals softmax(scores_row) · values exactly (up to rounding): that is the whole
    trick of FlashAttention, done here in plain torch, fp64, for one row. Introduced in 05_attention_kv_cache.ipynb.
    """
    if not isinstance(scores_row, torch.Tensor) or scores_row.dim() != 1 or scores_row.numel() == 0:
        raise ValueError(
            f"scores_row must be a non-empty 1-D tensor (Tk,), got {tuple(getattr(scores_row, 'shape', ()))}"
        )
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    s = scores_row.detach().to(torch.float64)
    tk = s.shape[0]
    v = torch.eye(tk, dtype=torch.float64) if values is None else values.detach().to(torch.float64)  # (Tk, d)
    if v.dim() != 2 or v.shape[0] != tk:
        raise ValueError(f"values must be (Tk={tk}, d), got {tuple(v.shape)}")
    m = torch.tensor(float("-inf"), dtype=torch.float64)
    total = torch.tensor(0.0, dtype=torch.float64)  # l
    acc = torch.zeros(v.shape[1], dtype=torch.float64)  # (d,)
    states = []
    for j, lo in enumerate(range(0, tk, block)):
        sj, vj = s[lo : lo + block], v[lo : lo + block]  # (n,), (n, d)
        m_new = torch.maximum(m, sj.max())
        alpha = torch.exp(m - m_new)  # 0 on the first block (m = −inf)
        p = torch.exp(sj - m_new)  # (n,) unnormalised probabilities of this block
        total = total * alpha + p.sum()
        acc = acc * alpha + p @ vj  # (d,)
        m = m_new
        states.append(
            dict(
                block=j,
                keys=(lo, lo + sj.shape[0]),
                m=float(m),
                l=float(total),
                alpha=float(alpha),
                acc=acc.clone(),
                out=acc / total,
            )
        )
    return states


def _visible(tq: int, tk: int, causal: bool, kv_lens: torch.Tensor | None, device) -> torch.Tensor | None:
    """(B or 1, 1, Tq, Tk) bool, True where query i may see key j; None when every key is visible.

    Causal masks are aligned to the END of the keys: query i sits at position len − Tq + i and sees keys ≤
    that (decode: Tq = 1 sees everything; a chunk after len − Tq cached tokens sees its prefix and itself)."""
    if not causal and kv_lens is None:
        return None
    lens = torch.tensor([tk], device=device) if kv_lens is None else kv_lens.to(device=device, dtype=torch.int64)
    key = torch.arange(tk, device=device)[None, None, :]  # (1, 1, Tk)
    mask = key < lens[:, None, None]  # (B, 1, Tk)
    if causal:
        q_pos = lens[:, None] - tq + torch.arange(tq, device=device)[None, :]  # (B, Tq) absolute positions
        mask = mask & (key <= q_pos[:, :, None])  # (B, Tq, Tk)
    return mask[:, None].expand(-1, 1, tq, tk)  # (B, 1, Tq, Tk)


def attention_naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, sm_scale: float | None = None
) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v with the whole score matrix in memory: the reference to match.

    q (B, H, Tq, d), k/v (B, Hkv, Tk, d), H a multiple of Hkv (GQA); causal aligned to the end of the keys.
    Computes in fp32, returns q's dtype. Bytes: reads q, k, v, writes o — and holds two fp32 (B, H, Tq, Tk)
    matrices (scores, then probabilities) and a (Tq, Tk) bool mask at its peak: ``naive_attention_bytes``."""
    _check(q, k, v, causal, None, check_head_dim=False)
    b, h, tq, d = q.shape
    tk, group = k.shape[2], h // k.shape[1]
    scale = d**-0.5 if sm_scale is None else sm_scale
    mask = _visible(tq, tk, causal, None, q.device)  # (1, 1, Tq, Tk) bool, built first: its temporaries go
    hidden = None if mask is None else ~mask  # True where a key is masked out
    del mask
    kf = k.float().repeat_interleave(group, dim=1)  # (B, H, Tk, d)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = (q.float() * scale) @ kf.transpose(-1, -2)  # (B, H, Tq, Tk): the T² matrix flash never writes
    if hidden is not None:
        scores.masked_fill_(hidden, float("-inf"))  # in place: no second copy
    return (torch.softmax(scores, dim=-1) @ vf).to(q.dtype)  # (B, H, Tq, d); softmax is the second T² matrix


def _elem(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def naive_attention_bytes(
    B: int,
    H: int,
    T: int,
    dtype: torch.dtype = torch.float32,
    *,
    head_dim: int = 0,
    kv_len: int | None = None,
    causal: bool = False,
) -> int:
    """Memory ``attention_naive`` allocates beyond its inputs at its peak: two fp32 (B, H, T, Tk) matrices
    (scores and probabilities), a (T, Tk) bool mask when causal, and the output (B, H, T, head_dim) in
    ``dtype``. Grows with T²; for fp16/bf16 inputs add O(T·d) fp32 copies of q, k, v. ``kv_len``: Tk,
    default T (prefill)."""
    tk = T if kv_len is None else kv_len
    return 2 * B * H * T * tk * 4 + (T * tk if causal else 0) + B * H * T * head_dim * _elem(dtype)


def flash_attention_bytes(
    B: int, H: int, T: int, dtype: torch.dtype = torch.float32, *, head_dim: int = 0, kv_len: int | None = None
) -> int:
    """Memory the flash kernel allocates beyond its inputs: the output (B, H, T, head_dim) only — linear in T.
    Its scores live in one fp32 (BLOCK_M, BLOCK_N) tile per program, in registers, never in memory.
    (``kv_len`` is accepted for symmetry with ``naive_attention_bytes``: the keys cost nothing extra.)"""
    return B * H * T * head_dim * _elem(dtype)


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _malloc_trim() -> None:
    """glibc's malloc_trim(0): return free heap memory to the OS (a no-op where there is no glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure_peak_bytes(fn: Callable[[], object], device: str | torch.device = "cpu") -> tuple[object, int]:
    """Run ``fn()`` once; return (its result, the peak memory it added above what was in use before).

    CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` — exact, tensors only.
    CPU (Linux): the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) minus the
    resident set before the call (after ``malloc_trim``, so freed heap pages are not silently reused): real
    memory, so it includes allocator and page-size slack (~MBs) and counts only pages actually written;
    meaningful when the tensors are tens of MB. Run it in fp32 on the
    torch paths (``attention_naive`` vs ``flash_attention_fwd(path='torch')``, whose CPU SDPA kernel is itself
    tiled): the Triton interpreter's NumPy buffers are not what a GPU would allocate."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        return out, torch.cuda.max_memory_allocated(device) - before
    if device.type != "cpu" or not sys.platform.startswith("linux"):
        raise RuntimeError(f"measure_peak_bytes works on CUDA, or on a Linux CPU; got {device} on {sys.platform}")
    gc.collect()
    _malloc_trim()  # hand freed heap pages back first, or the call could reuse them without the RSS growing
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    before = _proc_status("VmRSS")
    out = fn()
    return out, max(0, _proc_status("VmHWM") - before)


# ----------------------------------------------------------------------------- 2. Triton kernel
# Program (pid_m, pid_bh) computes o[b, h, pid_m·BLOCK_M : +BLOCK_M, :] over the keys of KV head
# h // GROUP, in two loops: first the key blocks every row of the tile sees whole (no mask: loads stay
# vectorised, no compare/select), then the few blocks that cut the causal diagonal or run past the last
# key (masked). Key blocks wholly above the diagonal are never visited (causal skips ~half the work).
if HAS_TRITON:

    @triton.jit
    def _attn_blocks(
        acc,  # (BLOCK_M, HEAD_DIM) fp32 running output Σ exp2(s − m)·v
        l_i,  # (BLOCK_M,) fp32 running sum Σ exp2(s − m)
        m_i,  # (BLOCK_M,) fp32 running max of the scores (log2 units)
        q,  # (BLOCK_M, HEAD_DIM) query tile, input dtype
        k_base,  # *T keys of this (b, kv head)
        v_base,  # *T values of this (b, kv head)
        stride_kn,  # key-position stride of K
        stride_kd,  # feature stride of K
        stride_vn,
        stride_vd,
        offs_d,  # (HEAD_DIM,) feature offsets
        q_pos,  # (BLOCK_M,) absolute position of each query row (causal masking)
        lo,  # first key of the range, a multiple of BLOCK_N
        hi,  # one past the last key of the range
        kv_len,  # keys of this sequence: those at >= kv_len are padding
        qk_scale,  # sm_scale · log2(e)
        BLOCK_N: tl.constexpr,  # keys per block
        MASK: tl.constexpr,  # mask keys >= kv_len (and the causal diagonal when CAUSAL)
        CAUSAL: tl.constexpr,
        DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 (no TF32 rounding), "tf32" (ignored) for fp16/bf16
    ):
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
            kt_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd  # (HEAD_DIM, BLOCK_N): Kᵀ
            v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd  # (BLOCK_N, HEAD_DIM)
            if MASK:
                in_seq = offs_n < kv_len  # (BLOCK_N,)
                kt = tl.load(kt_ptrs, mask=in_seq[None, :], other=0.0)
                v = tl.load(v_ptrs, mask=in_seq[:, None], other=0.0)
            else:
                kt = tl.load(kt_ptrs)
                v = tl.load(v_ptrs)
            s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N) fp32, log2 units
            if MASK:
                seen = in_seq[None, :]  # (1, BLOCK_N)
                if CAUSAL:
                    seen = seen & (offs_n[None, :] <= q_pos[:, None])  # (BLOCK_M, BLOCK_N)
                s = tl.where(seen, s, float("-inf"))
            # every row sees >= 1 key in the first block it visits, so m_new is finite and nothing is NaN
            m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
            alpha = tl.math.exp2(m_i - m_new)  # rescales the old sums; 0 on the first block (m_i = −inf)
            p = tl.math.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N) unnormalised probabilities
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
            m_i = m_new
        return acc, l_i, m_i

    @triton.jit
    def _flash_fwd_kernel(
        q_ptr,  # *T (B, H, Tq, d) queries, any strides
        k_ptr,  # *T (B, Hkv, Tk, d) keys
        v_ptr,  # *T (B, Hkv, Tk, d) values
        o_ptr,  # *T (B, H, Tq, d) output
        lens_ptr,  # *int32 (B,) keys per sequence when HAS_LENS (else unused)
        stride_qb,
        stride_qh,
        stride_qt,
        stride_qd,
        stride_kb,
        stride_kh,
        stride_kn,
        stride_kd,
        stride_vb,
        stride_vh,
        stride_vn,
        stride_vd,
        stride_ob,
        stride_oh,
        stride_ot,
        stride_od,
        H,  # int32: query heads
        GROUP,  # int32: query heads per KV head (H // Hkv)
        Tq,  # int32: queries per sequence
        Tk,  # int32: keys per sequence (the K/V tensors' length; kv_lens may shorten it per sequence)
        qk_scale,  # fp32: sm_scale · log2(e)
        HEAD_DIM: tl.constexpr,  # d, one of 16, 32, 64, 128
        BLOCK_M: tl.constexpr,  # queries per program, power of two >= 16
        BLOCK_N: tl.constexpr,  # keys per block, power of two >= 16
        CAUSAL: tl.constexpr,  # causal mask aligned to the end of the keys
        HAS_LENS: tl.constexpr,  # per-sequence key counts in lens_ptr
        DOT_PRECISION: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = (pid_bh // H).to(tl.int64)  # int64: b · stride may pass 2**31 in a large KV cache
        h = pid_bh % H
        kvh = (h // GROUP).to(tl.int64)  # GQA: GROUP query heads share this KV head
        h = h.to(tl.int64)
        kv_len = Tk
        if HAS_LENS:
            kv_len = tl.load(lens_ptr + b).to(tl.int32)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query rows
        offs_d = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
        row_ok = offs_m < Tq
        q_ptrs = q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)  # (BLOCK_M, HEAD_DIM), stays in registers
        k_base = k_ptr + b * stride_kb + kvh * stride_kh
        v_base = v_ptr + b * stride_vb + kvh * stride_vh
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
        if CAUSAL:
            start = kv_len - Tq  # keys cached before the first query: query i sits at position start + i
            q_pos = start + offs_m  # (BLOCK_M,)
            m_lo = pid_m * BLOCK_M
            whole = ((start + m_lo) // BLOCK_N) * BLOCK_N  # keys < whole: seen by every row of the tile
            hi = tl.minimum(kv_len, start + tl.minimum(Tq, m_lo + BLOCK_M))  # past the last row's position
        else:
            q_pos = offs_m  # unused
            whole = (kv_len // BLOCK_N) * BLOCK_N  # full key blocks
            hi = kv_len
        acc, l_i, m_i = _attn_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_d, q_pos,
            0, whole, kv_len, qk_scale, BLOCK_N, False, CAUSAL, DOT_PRECISION,
        )  # fmt: skip
        acc, l_i, m_i = _attn_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_d, q_pos,
            whole, hi, kv_len, qk_scale, BLOCK_N, True, CAUSAL, DOT_PRECISION,
        )  # fmt: skip
        out = acc / l_i[:, None]  # (BLOCK_M, HEAD_DIM): the one normalisation, after all keys
        o_ptrs = o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------- 3. launcher
def _shape(t) -> tuple:
    return tuple(getattr(t, "shape", ()))


def _check(q, k, v, causal, kv_lens, check_head_dim: bool = True) -> None:
    """Every check, before any allocation: types, ranks, dtypes, devices, GQA, head_dim, lengths."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor (B, heads, T, head_dim), got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, heads, T, head_dim), got shape {_shape(t)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name}.dtype must be one of {[str(d) for d in DTYPES]}, got {t.dtype}")
        if 0 in t.shape:
            raise ValueError(f"{name} must not be empty, got shape {_shape(t)}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, Hkv, Tk, d), got {_shape(k)} and {_shape(v)}")
    b, h, tq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k/v must be (B={b}, Hkv, Tk, head_dim={d}) to match q {_shape(q)}, got {_shape(k)}")
    if h % k.shape[1]:
        raise ValueError(f"query heads H={h} must be a multiple of KV heads Hkv={k.shape[1]} (GQA)")
    if check_head_dim and d not in HEAD_DIMS:
        raise ValueError(f"head_dim={d} is not supported: the flash kernel handles head_dim in {HEAD_DIMS}")
    tk = k.shape[2]
    if causal and tq > tk:
        raise ValueError(
            f"causal attention needs Tq <= Tk (queries are the LAST Tq of the Tk positions), got Tq={tq}, Tk={tk}"
        )
    if kv_lens is not None:
        if (
            not isinstance(kv_lens, torch.Tensor)
            or kv_lens.shape != (b,)
            or kv_lens.dtype not in (torch.int32, torch.int64)
        ):
            raise ValueError(
                f"kv_lens must be an int32/int64 tensor of shape (B={b},), got "
                f"{getattr(kv_lens, 'dtype', type(kv_lens).__name__)} {_shape(kv_lens)}"
            )
        if kv_lens.device != q.device:
            raise ValueError(f"kv_lens must be on q's device {q.device}, got {kv_lens.device}")
        lo_len, hi_len = int(kv_lens.min()), int(kv_lens.max())  # one device sync
        need = tq if causal else 1
        if lo_len < need or hi_len > tk:
            raise ValueError(
                f"kv_lens must lie in [{need}, Tk={tk}] (causal needs >= Tq keys), got [{lo_len}, {hi_len}]"
            )


def _check_block(name: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value > 256 or value & (value - 1):
        raise ValueError(f"{name} must be None or a power of two between 16 and 256, got {value!r}")
    return value


def resolve_path(path: str, device: torch.device, dtype: torch.dtype) -> str:
    """'auto' → Triton on a CUDA tensor, or on a CPU tensor when the interpreter is on (not for bf16, whose
    arithmetic the interpreter gets wrong: auto takes torch there); torch otherwise."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "torch":
        return "torch"
    interpreted = device.type == "cpu" and interpreter_on()
    if path == "auto":
        runnable = device.type == "cuda" or (interpreted and dtype != torch.bfloat16)
        return "triton" if HAS_TRITON and runnable else "torch"
    if not HAS_TRITON:
        raise RuntimeError("path='triton' but Triton is not installed; use path='torch'")
    if device.type == "cpu" and not interpreter_on():
        raise RuntimeError(
            "path='triton' on a CPU tensor needs TRITON_INTERPRET=1 set before Triton is imported (import course_lib first)"
        )
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"path='triton' needs a CUDA (or, interpreted, CPU) tensor, got device {device}")
    if interpreted and dtype == torch.bfloat16:
        raise ValueError(
            "bf16 is not supported by the Triton interpreter (its bf16 arithmetic is wrong); use fp16/fp32"
        )
    return "triton"


def _next_pow2(v: int) -> int:
    return 1 << max(0, v - 1).bit_length()


def _smem_limit(device: torch.device) -> int:
    """Shared memory one program may use on this GPU (H100/H200: 227 KiB; T4: 64 KiB)."""
    if device.type != "cuda":
        return 1 << 30
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024)


def smem_bytes(block_m: int, block_n: int, d: int, elem: int, num_stages: int) -> int:
    """Shared memory of one program, estimated: the q tile, ``num_stages`` buffered K and V tiles, and p."""
    return elem * (block_m * d + num_stages * 2 * block_n * d + block_m * block_n)


def _plan(tq: int, d: int, dtype: torch.dtype, device: torch.device, block_m, block_n) -> dict:
    """Tiles and launch options; None picks. GPU: 128×64 tiles for fp16/bf16 (8 warps at d = 128), 64×32 for
    fp32 (twice the bytes per element); a short query block (decode, small chunks) shrinks BLOCK_M to cover
    Tq, no smaller than 16 (tl.dot). Then fewer pipeline stages, and smaller tiles not given by the caller,
    until the estimate fits the GPU's shared memory (a T4 has 64 KiB, an H100 227 KiB). Interpreter: up to
    64×64 tiles (fewer, larger NumPy ops run faster)."""
    gpu = device.type == "cuda"
    bm, bn = ((64, 32) if dtype == torch.float32 else (128, 64)) if gpu else (64, 64)
    fixed_m, fixed_n = block_m is not None, block_n is not None
    block_m = block_m if fixed_m else max(16, min(bm, _next_pow2(tq)))
    block_n = block_n if fixed_n else bn
    num_stages = 2 if dtype == torch.float32 else 3
    elem, limit = _elem(dtype), _smem_limit(device)
    while smem_bytes(block_m, block_n, d, elem, num_stages) > limit:
        if num_stages > 1:
            num_stages -= 1
        elif not fixed_n and block_n > 16 and block_n >= block_m // 2:
            block_n //= 2
        elif not fixed_m and block_m > 16:
            block_m //= 2
        else:
            break  # the caller's tiles: let Triton report what does not fit
    num_warps = 8 if (gpu and d == 128 and block_m >= 128) else 4
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages)


def flash_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    sm_scale: float | None = None,
    *,
    kv_lens: torch.Tensor | None = None,
    path: str = "auto",
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · sm_scale + mask) v, tiled: q (B, H, Tq, d), k/v (B, Hkv, Tk, d) → (B, H, Tq, d) in q's dtype.

    GQA: H a multiple of Hkv, query head h reads KV head h // (H/Hkv). ``causal``: aligned to the END of the
    keys (query i at position Tk − Tq + i sees keys ≤ it; Tq = 1 decode sees all). ``sm_scale``: default
    1/√d. ``kv_lens`` (B,) int: sequence b has only its first kv_lens[b] keys (a padded batch of cached
    sequences; checking its range costs one device sync); causal then aligns to kv_lens[b]. head_dim in
    (16, 32, 64, 128); fp32/fp16/bf16, fp32 accumulation; any strides. ``path``: 'auto', 'triton' or 'torch' (SDPA); bf16 under the interpreter
    takes torch on 'auto' and raises on 'triton'. ``block_m``/``block_n`` (16..256) override the tiles.
    Checks run first, before any allocation."""
    _check(q, k, v, causal, kv_lens)
    block_m = _check_block("block_m", block_m)
    block_n = _check_block("block_n", block_n)
    if sm_scale is not None and (isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or sm_scale <= 0):
        raise ValueError(f"sm_scale must be None or a positive number, got {sm_scale!r}")
    scale = q.shape[-1] ** -0.5 if sm_scale is None else float(sm_scale)
    if resolve_path(path, q.device, q.dtype) == "torch":
        return flash_attention_torch(q, k, v, causal, scale, kv_lens=kv_lens)
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    plan = _plan(tq, d, q.dtype, q.device, block_m, block_n)
    o = torch.empty((b, h, tq, d), dtype=q.dtype, device=q.device)  # (B, H, Tq, d)
    lens = kv_lens.to(torch.int32) if kv_lens is not None else o  # o: a placeholder pointer, never read
    grid = (triton.cdiv(tq, plan["BLOCK_M"]), b * h)
    _flash_fwd_kernel[grid](
        q, k, v, o, lens,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        h, h // hkv, tq, tk, scale * LOG2E,
        HEAD_DIM=d, CAUSAL=causal, HAS_LENS=kv_lens is not None,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **plan,
    )  # fmt: skip
    return o


# ----------------------------------------------------------------------------- 4. torch fallback
def flash_attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    sm_scale: float | None = None,
    *,
    kv_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The torch path: ``F.scaled_dot_product_attention`` with the same end-aligned causal mask and GQA.
    (SDPA's own ``is_causal`` aligns to the START of the keys, so Tq < Tk gets an explicit mask.)"""
    tq, tk = q.shape[2], k.shape[2]
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    is_causal = causal and tq == tk and kv_lens is None
    mask = None if is_causal else _visible(tq, tk, causal, kv_lens, q.device)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        try:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
            )
        except TypeError:  # torch < 2.5: no enable_gqa
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, Tk, d)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)


def attention_flops(B: int, H: int, tq: int, tk: int, head_dim: int, causal: bool = True) -> float:
    """4·B·H·Tq·Tk·d (q kᵀ and p v, 2 FLOPs per multiply-add), halved-ish when causal: the visible pairs
    of an end-aligned mask are Tq·Tk − Tq·(Tq − 1)/2."""
    pairs = tq * tk - (tq * (tq - 1) / 2 if causal else 0)
    return 4.0 * B * H * pairs * head_dim


__all__ = [
    "DTYPES",
    "HEAD_DIMS",
    "PATHS",
    "attention_flops",
    "attention_naive",
    "flash_attention_bytes",
    "flash_attention_fwd",
    "flash_attention_torch",
    "measure_peak_bytes",
    "naive_attention_bytes",
    "online_softmax_steps",
    "resolve_path",
    "smem_bytes",
]
