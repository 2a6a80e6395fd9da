"""Benchmark (GPU only): weight-only int8 / int4 (g=128) Triton kernels vs F.linear in fp16 and bf16.

    python benchmarks/quant_kernels_gpu.py [--out quant_kernels.json] [--batches 1 4 16] [--sweep]

For each weight (N out × K in: 4096x4096, 8192x8192, 4096x14336, 14336x4096), batch M and activation
dtype, it times ``F.linear(x, W)`` with W in that dtype, ``int8_matmul`` (per-channel scales) and
``int4_matmul`` (groups of 128) with ``triton.testing.do_bench`` (median), and prints the weight bytes
streamed per second (GB/s: the figure to hold against the GPU's memory bandwidth) and the speed-up over
F.linear. In bf16 it also times torch's own int4 path (``_weight_int4pack_mm``, tinygemm: the kernel gpt-fast
and torchao use) on the same weights, the bar the course's int4 kernel has to meet; where this torch or GPU
lacks it, the JSON says why. Each kernel's result is also checked against its torch reference (``err``:
max |Δ| / max |ref|).
``--sweep`` also tries a few block sizes and K splits and reports the best (there is no autotuning).
On a machine without CUDA it prints why and exits 0. Not a test: timings vary from run to run.
Nothing here touches a GPU (or Triton) at import time.
"""

from __future__ import annotations

import argparse
import sys

SHAPES = ((4096, 4096), (8192, 8192), (4096, 14336), (14336, 4096))  # (N out, K in)
GROUP = 128
SWEEP = [
    dict(block_n=bn, block_k=bk, split_k=sk) for bn in (16, 32, 64) for bk in (64, 128, 256) for sk in (None, 1, 2, 4)
]


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the rows as JSON to this path")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=["fp16", "bf16"])
    p.add_argument("--shapes", nargs="+", help="weights as NxK (default: the four above)")
    p.add_argument(
        "--sweep", action="store_true", help="also try 36 block/split configs per case and report the best (minutes)"
    )
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    return p.parse_args(argv)


def _shapes(args) -> list[tuple[int, int]]:
    if not args.shapes:
        return list(SHAPES)
    out = []
    for s in args.shapes:
        n, k = (int(v) for v in s.lower().split("x"))
        out.append((n, k))
    return out


def run(args) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from course_lib.kernels import quant_matmul as qm
    from course_lib.kernels.gpu_bench import best_config, gpu_seconds, rel_err, tinygemm_int4

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    unavailable: dict[str, str] = {}  # baselines this torch/GPU lacks, with the reason (into the JSON)
    run.unavailable = unavailable

    def bench(fn) -> float:
        return gpu_seconds(fn, args.rep)

    for n, k in _shapes(args):
        q = torch.randint(-128, 128, (n, k), device=dev, dtype=torch.int8, generator=gen)
        packed = torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.uint8, generator=gen)
        for dname in args.dtypes:
            dt = dtypes[dname]
            w = (torch.randn(n, k, device=dev, generator=gen) * 0.02).to(dt)
            scale = (torch.rand(n, device=dev, generator=gen) * 1e-3).to(dt)
            scales = (torch.rand(n, k // GROUP, device=dev, generator=gen) * 1e-2).to(dt)
            zeros = (torch.randn(n, k // GROUP, device=dev, generator=gen) * 1e-2).to(dt)
            bytes_ = {
                "F.linear": n * k * w.element_size(),
                "int8": qm.int8_weight_bytes(n, k, scale.element_size()),
                f"int4 g{GROUP}": qm.int4_weight_bytes(n, k, GROUP, scales.element_size()),
            }
            for m in args.batches:
                x = torch.randn(m, k, device=dev, generator=gen).to(dt)
                calls = {
                    "F.linear": lambda kw: lambda: F.linear(x, w),
                    "int8": lambda kw: lambda: qm.int8_matmul(x, q, scale, path="triton", **kw),
                    f"int4 g{GROUP}": lambda kw: (
                        lambda: qm.int4_matmul(x, packed, scales, zeros, GROUP, path="triton", **kw)
                    ),
                }
                errs = {
                    "F.linear": 0.0,
                    "int8": rel_err(calls["int8"]({})(), qm.int8_matmul_ref(x, q, scale)),
                    f"int4 g{GROUP}": rel_err(
                        calls[f"int4 g{GROUP}"]({})(), qm.int4_matmul_ref(x, packed, scales, zeros, GROUP)
                    ),
                }
                if dname == "bf16":
                    tiny, why = tinygemm_int4(packed, scales, zeros, GROUP)
                    if tiny is None:
                        print(f"  torch int4 (tinygemm) unavailable: {why}", flush=True)
                        unavailable.setdefault("torch int4 (tinygemm)", why)
                    else:
                        calls["torch int4"] = lambda kw, tiny=tiny: lambda: tiny(x)
                        errs["torch int4"] = rel_err(tiny(x), qm.int4_matmul_ref(x, packed, scales, zeros, GROUP))
                        bytes_["torch int4"] = bytes_[f"int4 g{GROUP}"]
                t_lin = None
                for kind, make in calls.items():
                    t = bench(make({}))
                    t_best, kw_best = (t, {})
                    if args.sweep and kind not in ("F.linear", "torch int4"):
                        t_best, kw_best = min([(t, {}), best_config(make, SWEEP, bench)], key=lambda r: r[0])
                    t_lin = t if kind == "F.linear" else t_lin
                    rows.append(
                        dict(
                            n=n,
                            k=k,
                            batch=m,
                            dtype=dname,
                            kind=kind,
                            seconds=t,
                            weight_bytes=bytes_[kind],
                            weight_gbps=bytes_[kind] / t / 1e9,
                            speedup=t_lin / t,
                            rel_err=errs[kind],
                            best_seconds=t_best,
                            best_config=kw_best,
                            best_speedup=t_lin / t_best,
                        )
                    )
                    print(_format_row(rows[-1], args.sweep), flush=True)
    return rows


HEADER = f"{'N x K':>12} {'M':>3} {'dtype':>5} {'kernel':>10} {'µs':>9} {'GB/s':>8} {'speedup':>8} {'err':>8}"


def _format_row(r: dict, sweep: bool) -> str:
    s = (
        f"{r['n']:>5}x{r['k']:<6} {r['batch']:>3} {r['dtype']:>5} {r['kind']:>10} {r['seconds'] * 1e6:>9.1f} "
        f"{r['weight_gbps']:>8.0f} {r['speedup']:>7.2f}x {r['rel_err']:>8.1e}"
    )
    if sweep and r["kind"] not in ("F.linear", "torch int4"):
        s += f"  best {r['best_seconds'] * 1e6:.1f} µs ({r['best_speedup']:.2f}x) with {r['best_config']}"
    return s


def main(argv=None) -> int:
    args = _parse(argv)
    import torch

    from course_lib.kernels.gpu_bench import cuda_or_skip, device_meta, write_rows

    if not cuda_or_skip("quant_kernels_gpu.py"):
        return 0
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}")
    print(HEADER)
    rows = run(args)
    if args.out:
        write_rows(args.out, rows, device_meta(group_size=GROUP), unavailable=getattr(run, "unavailable", {}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
