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

Parts, in order: the torch reference ``attention_naive``, the Triton kernel, the checked launcher
``flash_attention_fwd``, the torch fallback (SDPA). The online softmax of one row, spelled out:
``online_softmax``; FLOPs, memory formulas and a peak-memory probe: ``flash_attention_costs``. Tests:
tests/test_flash_attention.py. GPU timings: benchmarks/flash_attention_gpu.py.
Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.kernels import HAS_TRITON, launch  # imports course_lib first (TRITON_INTERPRET)
from course_lib.kernels.launch import check_block, dot_precision, next_pow2, shape_of

if HAS_TRITON:
    import triton
    import triton.language as tl

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_DIMS = (16, 32, 64, 128)  # tl.dot needs a power of two >= 16; 128 fills the registers of one program
LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e): exp2 is the fast hardware instruction
BF16_INTERPRETED = "bf16 is not supported by the Triton interpreter (its bf16 arithmetic is wrong); use fp16/fp32"


# ----------------------------------------------------------------------------- 1. reference
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
def _check(q, k, v, causal, kv_lens, check_head_dim: bool = True) -> None:
    """Every check, before any allocation: types, ranks, dtypes, devices, GQA, head_dim, lengths."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor (B, heads, T, head_dim), got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, heads, T, head_dim), got shape {shape_of(t)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name}.dtype must be one of {[str(d) for d in DTYPES]}, got {t.dtype}")
        if 0 in t.shape:
            raise ValueError(f"{name} must not be empty, got shape {shape_of(t)}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, Hkv, Tk, d), got {shape_of(k)} and {shape_of(v)}")
    b, h, tq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k/v must be (B={b}, Hkv, Tk, head_dim={d}) to match q {shape_of(q)}, got {shape_of(k)}")
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
                f"{getattr(kv_lens, 'dtype', type(kv_lens).__name__)} {shape_of(kv_lens)}"
            )
        if kv_lens.device != q.device:
            raise ValueError(f"kv_lens must be on q's device {q.device}, got {kv_lens.device}")
        lo_len, hi_len = int(kv_lens.min()), int(kv_lens.max())  # one device sync
        need = tq if causal else 1
        if lo_len < need or hi_len > tk:
            raise ValueError(
                f"kv_lens must lie in [{need}, Tk={tk}] (causal needs >= Tq keys), got [{lo_len}, {hi_len}]"
            )


def resolve_path(path: str, device: torch.device, dtype: torch.dtype) -> str:
    """'auto' → Triton on a CUDA tensor, or on a CPU tensor when the interpreter is on (not for bf16, whose
    arithmetic the interpreter gets wrong: auto takes torch there); torch otherwise."""
    return launch.resolve_path(path, device, interpreter_problem=BF16_INTERPRETED if dtype == torch.bfloat16 else None)


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
    block_m = block_m if fixed_m else max(16, min(bm, next_pow2(tq)))
    block_n = block_n if fixed_n else bn
    num_stages = 2 if dtype == torch.float32 else 3
    elem, limit = dtype.itemsize, _smem_limit(device)
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
    block_m = check_block("block_m", block_m, 16, 256)
    block_n = check_block("block_n", block_n, 16, 256)
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
        DOT_PRECISION=dot_precision(q.dtype),
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


__all__ = [
    "DTYPES",
    "HEAD_DIMS",
    "attention_naive",
    "flash_attention_fwd",
    "flash_attention_torch",
    "resolve_path",
    "smem_bytes",
]
