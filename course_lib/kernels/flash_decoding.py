"""Flash-Decoding (split-KV): one decode query against a long cache, the keys split into chunks done in parallel.

FlashAttention parallelises over batch × heads × *query* blocks. A decode step has one query row per head, so
at batch 1 it launches only B · heads programs: SmolLM2's 3 KV-head groups, or Llama-3-8B's 8, on a GPU with
132 SMs leaves almost every SM idle while the one busy program streams the whole cache. Flash-Decoding
(Dao, Haziza, Massa, Sizov, 2023) also splits the *key* length into S chunks: each program computes, for its
chunk, the normalised partial output o_s and its log-sum-exp ℓ_s = m_s + log Σ exp(score − m_s); a second,
tiny pass combines them exactly: o = Σ_s exp(ℓ_s − ℓ) · o_s with ℓ = log Σ_s exp(ℓ_s) (the online softmax's
rescale, done once across chunks). The step is bandwidth-bound (~1 FLOP per byte of K/V read), so what
splitting buys is SMs streaming at once: :func:`sm_fill` predicts the share busy as min(1, programs / SMs).

Parts, in order: torch reference (partials + combine), Triton kernel (partials; combine in torch), checked
launcher, torch fallback. Layout: q (B, H, d), k/v (B, Hkv, L, d) as the contiguous cache holds them.
Tests: tests/test_flash_decoding.py. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import math

import torch

from course_lib.kernels import HAS_TRITON  # imports course_lib first (TRITON_INTERPRET)
from course_lib.kernels.launch import next_pow2, require_tensor, resolve_path, shape_of

if HAS_TRITON:
    import triton
    import triton.language as tl

HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------- 1. reference
def split_kv_partials_ref(q, k, v, num_splits: int, scale: float | None = None):
    """Per chunk of ⌈L / S⌉ keys: normalised partial output (B, H, S, d) fp32 and log-sum-exp (B, H, S) fp32
    (−inf, with a zero output, for an empty chunk). Reads K and V once: 2·B·Hkv·L·d·elem bytes."""
    B, H, d = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    scale = d**-0.5 if scale is None else scale
    chunk = -(-L // num_splits)
    kk = k.float().repeat_interleave(H // Hkv, dim=1)  # (B, H, L, d)
    vv = v.float().repeat_interleave(H // Hkv, dim=1)
    o = torch.zeros(B, H, num_splits, d)
    lse = torch.full((B, H, num_splits), -math.inf)
    for s in range(num_splits):
        a, b = s * chunk, min((s + 1) * chunk, L)
        if a >= b:
            continue
        sc = torch.einsum("bhd,bhld->bhl", q.float(), kk[:, :, a:b]) * scale  # (B, H, n)
        lse[:, :, s] = torch.logsumexp(sc, dim=-1)
        o[:, :, s] = torch.einsum("bhl,bhld->bhd", torch.softmax(sc, dim=-1), vv[:, :, a:b])
    return o.to(q.device), lse.to(q.device)


def combine(o_parts: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Exact merge of the chunks: Σ_s exp(ℓ_s − max ℓ) · o_s / Σ_s exp(ℓ_s − max ℓ). (B, H, S, d) → (B, H, d)."""
    m = lse.amax(dim=-1, keepdim=True)  # (B, H, 1): finite, every row has at least one non-empty chunk
    w = torch.exp(lse - m)  # (B, H, S): 0 for empty chunks
    return (w[..., None] * o_parts).sum(-2) / w.sum(-1, keepdim=True)


def flash_decoding_ref(q, k, v, num_splits: int, scale: float | None = None) -> torch.Tensor:
    """Split-KV decode attention in torch: partials then combine; (B, H, d) in q's dtype."""
    return combine(*split_kv_partials_ref(q, k, v, num_splits, scale)).to(q.dtype)


def sm_fill(batch: int, kv_heads: int, num_splits: int, sms: int) -> float:
    """Predicted share of SMs busy: one program per (sequence, KV-head group, chunk), at most one wave."""
    return min(1.0, batch * kv_heads * num_splits / sms)


