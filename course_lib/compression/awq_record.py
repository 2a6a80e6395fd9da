"""``python -m course_lib.compression.awq_record``: AWQ on the whole of SmolLM2, recorded.

Quick mode runs AWQ on one decoder layer; the whole model (30 layers, every layer's H and mean|x| from
one pass over train-split text, an α search per layer) takes minutes on two cores. This command
calibrates, quantizes int4 g64 with AWQ (``compression.awq``) and with RTN, and scores both on the same
held windows as ``requant_record`` (the same ``held_windows``, so its "int4 g64 RTN" row must equal that
record's: the check that the two records are comparable), the LM head int8 per channel as there. It
writes ``data/measurements/smollm2-awq.json`` with the machine and the command. Introduced in
03_compression.ipynb.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

OUT = "smollm2-awq.json"


def measure(n_windows: int = 8, n_calib: int = 16, max_new_tokens: int = 48, threads: int | None = None) -> dict:
    """AWQ and RTN int4 g64 on SmolLM2, scored against the dequantized Q4_1 (a JSON-ready dict)."""
    from course_lib.compression import requant
    from course_lib.compression.awq import awq_layers, collect_awq_stats
    from course_lib.compression.requant_record import calibration_tokens
    from course_lib.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.measure.hardware import detect_device

    if threads:
        torch.set_num_threads(threads)
    eng = Engine("smollm2-135m-instruct", config=SchedulerConfig(max_model_len=512, max_num_seqs=4), linear="reference")
    windows = requant.held_windows(eng, n_windows)
    ids = requant.chat_ids(eng.tokenizer)
    body = [n for n, _ in eng.model.linears() if n != "lm_head"]
    t = time.perf_counter()
    stats = collect_awq_stats(eng, body, n_calib, 256, data=calibration_tokens(eng))
    calib_s = time.perf_counter() - t
    rows_all = 1 << 30  # every input through the CPU kernel, as requant.quantized_layers does
    awq, report = awq_layers(eng, requant.INT4_G64, stats, max_rows=rows_all)
    del stats
    head = requant.int8_head(eng)
    formats = {
        "int4 g64 RTN": lambda e: requant.quantized_layers(e, requant.INT4_G64),
        "int4 g64 AWQ": lambda e: {**awq, "lm_head": head},
    }
    rows = [
        {k: v for k, v in r.items() if k != "losses"}
        for r in requant.compare_formats(eng, windows, ids, formats, max_new_tokens)
    ]
    return {
        "what": "SmolLM2-135M-Instruct, int4 g64 RTN vs AWQ; reference = the dequantized Q4_1 weights ('fp32')",
        "machine": detect_device().describe(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "command": "python -m course_lib.compression.awq_record " + " ".join(sys.argv[1:]),
        "held_text": f"course corpus validation split, {rows[0]['tokens']} tokens in windows of 256",
        "calibration": f"{n_calib} windows of 256 tokens of the train split",
        "calibration_s": calib_s,
        "awq_s": report["seconds"],
        "rows": rows,
        "layers": report["layers"],
    }


def main(argv: list[str] | None = None) -> int:
    from course_lib.core.paths import data_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=8, help="held windows of 256 tokens to score")
    p.add_argument("--calib", type=int, default=16, help="calibration windows of 256 tokens for AWQ")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=data_dir() / "measurements" / OUT)
    a = p.parse_args(argv)
    result = measure(a.windows, a.calib, threads=a.threads)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")
    for r in result["rows"]:
        print(f"{r['format']:<20} ppl {r['perplexity']:.3f} ({r['ppl_rel']:+.2%}) agreement {r['agreement']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
