"""``python -m course_lib.compression.requant_record``: record what quick mode cannot afford.

Chapter 03's quick mode scores re-quantized SmolLM2 on a few windows and runs GPTQ on a few layers. This
command runs the whole measurement — GPTQ int4 g64 over all 30 layers (Hessians from the float model, one
pass over train-split text), RTN int4 g64, int8, perplexity on more held text, chat agreement — and
writes it with the machine and the command to ``data/measurements/smollm2-requant.json``, which the
chapter loads and labels as recorded. Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

OUT = "smollm2-requant.json"


def calibration_tokens(engine, chars: int = 400_000):
    """Token ids of the first ``chars`` characters of the corpus's *train* split (never the held text)."""
    import numpy as np

    from course_lib.models.corpus import corpus_text

    ids = engine.tokenizer(corpus_text("train")[:chars], add_special_tokens=False)["input_ids"]
    return np.asarray(ids, dtype=np.int64)


def measure(n_windows: int = 32, n_calib: int = 32, max_new_tokens: int = 48, threads: int | None = None) -> dict:
    """The full comparison (see the module docstring) as a JSON-ready dict."""
    from course_lib.compression import requant
    from course_lib.compression.calibrate import collect_inputs
    from course_lib.compression.gguf_int4 import engine_qweights
    from course_lib.compression.gptq import gptq_qweights
    from course_lib.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.measure.hardware import detect_device
    from course_lib.models.gguf import gguf_file

    if threads:
        torch.set_num_threads(threads)
    eng = Engine("smollm2-135m-instruct", config=SchedulerConfig(max_model_len=512, max_num_seqs=4), linear="reference")
    windows = requant.held_windows(eng, n_windows)
    ids = requant.chat_ids(eng.tokenizer)
    t = time.perf_counter()
    hessians = collect_inputs(
        eng, [n for n, _ in eng.model.linears() if n != "lm_head"], n_calib, 256, data=calibration_tokens(eng)
    )
    calib_s = time.perf_counter() - t
    t = time.perf_counter()
    gq, report = gptq_qweights(eng, requant.INT4_G64, hessians)
    gptq_s = time.perf_counter() - t
    del hessians
    q41 = engine_qweights(gguf_file("smollm2-135m-instruct"))
    formats = {
        "Q4_1 as stored, int8 head": lambda e: requant.quantized_layers(e, requant.INT4_G32, q41),
        "int8 per-channel RTN": lambda e: requant.quantized_layers(e, requant.INT8),
        "int4 g32 RTN": lambda e: requant.quantized_layers(e, requant.INT4_G32),
        "int4 g64 RTN": lambda e: requant.quantized_layers(e, requant.INT4_G64),
        "int4 g64 GPTQ": lambda e: requant.quantized_layers(e, requant.INT4_G64, gq),
    }
    rows = [
        {k: v for k, v in r.items() if k != "losses"}
        for r in requant.compare_formats(eng, windows, ids, formats, max_new_tokens)
    ]
    layer_err = {n: {"gptq": v["gptq_error"], "rtn": v["rtn_error"]} for n, v in report["layers"].items()}
    return {
        "what": "SmolLM2-135M-Instruct re-quantized; reference = the dequantized Q4_1 weights ('fp32')",
        "machine": detect_device().describe(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "command": "python -m course_lib.compression.requant_record " + " ".join(sys.argv[1:]),
        "held_text": f"course corpus validation split, {rows[0]['tokens']} tokens in windows of 256",
        "calibration": f"{n_calib} windows of 256 tokens of the train split",
        "calibration_s": calib_s,
        "gptq_s": gptq_s,
        "rows": rows,
        "layer_errors": layer_err,
    }


def main(argv: list[str] | None = None) -> int:
    from course_lib.core.paths import data_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=32, help="held windows of 256 tokens to score")
    p.add_argument("--calib", type=int, default=32, help="calibration windows of 256 tokens for GPTQ")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=data_dir() / "measurements" / OUT)
    a = p.parse_args(argv)
    result = measure(a.windows, a.calib, threads=a.threads)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")
    for r in result["rows"]:
        print(
            f"{r['format']:<28} ppl {r['perplexity']:.3f} ({r['ppl_rel']:+.2%}) agreement {r['agreement']:.1%} "
            f"chat identical {r['chat']['identical']}/{r['chat']['answers']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
