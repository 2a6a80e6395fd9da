"""Benchmark (GPU only): the Triton FlashAttention forward vs SDPA vs naive attention, prefill-shaped.

    python benchmarks/flash_attention_gpu.py [--out flash_attention.json] [--lengths 1024 2048 4096 8192]
                                             [--head-dims 64 128] [--dtypes fp16 bf16] [--sweep]

For each head_dim, length T (Tq = Tk = T, causal and not), dtype: times ``flash_attention_fwd`` (path
'triton'), ``F.scaled_dot_product_attention`` (whatever backend torch picks: FlashAttention-2, cuDNN or
memory-efficient) and ``attention_naive`` (the T² score matrix in fp32; skipped when it would not fit in
--naive-max-gb) with ``triton.testing.do_bench`` (median), B = 4, H = 16 query heads over 4 KV heads (GQA).
Prints TFLOP/s (FLOPs counted by ``attention_flops``: causal counts only the visible half) and flash's speed
as a fraction of SDPA's — the issue's goal is >= 0.9 at T >= 1k — and checks the output (``err``: max |Δ|
against SDPA, relative to max |SDPA|). ``--sweep`` also tries a few tile/stage configs and reports the best
(there is no autotuning). On a machine without CUDA it prints why and exits 0. Not a test: timings vary.
Nothing here touches a GPU (or Triton) at import time.
"""

from __future__ import annotations

import argparse
import sys

SWEEP = [dict(block_m=bm, block_n=bn) for bm in (64, 128) for bn in (32, 64, 128)]


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the rows as JSON to this path")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128], choices=[16, 32, 64, 128])
    p.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=["fp16", "bf16"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--causal", nargs="+", default=["causal", "full"], choices=["causal", "full"])
    p.add_argument("--naive-max-gb", type=float, default=8.0, help="skip naive when its scores exceed this")
    p.add_argument("--sweep", action="store_true", help="also try block_m x block_n configs and report the best")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    return p.parse_args(argv)


def run(args) -> list[dict]:
    import torch

    from course_lib.kernels import flash_attention as fa
    from course_lib.kernels.flash_attention_costs import attention_flops, naive_attention_bytes
    from course_lib.kernels.gpu_bench import best_config, gpu_seconds, rel_err

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    B, H, Hkv = args.batch, args.heads, args.kv_heads
    rows = []

    def bench(fn) -> float:
        return gpu_seconds(fn, args.rep)

    for d in args.head_dims:
        for T in args.lengths:
            for dname in args.dtypes:
                dt = dtypes[dname]
                q = torch.randn(B, H, T, d, device=dev, generator=gen).to(dt)
                k = torch.randn(B, Hkv, T, d, device=dev, generator=gen).to(dt)
                v = torch.randn(B, Hkv, T, d, device=dev, generator=gen).to(dt)
                for mode in args.causal:
                    causal = mode == "causal"
                    flops = attention_flops(B, H, T, T, d, causal)
                    calls = {
                        "sdpa": lambda: fa.flash_attention_torch(q, k, v, causal),
                        "flash": lambda: fa.flash_attention_fwd(q, k, v, causal, path="triton"),
                    }
                    ref = calls["sdpa"]()
                    errs = {"sdpa": 0.0, "flash": rel_err(calls["flash"](), ref)}
                    if naive_attention_bytes(B, H, T, dt, head_dim=d) <= args.naive_max_gb * 1e9:
                        calls["naive"] = lambda: fa.attention_naive(q, k, v, causal)
                        errs["naive"] = rel_err(calls["naive"](), ref)
                    times = {name: bench(fn) for name, fn in calls.items()}
                    best_t, best_cfg = times["flash"], {}
                    if args.sweep:
                        t, cfg = best_config(
                            lambda cfg: lambda: fa.flash_attention_fwd(q, k, v, causal, path="triton", **cfg),
                            SWEEP,
                            bench,
                        )
                        if t < best_t:
                            best_t, best_cfg = t, cfg
                    for name, t in times.items():
                        rows.append(
                            dict(
                                head_dim=d,
                                T=T,
                                dtype=dname,
                                causal=causal,
                                batch=B,
                                heads=H,
                                kv_heads=Hkv,
                                kind=name,
                                seconds=t,
                                tflops=flops / t / 1e12,
                                vs_sdpa=times["sdpa"] / t,
                                rel_err=errs[name],
                                best_seconds=best_t if name == "flash" else t,
                                best_config=best_cfg if name == "flash" else {},
                            )
                        )
                        print(_format_row(rows[-1], args.sweep), flush=True)
    return rows


HEADER = f"{'d':>4} {'T':>6} {'dtype':>5} {'mask':>6} {'kernel':>6} {'ms':>9} {'TFLOP/s':>8} {'vs sdpa':>8} {'err':>8}"


def _format_row(r: dict, sweep: bool) -> str:
    s = (
        f"{r['head_dim']:>4} {r['T']:>6} {r['dtype']:>5} {'causal' if r['causal'] else 'full':>6} {r['kind']:>6} "
        f"{r['seconds'] * 1e3:>9.3f} {r['tflops']:>8.1f} {r['vs_sdpa']:>7.2f}x {r['rel_err']:>8.1e}"
    )
    if sweep and r["kind"] == "flash" and r["best_config"]:
        s += f"  best {r['best_seconds'] * 1e3:.3f} ms with {r['best_config']}"
    return s


def summary(rows: list[dict], goal: float = 0.9, min_t: int = 1024) -> dict:
    """Did flash reach ``goal`` × SDPA's speed at every T >= ``min_t``? The verdict comes from the rows."""
    flash = [r for r in rows if r["kind"] == "flash" and r["T"] >= min_t]
    worst = min(flash, key=lambda r: r["vs_sdpa"], default=None)
    return dict(
        goal=goal,
        min_T=min_t,
        cases=len(flash),
        met=sum(r["vs_sdpa"] >= goal for r in flash),
        worst=None if worst is None else {key: worst[key] for key in ("head_dim", "T", "dtype", "causal", "vs_sdpa")},
    )


def main(argv=None) -> int:
    args = _parse(argv)
    import torch

    from course_lib.kernels.gpu_bench import cuda_or_skip, device_meta, write_rows

    if not cuda_or_skip("flash_attention_gpu.py"):
        return 0
    if "bf16" in args.dtypes and not torch.cuda.is_bf16_supported():
        args.dtypes = [d for d in args.dtypes if d != "bf16"]
        print("this GPU has no bf16: timing fp16 only")
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}")
    print(HEADER)
    rows = run(args)
    verdict = summary(rows)
    print(f"flash >= {verdict['goal']}x SDPA at T >= {verdict['min_T']}: {verdict['met']}/{verdict['cases']} cases")
    if verdict["worst"]:
        print(f"worst: {verdict['worst']}")
    if args.out:
        write_rows(args.out, rows, device_meta(batch=args.batch), summary=verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
