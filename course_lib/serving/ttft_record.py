"""A recorded TTFT sweep of the chat model at long prompts, for the quick mode that cannot afford one.

A 2,048-token prefill of SmolLM2-135M is ~0.7 TFLOP: seconds on a 2-core CPU per repeat, past chapter
02's quick-mode budget. ``python -m course_lib.serving.ttft_record`` measures the long prompts once
(``serving.ttft_sweep``, batch 1, one output token) and writes them to
``data/measurements/smollm2-135m-instruct-ttft-cpu.json`` with the machine, the load average before and
after, the threads, the software, the command, and the matmul peak measured just before each length, so
each recorded TTFT is predicted from its FLOPs against the peak the machine gave at that moment (a shared
machine's speed drifts as other jobs come and go). ``load_record`` reads it back and checks its fields;
``TTFTRecord.compare`` sets each point beside its floor. Prefill is compute-bound: the file is only
comparable with a prediction made on its own machine's peak. Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from course_lib.bottlenecks.roof_check import VsRoof, compare_prefill
from course_lib.core.paths import data_dir
from course_lib.engine.sampling import SamplingParams
from course_lib.measure.hardware import detect_device, timing_threads
from course_lib.measure.microbench import measure_matmul
from course_lib.serving.chat_model import CHAT_MODEL, chat_engine
from course_lib.serving.client import TTFTPoint, _positive_ints, ttft_sweep
from course_lib.serving.workload import prompt_pool

DEFAULT_LENGTHS = (512, 1024, 2048, 4096)
COMMAND = "python -m course_lib.serving.ttft_record"


def default_path(model: str = CHAT_MODEL, device: str = "cpu") -> Path:
    return data_dir() / "measurements" / f"{model}-ttft-{device}.json"


@dataclass(frozen=True)
class TTFTRecord:
    """A stored TTFT sweep: where, when and how it was measured, and its points."""

    model: str
    dtype: str
    device: str
    machine: str
    threads: int
    measured_at: str
    load_before: float
    load_after: float
    matmul_peak_flops: float  # median of ``point_peaks_flops``
    point_peaks_flops: tuple[float, ...]  # ``dtype`` matmul FLOP/s (best of repeats) just before each point
    command: str
    software: dict
    points: tuple[TTFTPoint, ...]

    def ttft(self) -> dict[int, float]:
        """{prompt length: median TTFT (s)}."""
        return {p.prompt_len: p.ttft_s for p in self.points}

    def compare(self, shape, bandwidth: float) -> list[VsRoof]:
        """Each point beside its roofline floor at the matmul peak measured just before it."""
        return [
            compare_prefill(shape, {p.prompt_len: p.ttft_s}, peak, bandwidth, self.dtype)[0]
            for p, peak in zip(self.points, self.point_peaks_flops)
        ]

    def label(self) -> str:
        return (
            f"recorded {self.measured_at[:10]} on {self.machine}, {self.threads} thread(s), "
            f"load average {self.load_before:.1f} before: `{self.command}`"
        )


def record_ttft(
    lengths=DEFAULT_LENGTHS, *, repeats: int = 2, model: str = CHAT_MODEL, device: str = "cpu", dtype: str = "fp32"
) -> TTFTRecord:
    """Measure the TTFT of ``model`` at each prompt length (median of ``repeats``, after one warm-up at a
    short prompt) and the matmul peak in the same process."""
    lengths = _positive_ints("lengths", lengths)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if device == "cpu":
        torch.set_num_threads(timing_threads())
    engine = chat_engine(model, max_model_len=max(lengths) + 8, device=device, dtype=dtype)
    pool = prompt_pool(engine.tokenizer, max(lengths))
    engine.generate([pool[:64]], SamplingParams(max_new_tokens=2, ignore_eos=True))  # warm-up
    points, peaks = [], []
    for n in lengths:
        mm = measure_matmul(dtype, device=device)
        peaks.append(mm.rate(mm.flops, best=True))
        points += ttft_sweep(engine, pool, [n], repeats=repeats, warmup=0)
    import transformers

    return TTFTRecord(
        model=model,
        dtype=dtype,
        device=device,
        machine=detect_device(device).describe(),
        threads=torch.get_num_threads(),
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        load_before=load_before,
        load_after=os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
        matmul_peak_flops=statistics.median(peaks),
        point_peaks_flops=tuple(peaks),
        command=f"{COMMAND} --lengths {' '.join(map(str, lengths))} --repeats {repeats} --device {device}",
        software={
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "platform": platform.machine(),
        },
        points=tuple(points),
    )


def save_record(rec: TTFTRecord, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    d = {k: getattr(rec, k) for k in TTFTRecord.__dataclass_fields__ if k != "points"}
    d["point_peaks_flops"] = list(rec.point_peaks_flops)
    d["points"] = [{"prompt_len": p.prompt_len, "ttft_s": p.ttft_s, "samples_s": list(p.samples_s)} for p in rec.points]
    path.write_text(json.dumps(d, indent=1) + "\n")
    return path


def load_record(path: Path | str | None = None) -> TTFTRecord:
    """The stored sweep at ``path`` (default: ``default_path()``); a clear error for a missing field."""
    path = default_path() if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no recorded TTFT sweep at {path}: make it with `{COMMAND} --out {path}`")
    d = json.loads(path.read_text())
    missing = [k for k in TTFTRecord.__dataclass_fields__ if k not in d]
    if missing:
        raise ValueError(f"{path} lacks the fields {missing}: re-record it with `{COMMAND}`")
    points = []
    for p in d["points"]:
        if not isinstance(p.get("prompt_len"), int) or not p.get("ttft_s", 0) > 0:
            raise ValueError(f"{path}: each point needs an int prompt_len and a positive ttft_s, got {p!r}")
        points.append(TTFTPoint(p["prompt_len"], float(p["ttft_s"]), tuple(map(float, p["samples_s"]))))
    peaks = tuple(map(float, d["point_peaks_flops"]))
    if len(peaks) != len(points) or not all(p > 0 for p in peaks):
        raise ValueError(f"{path}: point_peaks_flops must hold one positive peak per point")
    return TTFTRecord(**{**d, "points": tuple(points), "point_peaks_flops": peaks})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="default: data/measurements/<model>-ttft-<device>.json")
    args = ap.parse_args(argv)
    rec = record_ttft(args.lengths, repeats=args.repeats, device=args.device)
    path = save_record(rec, args.out or default_path(device=args.device))
    print(f"wrote {path}: " + ", ".join(f"{p.prompt_len} tok {p.ttft_s:.2f} s" for p in rec.points))


if __name__ == "__main__":
    main()
