"""What the GPU kernel benchmarks share (benchmarks/flash_attention_gpu.py, benchmarks/quant_kernels_gpu.py).

Each times a Triton kernel against torch's best at real sizes with ``triton.testing.do_bench`` (warm-up
excluded, median of CUDA-event timings), checks the kernel's output against a reference, optionally tries
a few tile configurations (there is no autotuning), and writes its rows as JSON. The kernels they time
are bandwidth-bound (quantized matmuls at decode batch sizes) or compute-bound (prefill attention); the
scripts say which figure to hold against which peak. Nothing here touches a GPU (or Triton) at import
time, and every function but ``gpu_seconds`` runs on a CPU. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import json
import sys
from typing import Callable

import torch


def cuda_or_skip(script: str) -> bool:
    """True when a CUDA GPU is there; otherwise print why ``script`` times nothing and return False."""
    if torch.cuda.is_available():
        return True
    print(f"{script} needs a CUDA GPU (the Triton interpreter on a CPU times nothing useful); skipped.")
    return False


def gpu_seconds(fn: Callable[[], object], rep_ms: int = 100) -> float:
    """Median time of ``fn()`` in seconds by ``triton.testing.do_bench`` over ``rep_ms`` milliseconds."""
    from triton.testing import do_bench

    return do_bench(fn, rep=rep_ms, return_mode="median") * 1e-3


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out − ref| / max |ref|, in fp32: one number for "the kernel computes the reference"."""
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-12))


def best_config(
    make: Callable[[dict], Callable[[], object]], configs: list[dict], time_fn: Callable[[Callable], float]
) -> tuple[float, dict]:
    """(fastest time, its config) over ``configs``, timing ``make(config)`` with ``time_fn``. A config that
    fails (shared memory, registers, a shape it does not take) is reported on stderr and skipped; if none
    runs, (inf, {})."""
    best = (float("inf"), {})
    for cfg in configs:
        try:
            t = time_fn(make(cfg))
        except Exception as e:  # any compile or launch failure of one config
            print(f"  config {cfg} failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}", file=sys.stderr)
            continue
        if t < best[0]:
            best = (t, cfg)
    return best


def tinygemm_int4(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int):
    """torch's own int4 weight-only path on CUDA (tinygemm, the kernel gpt-fast and torchao call) for the
    course's int4 storage, or ``(None, reason)`` where this torch/GPU lacks it.

    The formats agree on the arithmetic, W = (u − 8)·scale + zero with a float zero, and differ in layout:
    the course keeps k = 2j in a byte's low nibble, tinygemm's converter takes it in the high nibble, and
    its scales and zeros are one (K/g, N, 2) bf16 tensor. Returns ``(fn, "")`` with ``fn(x)`` = x · Wᵀ for
    bf16 x (M, K), or ``(None, reason)``."""
    from course_lib.kernels.quant_matmul.int4 import unpack_int4

    try:
        u = unpack_int4(packed).to(torch.int32)  # (N, K), k = 2j from the low nibble
        tiny = ((u[:, 0::2] << 4) | u[:, 1::2]).to(torch.uint8)  # tinygemm: k = 2j in the high nibble
        w4 = torch.ops.aten._convert_weight_to_int4pack(tiny.contiguous(), 8)  # inner K tiles = 8: K % 128 == 0
        sz = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)  # (K/g, N, 2)

        def fn(x: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten._weight_int4pack_mm(x, w4, group_size, sz)

        fn(torch.zeros(1, packed.shape[1] * 2, device=packed.device, dtype=torch.bfloat16))  # fails here if unsupported
        return fn, ""
    except Exception as e:  # an op this torch build or GPU does not have, or a shape it refuses
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def device_meta(**extra) -> dict:
    """The GPU's name and torch's version (and ``extra``), for the JSON a benchmark writes."""
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__, **extra)


def write_rows(path: str, rows: list[dict], meta: dict, **sections) -> None:
    """``{"meta": meta, **sections, "rows": rows}`` as JSON at ``path``."""
    with open(path, "w") as f:
        json.dump(dict(meta=meta, **sections, rows=rows), f, indent=1)
    print(f"wrote {len(rows)} rows to {path}")