def splits_to_fill(batch: int, kv_heads: int, sms: int, length: int, min_chunk: int = 256) -> int:
    """The fewest splits that give every SM a program, but no chunk shorter than ``min_chunk`` keys."""
    need = -(-sms // max(1, batch * kv_heads))
    return max(1, min(need, length // min_chunk))


# ----------------------------------------------------------------------------- 2. Triton kernel
# Program (b, kvh, s) serves the GROUP = H / Hkv query heads of KV head kvh for keys [s·CHUNK, (s+1)·CHUNK) ∩ [0, L):
# an online softmax over BLOCK_N-key tiles (running max m, sum l, accumulator acc), then it writes acc / l and
# m + log l for the combine. Multiply + sum, not tl.dot: a decode step waits on memory, not on arithmetic.
if HAS_TRITON:

    @triton.jit
    def _split_kv_kernel(
        q_ptr,  # *T (B, H, HEAD_DIM) contiguous
        k_ptr,  # *T (B, Hkv, L, HEAD_DIM) contiguous
        v_ptr,  # *T (B, Hkv, L, HEAD_DIM) contiguous
        o_ptr,  # *fp32 (B, H, S, HEAD_DIM) partial outputs
        lse_ptr,  # *fp32 (B, H, S) partial log-sum-exp
        L,  # keys per sequence
        Hkv,  # KV heads
        S,  # splits
        CHUNK,  # keys per split
        scale,  # fp32 softmax scale
        GROUP: tl.constexpr,  # query heads per KV head
        GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two
        BLOCK_N: tl.constexpr,  # keys per tile
        HEAD_DIM: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        s = tl.program_id(2)
        offs_g = tl.arange(0, GROUP_PAD)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        mask_g = offs_g < GROUP
        heads = kvh * GROUP + offs_g  # (GROUP_PAD,)
        H = Hkv * GROUP
        q = tl.load(q_ptr + (b * H + heads[:, None]) * HEAD_DIM + offs_d[None, :], mask=mask_g[:, None], other=0.0)
        q = q.to(tl.float32)  # (GROUP_PAD, HEAD_DIM)
        base = (b * Hkv + kvh).to(tl.int64) * L * HEAD_DIM
        start = s * CHUNK
        stop = tl.minimum(start + CHUNK, L)
        m_i = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
        l_i = tl.zeros((GROUP_PAD,), tl.float32)
        acc = tl.zeros((GROUP_PAD, HEAD_DIM), tl.float32)
        for n0 in range(start, stop, BLOCK_N):
            mask_n = n0 + offs_n < stop  # (BLOCK_N,)
            offs = base + (n0 + offs_n[:, None]) * HEAD_DIM + offs_d[None, :]
            k = tl.load(k_ptr + offs, mask=mask_n[:, None], other=0.0).to(tl.float32)  # (BLOCK_N, HEAD_DIM)
            v = tl.load(v_ptr + offs, mask=mask_n[:, None], other=0.0).to(tl.float32)
            sc = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # (GROUP_PAD, BLOCK_N)
            sc = tl.where(mask_n[None, :], sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            p = tl.exp(sc - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
        live = l_i > 0  # an empty chunk (start >= L) keeps l = 0: lse −inf, output 0
        out = tl.where(live[:, None], acc / tl.where(live, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(live, m_i + tl.log(tl.where(live, l_i, 1.0)), float("-inf"))
        row = (b * H + heads) * S + s  # (GROUP_PAD,)
        tl.store(o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=mask_g[:, None])
        tl.store(lse_ptr + row, lse, mask=mask_g)


# ----------------------------------------------------------------------------- 3. launcher
def _check(q, k, v, num_splits) -> None:
    require_tensor("q", q, "(B, H, head_dim)")
    if q.dim() != 3 or q.dtype not in DTYPES or q.shape[2] not in HEAD_DIMS:
        raise ValueError(f"q must be (B, H, head_dim in {HEAD_DIMS}) of {DTYPES}, got {q.dtype} {shape_of(q)}")
    B, H, d = q.shape
    for name, t in (("k", k), ("v", v)):
        require_tensor(name, t, "(B, Hkv, L, head_dim)")
        if t.dim() != 4 or t.shape[0] != B or t.shape[3] != d or t.shape[2] < 1:
            raise ValueError(f"{name} must be (B={B}, Hkv, L >= 1, head_dim={d}), got {shape_of(t)}")
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must match q's dtype {q.dtype} and device {q.device}, got {t.dtype} {t.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {shape_of(k)} and {shape_of(v)}")
    if k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(f"query heads H={H} must be a multiple of the KV heads Hkv={k.shape[1]} (GQA)")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be an int >= 1, got {num_splits!r}")


def flash_decoding(q, k, v, num_splits: int, scale: float | None = None, path: str = "auto", block_n: int = 16):
    """Decode attention of q (B, H, d) over k/v (B, Hkv, L, d) with the keys in ``num_splits`` chunks.
    ``path``: "triton", "torch" (the reference) or "auto" (Triton where present)."""
    _check(q, k, v, num_splits)
    if resolve_path(path, q.device) == "torch":
        return flash_decoding_ref(q, k, v, num_splits, scale)
    B, H, d = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    chunk = -(-L // num_splits)
    o = torch.empty(B, H, num_splits, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(B, H, num_splits, device=q.device, dtype=torch.float32)
    group = H // Hkv
    _split_kv_kernel[(B, Hkv, num_splits)](
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        o,
        lse,
        L,
        Hkv,
        num_splits,
        chunk,
        d**-0.5 if scale is None else scale,
        GROUP=group,
        GROUP_PAD=next_pow2(group),
        BLOCK_N=block_n,
        HEAD_DIM=d,
    )
    return combine(o, lse).to(q.dtype)


def gpu_sms() -> dict[str, int]:
    """SM counts of the GPUs whose memory hierarchy data/gpu_specs.json lists (datasheet/whitepaper)."""
    import json

    from course_lib.core.paths import data_dir

    specs = json.loads((data_dir() / "gpu_specs.json").read_text())["gpus"]
    return {g["name"]: g["hierarchy"]["sms"] for g in specs if g.get("hierarchy", {}).get("sms")}
