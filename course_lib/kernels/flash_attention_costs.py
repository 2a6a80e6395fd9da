"""What attention costs, counted and measured: the FLOPs, the memory naive and tiled attention allocate,
and a probe that measures the peak memory of one call.

The counts are the predictions chapter 05 sets against measurements: naive attention allocates two fp32
(B, H, Tq, Tk) matrices (memory grows with T²), the flash kernel only its output (linear in T); both do
4·Tq·Tk·d FLOPs per head (causal: the visible pairs only), against O((Tq + Tk)·d) bytes of inputs, so
prefill attention is compute-bound once the scores stop travelling through memory. ``measure_peak_bytes``
measures the first claim on CUDA (allocator statistics) or on a Linux CPU (peak resident set).
Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from typing import Callable

import torch


def attention_flops(B: int, H: int, tq: int, tk: int, head_dim: int, causal: bool = True) -> float:
    """4·B·H·Tq·Tk·d (q kᵀ and p v, 2 FLOPs per multiply-add), halved-ish when causal: the visible pairs
    of an end-aligned mask are Tq·Tk − Tq·(Tq − 1)/2."""
    pairs = tq * tk - (tq * (tq - 1) / 2 if causal else 0)
    return 4.0 * B * H * pairs * head_dim


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
    return 2 * B * H * T * tk * 4 + (T * tk if causal else 0) + B * H * T * head_dim * dtype.itemsize


def flash_attention_bytes(
    B: int, H: int, T: int, dtype: torch.dtype = torch.float32, *, head_dim: int = 0, kv_len: int | None = None
) -> int:
    """Memory the flash kernel allocates beyond its inputs: the output (B, H, T, head_dim) only — linear in T.
    Its scores live in one fp32 (BLOCK_M, BLOCK_N) tile per program, in registers, never in memory.
    (``kv_len`` is accepted for symmetry with ``naive_attention_bytes``: the keys cost nothing extra.)"""
    return B * H * T * head_dim * dtype.itemsize


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
