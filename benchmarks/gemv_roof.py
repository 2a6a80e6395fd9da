"""Benchmark: decode-shaped products (1-4 rows) of the fp32, int8 and int4 layers as a share of STREAM.

    python benchmarks/gemv_roof.py [--out 4096] [--in 4096] [--rows 1 2 4] [--threads 1 2] [--json out.json]

Issue 21's goal: each format's decode-shaped product reads its weight at >= 75% of the STREAM triad
bandwidth, on a matrix far bigger than the LLC. Per thread count: a STREAM triad (best of the repeats,
``measure.microbench``), then ``compression.gemv_roof.gemv_roof`` (fp32 ``F.linear``, oneDNN packed and the
course's GEMV ``kernels.cpu_gemv``; int8 per channel and int4 g32 on the course's GEMV and on torch's bf16
kernels ``aten._weight_int8pack_mm`` / ``aten._weight_int4pack_mm_for_cpu``; fbgemm's int8-dyn), each
cycling through copies of its weight until it reads ``--working-set`` MiB. Also prints what each kernel's
handling of the activations costs in error against fp32 activations. Then the course's GEMV kernels on one
``--cache-out`` × ``--in`` weight read over and over (``gemv_roof.cache_roof``: it stays in the caches), the
rate each reaches with DRAM out of the way, and per format which roof is the lower (``bound_verdicts``: a
kernel slower than STREAM in cache is bound by its arithmetic). Every sample is paired with one STREAM triad
pass timed just before it (``gemv_roof.triad_sampler``), and a row's fraction is the median of the pairs'
ratios: a shared machine whose speed drifts over minutes moves both sides of a pair alike. Writes JSON
(machine, load average, command, each row's STREAM samples) that ``benchmarks/ledger.py`` reads. Not a test:
timings are noisy on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _row(r, threads: int, **more) -> dict:
    """One RoofRow as the JSON the ledger reads."""
    return dict(family=r.format.split()[0], format=r.format, path=r.path, rows=r.rows, threads=threads,
                weight_bytes=r.weight_bytes, gbps=r.gbps, stream_gbps=r.stream_gbps, fraction=r.fraction,
                spread=r.spread, stream_samples=list(r.stream_samples), **more)  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=int, default=4096, help="out_features")
    p.add_argument("--in", dest="inf", type=int, default=4096, help="in_features")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--working-set", type=int, default=None, help="MiB read per pass (default: 4x the LLC, at least 256)"
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cache-out", type=int, default=1024, help="out_features of the in-cache weight (0: skip)")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)
    for name in ("out", "inf", "working_set", "repeats"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.cache_out < 0:
        p.error("--cache-out must be >= 0")

    import torch

    from course_lib.compression.gemv_roof import (
        bf16_activation_error,
        bound_table,
        bound_verdicts,
        cache_roof,
        gemv_roof,
        table,
        triad_sampler,
    )
    from course_lib.measure.hardware.device import detect_device
    from course_lib.measure.microbench import dram_triad_gbps, dram_working_set_bytes

    if a.working_set is None:  # a 300 MiB LLC (a Sapphire Rapids VM) would serve 256 MiB from the cache
        a.working_set = dram_working_set_bytes() // 2**20
    load_before = os.getloadavg()[0]
    rows, in_cache, bounds = [], [], []
    for th in a.threads:
        torch.set_num_threads(th)
        stream = dram_triad_gbps(repeats=8, n_bytes=a.working_set * 2**20 // 2)
        sampler = triad_sampler(a.working_set * 2**20 // 2)  # one triad pass before each GEMV sample: paired ratios
        res = gemv_roof(
            a.out, a.inf, stream_gbps=stream, rows=a.rows, working_set=a.working_set * 2**20, repeats=a.repeats,
            stream_sample=sampler,
        )  # fmt: skip
        print(f"\n{th} thread(s): STREAM triad {stream:.1f} GB/s (best of 8); weight {a.out} x {a.inf}")
        print(table(res))
        rows += [_row(r, th, copies=r.copies) for r in res]
        if a.cache_out:
            cache = cache_roof(
                a.inf, stream_gbps=stream, out_features=a.cache_out, calls=50, repeats=2 * a.repeats,
                stream_sample=sampler,
            )  # fmt: skip
            print(f"in cache: {a.cache_out} x {a.inf}, one copy, read again and again")
            print(table(cache))
            b = bound_verdicts(res, cache)
            print(bound_table(b))
            in_cache += [_row(r, th, best_gbps=r.best_gbps, best_fraction=r.best_fraction) for r in cache]
            bounds += [dict(row, threads=th) for row in b]
    errs = bf16_activation_error()
    print("\nmax error / max |y| against fp32 activations on the same weights:")
    print(", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    if a.json:
        cmd = "python benchmarks/gemv_roof.py " + " ".join(sys.argv[1:] if argv is None else argv)
        meta = dict(machine=detect_device().describe(), date=date.today().isoformat(), torch=torch.__version__,
                    load_average_before=load_before, load_average_after=os.getloadavg()[0], command=cmd.strip(),
                    shape=[a.out, a.inf], working_set_mib=a.working_set, cache_shape=[a.cache_out, a.inf],
                    bf16_activation_error=errs)  # fmt: skip
        out = dict(meta=meta, rows=rows, in_cache=in_cache, bounds=bounds)
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
