"""Paged-decode attention: one query token per sequence against K/V scattered over blocks of a shared pool.

A decode step reads every cached key and value of every sequence once and does ~2 FLOPs per element
read (q·k, then p·v): arithmetic intensity ~1 FLOP/byte, far below any ridge point, so it is
bandwidth-bound and its time is the KV bytes it streams. PagedAttention (Kwon et al., 2023) stores
those bytes in blocks of ``block_size`` token slots; sequence b's token t lives in block
``block_tables[b, t // block_size]`` at offset ``t % block_size``. The kernel follows the table
itself, so nothing is gathered into a contiguous copy first (that copy is what the torch path pays),
and it keeps a running max and sum (online softmax, as in FlashAttention) so the scores of a long
context never sit in memory at once. With grouped-query attention one program serves the
``H / Hkv`` query heads that share a KV head, so each K/V block is read once per group, not per head.

Layout (vLLM v1 / FlashAttention's paged layout): caches ``(num_blocks, block_size, kv_heads, head_dim)``,
block tables ``(B, max_blocks)`` int32, ``context_lens`` ``(B,)`` int32, all ≥ 1.

Parts, in order: torch reference, Triton kernel, checked launcher, torch fallback. Tests:
tests/test_paged.py. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.kernels import HAS_TRITON  # imports course_lib first (TRITON_INTERPRET)
from course_lib.kernels.launch import dot_precision, next_pow2, require_tensor, resolve_path, shape_of

if HAS_TRITON:
    import triton
    import triton.language as tl

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_DIMS = (16, 32, 64, 128, 256)  # powers of two: one tl.arange spans the head
MAX_BLOCK_SIZE = 256


# ----------------------------------------------------------------------------- 1. reference
def paged_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q·Kᵀ·scale)·V per sequence, spelled out: gather each sequence's K/V through its table, repeat
    the KV heads for GQA, softmax in fp32. q (B, H, d), caches (num_blocks, bs, Hkv, d) → (B, H, d) in q's dtype.

    Bytes of the fused kernel: 2·Σ_b L_b·Hkv·d·elem (K and V, once per KV head) + B·max_blocks·4 (tables)
    + 2·B·H·d·elem (q in, o out). This reference also writes and re-reads the gathered copy (and its GQA
    repeat). FLOPs: 4·Σ_b L_b·H·d."""
    B, H, d = q.shape
    bs, Hkv = k_cache.shape[1], k_cache.shape[2]
    scale = d**-0.5 if scale is None else scale
    out = torch.empty_like(q)
    for b in range(B):
        L = int(context_lens[b])
        blocks = block_tables[b, : -(-L // bs)].long()  # (nb,)
        k = k_cache[blocks].reshape(-1, Hkv, d)[:L].float()  # (L, Hkv, d)
        v = v_cache[blocks].reshape(-1, Hkv, d)[:L].float()
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)  # (L, H, d)
        s = torch.einsum("hd,lhd->hl", q[b].float(), k) * scale  # (H, L)
        out[b] = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), v).to(q.dtype)  # (H, d)
    return out


