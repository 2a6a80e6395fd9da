"""Flash-Decoding on a GPU: batch-1 decode over a long cache, one program per KV head vs the keys split.

    python benchmarks/flash_decoding_gpu.py --out flash_decoding.json

Times course_lib.kernels.flash_decoding (Triton) with 1 split and with ``splits_to_fill`` splits, beside
PyTorch's SDPA (its own fused kernel, GQA expanded), for Llama-3-8B's decode shape (32 query heads, 8 KV
heads of 128, fp16), and the predicted SM fill of each. CUDA only."""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from course_lib.kernels import flash_decoding as fd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rep", type=int, default=40)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from triton.testing import do_bench

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for L in (4096, 16384, 65536):
        q = torch.randn(1, 32, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(1, 8, L, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        ref = F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]
        row = {"L": L, "sms": sms, "kv_bytes": 2 * k.nbytes}
        for S in (1, fd.splits_to_fill(1, 8, sms, L)):
            out = fd.flash_decoding(q, k, v, S, path="triton", block_n=64)
            row[f"max_err_S{S}"] = float((out.float() - ref.float()).abs().max())
            row[f"ms_S{S}"] = do_bench(
                lambda S=S: fd.flash_decoding(q, k, v, S, path="triton", block_n=64), rep=args.rep
            )
            row[f"sm_fill_S{S}"] = fd.sm_fill(1, 8, S, sms)
        row["ms_sdpa"] = do_bench(
            lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True), rep=args.rep
        )
        rows.append(row)
        print(row, flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
