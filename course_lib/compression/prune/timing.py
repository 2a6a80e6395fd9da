"""Does pruning pay on hardware? One decode-shaped product y = x Wᵀ timed in every weight format.

A decode step is bandwidth-bound: its time is the bytes of the weight format. A dense matrix with zeros
reads as many bytes as without them (the same time); CSR (values + int64 column indices) stores *more*
bytes than dense fp32 at 50% sparsity and runs a far less tuned kernel; 2:4 on sparse tensor cores reads
about half. ``dense_vs_sparse_time`` measures all of them with the course's one benchmark helper and
lists the format it cannot run here with its estimated bytes and the reason. Introduced in
03_compression.ipynb.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from course_lib.compression.checks import check_fraction, check_int
from course_lib.compression.prune.magnitude import keep_mask
from course_lib.compression.prune.two_four import (
    SemiStructuredLinear,
    semi_structured_shape_problem,
    sparse_kernel_problem,
    two_four_mask,
)
from course_lib.measure.bench import benchmark


def _sparse_bytes(t: torch.Tensor) -> int:
    parts = (t.values(), t.col_indices(), t.crow_indices())
    return sum(p.numel() * p.element_size() for p in parts)


@torch.no_grad()
def dense_vs_sparse_time(
    rows: int = 4096,
    cols: int = 4096,
    batches=(1,),
    sparsity: float = 0.5,
    *,
    device=None,
    dtype: torch.dtype | None = None,
    repeats: int | None = None,
    seed: int = 0,
) -> list[dict]:
    """Time one decode-shaped product y = x Wᵀ, x (batch, cols), W (rows, cols), in several formats:
    - ``dense``: the weight as it is;
    - ``dense, {sparsity:.0%} zeros``: the same kernel on W with that fraction of random zeros: the same
      time, since a dense kernel reads the zeros too;
    - ``CSR (torch.sparse)``: ``to_sparse_csr`` (values + int64 column indices + row pointers);
    - ``2:4 semi-structured``: run on a CUDA GPU of compute capability ≥ 8.0 with fp16/bf16 only;
      elsewhere listed with time NaN, its estimated bytes, and the reason in ``note``.
    Each row: format, device, dtype, batch, shape, density (fraction of nonzeros), bytes (the weight
    format's), time_s (median; NaN if the format failed on this machine), gbps (bytes / time), speedup
    (dense time / time), note (why it failed, else "")."""
    check_int("rows", rows, 1)
    check_int("cols", cols, 1)
    sparsity = check_fraction("sparsity", sparsity)
    if isinstance(batches, int):
        batches = (batches,)
    batches = tuple(batches)
    if not batches:
        raise ValueError("batches must hold at least one batch size")
    for b in batches:
        check_int("batch", b, 1)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device}")
    dtype = dtype or (torch.float16 if device.type == "cuda" else torch.float32)
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen).to(device, dtype)
    keep = keep_mask(torch.rand(rows, cols, generator=gen), round(sparsity * rows * cols)).to(device)
    w_zero = w.masked_fill(~keep, 0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        csr = w_zero.to_sparse_csr()
    dense_bytes = w.numel() * w.element_size()
    formats = [
        ("dense", w, lambda x, w=w: F.linear(x, w), dense_bytes, 1.0),
        (f"dense, {sparsity:.0%} zeros", w_zero, lambda x: F.linear(x, w_zero), dense_bytes, 1 - sparsity),
        ("CSR (torch.sparse)", csr, lambda x: torch.mm(csr, x.t()), _sparse_bytes(csr), 1 - sparsity),
    ]
    problem = sparse_kernel_problem(device, dtype) or semi_structured_shape_problem((rows, cols), dtype)
    if problem is None:
        w24 = w.masked_fill(~two_four_mask(w), 0)
        layer = SemiStructuredLinear(w24)
        formats.append(("2:4 semi-structured", w24, layer.forward, layer.nbytes, 0.5))
    else:  # listed, not run: the half-size values plus 1 bit of metadata per weight it would store
        formats.append(("2:4 semi-structured", None, problem, dense_bytes // 2 + w.numel() // 8, 0.5))
    out = []
    for b in batches:
        x = torch.randn(b, cols, generator=gen).to(device, dtype)
        dense_s = None
        for name, _, fn, nbytes, density in formats:
            note = ""
            if not callable(fn):
                t, note = float("nan"), f"not run: {fn}; bytes estimated"
            else:
                try:
                    t = benchmark(
                        lambda fn=fn: fn(x), bytes=nbytes, repeats=repeats, device=device.type, label=name, peaks=False
                    ).median_s
                except (RuntimeError, NotImplementedError) as err:  # a sparse op missing for this dtype/device
                    t, note = float("nan"), f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            dense_s = dense_s or t
            out.append(
                {
                    "format": name,
                    "device": device.type,
                    "dtype": str(dtype).removeprefix("torch."),
                    "batch": b,
                    "shape": (rows, cols),
                    "density": density,
                    "bytes": nbytes,
                    "time_s": t,
                    "gbps": nbytes / t / 1e9,
                    "speedup": dense_s / t,
                    "note": note,
                }
            )
    return out