# ----------------------------------------------------------------------------- 2. Triton kernel
# Program (b, kvh) computes the GROUP = H / Hkv query heads kvh·GROUP … (kvh+1)·GROUP − 1 of sequence b.
# It walks the sequence's blocks in order; per block it loads a (BLOCK_SIZE, HEAD_DIM) tile of K and of V
# (the only big reads), scores the GROUP queries against it and folds the block into a running max m,
# running sum l and accumulator acc (online softmax): acc and l are rescaled by exp(m_old − m_new) when the
# max grows, so the result equals one softmax over the whole context. Two inner products:
# - USE_DOT (BLOCK_SIZE >= 16): tl.dot on a query tile padded to GROUP_PAD >= 16 rows (the padding
#   is free: the kernel waits on memory, not on the tensor cores), fp32 accumulator.
# - otherwise (blocks of 1..8 slots): broadcast multiply + sum on (GROUP_PAD, BLOCK_SIZE, HEAD_DIM).
if HAS_TRITON:

    @triton.jit
    def _paged_decode_kernel(
        q_ptr,  # *T (B, H, HEAD_DIM) queries, last dim contiguous
        k_ptr,  # *T (num_blocks, BLOCK_SIZE, Hkv, HEAD_DIM) key pool, last dim contiguous
        v_ptr,  # *T (num_blocks, BLOCK_SIZE, Hkv, HEAD_DIM) value pool, same strides as k
        bt_ptr,  # *int32 (B, max_blocks) block tables
        len_ptr,  # *int32 (B,) context lengths, >= 1
        o_ptr,  # *T (B, H, HEAD_DIM) output, contiguous
        stride_qb,  # q.stride(0)
        stride_qh,  # q.stride(1)
        stride_kb,  # k.stride(0): elements between blocks
        stride_kt,  # k.stride(1): elements between token slots of a block
        stride_kh,  # k.stride(2): elements between KV heads
        stride_btb,  # block_tables.stride(0)
        scale,  # fp32 softmax scale, usually HEAD_DIM ** -0.5
        GROUP: tl.constexpr,  # query heads per KV head (H / Hkv)
        GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two (>= 16 on the tl.dot path)
        BLOCK_SIZE: tl.constexpr,  # token slots per block, a power of two
        HEAD_DIM: tl.constexpr,  # a power of two in HEAD_DIMS
        USE_DOT: tl.constexpr,  # tl.dot (tensor cores) or multiply + sum
        DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 (no TF32 rounding), "tf32" (ignored) for fp16/bf16
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        offs_g = tl.arange(0, GROUP_PAD)  # (GROUP_PAD,) query heads of this group
        offs_t = tl.arange(0, BLOCK_SIZE)  # (BLOCK_SIZE,) slots of a block
        offs_d = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
        mask_g = offs_g < GROUP
        heads = kvh * GROUP + offs_g  # (GROUP_PAD,)
        q = tl.load(
            q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask_g[:, None],
            other=0.0,
        )  # (GROUP_PAD, HEAD_DIM)
        ctx = tl.load(len_ptr + b)
        m_i = tl.full((GROUP_PAD,), float("-inf"), tl.float32)  # running max of the scores
        l_i = tl.zeros((GROUP_PAD,), tl.float32)  # running sum of exp(score − m_i)
        acc = tl.zeros((GROUP_PAD, HEAD_DIM), tl.float32)  # running Σ exp(score − m_i) · v
        tile = offs_t[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :]  # (BLOCK_SIZE, HEAD_DIM) offsets
        for j in range(0, tl.cdiv(ctx, BLOCK_SIZE)):
            block = tl.load(bt_ptr + b.to(tl.int64) * stride_btb + j).to(tl.int64)  # physical block id
            mask_t = j * BLOCK_SIZE + offs_t < ctx  # (BLOCK_SIZE,) the last block is partly filled
            base = block * stride_kb
            k = tl.load(k_ptr + base + tile, mask=mask_t[:, None], other=0.0)  # (BLOCK_SIZE, HEAD_DIM)
            v = tl.load(v_ptr + base + tile, mask=mask_t[:, None], other=0.0)
            if USE_DOT:
                s = tl.dot(
                    q, tl.trans(k), input_precision=DOT_PRECISION, out_dtype=tl.float32
                )  # (GROUP_PAD, BLOCK_SIZE)
            else:
                s = tl.sum(q[:, None, :].to(tl.float32) * k[None, :, :].to(tl.float32), axis=2)
            s = tl.where(mask_t[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: block j holds at least one live token
            p = tl.exp(s - m_new[:, None])  # (GROUP_PAD, BLOCK_SIZE)
            alpha = tl.exp(m_i - m_new)  # (GROUP_PAD,) rescales what came before; 0 on the first block
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if USE_DOT:
                acc = acc * alpha[:, None] + tl.dot(
                    p.to(v.dtype), v, input_precision=DOT_PRECISION, out_dtype=tl.float32
                )
            else:
                acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :].to(tl.float32), axis=1)
            m_i = m_new
        out = acc / l_i[:, None]
        o_offs = (b.to(tl.int64) * GROUP * tl.num_programs(1) + heads[:, None]) * HEAD_DIM + offs_d[None, :]
        tl.store(o_ptr + o_offs, out.to(o_ptr.dtype.element_ty), mask=mask_g[:, None])


# ----------------------------------------------------------------------------- 3. launcher
def _check(
    q, k_cache, v_cache, block_tables, context_lens, check_values: bool = True
) -> tuple[int, int, int, int, int]:
    """Shapes, dtypes, strides, devices and values; returns (B, H, Hkv, d, block_size)."""
    require_tensor("q", q, "(B, H, head_dim)")
    if q.dim() != 3 or q.dtype not in DTYPES:
        raise ValueError(
            f"q must be a 3-D (B, H, head_dim) tensor of {[str(t) for t in DTYPES]}, got {q.dtype} {shape_of(q)}"
        )
    B, H, d = q.shape
    if B == 0:
        raise ValueError("q must hold at least one sequence (B >= 1)")
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {d}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        require_tensor(name, c, "(num_blocks, block_size, kv_heads, head_dim)")
        if c.dim() != 4 or c.shape[3] != d:
            raise ValueError(
                f"{name} must be (num_blocks, block_size, kv_heads, head_dim={d}), got shape {shape_of(c)}"
            )
        if c.dtype != q.dtype:
            raise ValueError(f"{name}.dtype must be q's dtype {q.dtype}, got {c.dtype}")
        if c.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {c.device}")
        if c.stride(3) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension, got strides {c.stride()}")
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(
            f"k_cache and v_cache must have the same shape and strides, got {shape_of(k_cache)} {k_cache.stride()} "
            f"and {shape_of(v_cache)} {v_cache.stride()}"
        )
    num_blocks, bs, Hkv = k_cache.shape[:3]
    if bs & (bs - 1) or bs > MAX_BLOCK_SIZE:
        raise ValueError(f"block_size (k_cache.shape[1]) must be a power of two <= {MAX_BLOCK_SIZE}, got {bs}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"query heads H={H} must be a multiple of the KV heads Hkv={Hkv} (GQA)")
    if q.stride(2) != 1:
        raise ValueError(f"q must have a contiguous last dimension, got strides {q.stride()}")
    require_tensor("block_tables", block_tables, "int32 (B, max_blocks)")
    if block_tables.dim() != 2 or block_tables.shape[0] != B or block_tables.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"block_tables must be an int32 (B={B}, max_blocks) tensor, got {block_tables.dtype} {shape_of(block_tables)}"
        )
    require_tensor("context_lens", context_lens, "int32 (B,)")
    if context_lens.shape != (B,) or context_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"context_lens must be an int32 (B={B},) tensor, got {context_lens.dtype} {shape_of(context_lens)}"
        )
    for name, t in (("block_tables", block_tables), ("context_lens", context_lens)):
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if not check_values:
        return B, H, Hkv, d, bs
    lens = context_lens.tolist()  # one small device→host copy: wrong lengths would read out of bounds
    max_blocks = block_tables.shape[1]
    if min(lens) < 1 or max(lens) > max_blocks * bs:
        raise ValueError(
            f"context_lens must lie in [1, max_blocks·block_size = {max_blocks * bs}], got [{min(lens)}, {max(lens)}]"
        )
    live = torch.arange(max_blocks, device=q.device)[None, :] < (context_lens[:, None] + bs - 1) // bs
    used = block_tables[live]  # the table entries the kernel will follow
    if int(used.min()) < 0 or int(used.max()) >= num_blocks:
        raise ValueError(f"block_tables must name blocks in [0, {num_blocks}) within each context length")
    return B, H, Hkv, d, bs


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float | None = None,
    path: str = "auto",
    check_values: bool = True,
) -> torch.Tensor:
    """Attention of one query per sequence over its paged K/V: q (B, H, d); caches (num_blocks, bs, Hkv, d)
    of q's dtype (fp32/fp16/bf16), bs a power of two, d in ``HEAD_DIMS``, H a multiple of Hkv;
    block_tables (B, max_blocks) int32; context_lens (B,) ≥ 1 → (B, H, d) in q's dtype, fp32 softmax.
    ``path``: 'auto' (Triton on CUDA or under the interpreter, else torch), 'triton' or 'torch'. Checks run first;
    ``check_values=False`` skips those that read lengths and table entries (a device→host copy), for callers
    whose tables are valid by construction (``PagedBackend``, once per layer)."""
    B, H, Hkv, d, bs = _check(q, k_cache, v_cache, block_tables, context_lens, check_values)
    scale = d**-0.5 if scale is None else float(scale)
    if resolve_path(path, q.device) == "torch":
        return paged_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale)
    group = H // Hkv
    use_dot = bs >= 16  # tl.dot needs every tile side >= 16 (the interpreter runs it too, so tests cover it)
    group_pad = max(16, next_pow2(group)) if use_dot else next_pow2(group)
    out = torch.empty((B, H, d), dtype=q.dtype, device=q.device)
    tables = block_tables.to(torch.int32).contiguous()
    _paged_decode_kernel[(B, Hkv)](
        q,
        k_cache,
        v_cache,
        tables,
        context_lens.to(torch.int32).contiguous(),
        out,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        tables.stride(0),
        scale,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_SIZE=bs,
        HEAD_DIM=d,
        USE_DOT=use_dot,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=4,
    )
    return out


# ----------------------------------------------------------------------------- 4. torch fallback
paged_decode_torch = paged_decode_ref  # the torch path is the reference: a gather per sequence, then plain attention

__all__ = ["DTYPES", "HEAD_DIMS", "MAX_BLOCK_SIZE", "paged_decode", "paged_decode_ref", "paged_decode_torch"]
