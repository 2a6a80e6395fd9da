"""Model bandwidth utilisation (MBU) of a batch-1 decode step: the bytes a step must read ÷ its time ÷ the
bandwidth this machine measured.

A batch-1 decode step reads every weight once (``accounting.decode_step_bytes``: the matrices, the LM head,
the KV cache of its context), so its fastest possible time is those bytes ÷ the memory bandwidth, and MBU is
how close a step comes: gpt-fast reports 68-72% on an A100 with a 7B model. The weights here are random (a
step's speed does not depend on their values), in the shape of a real model (``SHAPES``: Llama-3.2-1B's from
its published config.json), so nothing is downloaded. Each lever is one of the engine's decode modes
(``step_levers``): on a GPU, "eager" pays a launch from Python for each of its ops, and "cudagraph" replays
the whole step as one graph, which is what brings a 1B model near the roof. The bandwidth is the device's
measured copy/triad peak (``microbench.measured_peaks``: STREAM on a CPU, a device copy on a GPU).

Issue 21's goal: the Llama-3.2-1B shape in bf16 at ≥ 60% of the measured HBM bandwidth on a lent GPU
(``python benchmarks/decode_mbu.py --device cuda``, run by ``benchmarks/gpu_check.sh``; the performance ledger
reads its best lever). The same command runs on a CPU (fp32, the native step).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from course_lib.bottlenecks.step_levers import measure_lever
from course_lib.measure.claims import claim
from course_lib.models.accounting import ModelShape, decode_step_bytes

SHAPES: dict[str, ModelShape] = {
    # meta-llama/Llama-3.2-1B config.json: 16 layers, hidden 2048, MLP 8192, 32 query / 8 KV heads of 64,
    # a 128,256-token vocabulary, tied embeddings. 1.24 B parameters: 2.47 GB in bf16.
    "llama-3.2-1b": ModelShape("llama-3.2-1b", 128256, 2048, 8192, 16, 32, 8, 64, True, 131072),
    # HuggingFaceTB/SmolLM2-135M config.json: 30 layers, hidden 576, 9 query / 3 KV heads of 64.
    "smollm2-135m": ModelShape("smollm2-135m", 49152, 576, 1536, 30, 9, 3, 64, True, 8192),
}
GOAL = 0.6  # issue 21: the 1B shape in bf16 at ≥ 60% of the measured HBM bandwidth
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class MbuRow:
    shape: str
    dtype: str
    device: str
    lever: str
    context: int  # tokens in the KV cache at the timed step
    bytes_per_step: float  # the minimum a step reads: weights + LM head + KV of the context
    step_us: float  # median µs of one step (forward, argmax, token to host)
    gbps: float  # bytes_per_step / step time
    bandwidth_gbps: float  # the device's measured peak
    mbu: float  # gbps / bandwidth_gbps
    spread: float = 0.0
    compile_s: float = 0.0
    samples_us: list[float] = field(default_factory=list)


def resolve_shape(shape) -> ModelShape:
    """A ``ModelShape``, or the name of one of ``SHAPES``."""
    if isinstance(shape, ModelShape):
        return shape
    if shape not in SHAPES:
        raise ValueError(f"shape must be a ModelShape or one of {sorted(SHAPES)}, got {shape!r}")
    return SHAPES[shape]


def random_llama(shape, device="cpu", dtype: str = "bf16", max_position: int = 4096, seed: int = 0):
    """(model, tokenizer): a ``transformers`` Llama with ``shape`` and random weights, made on ``device`` in
    ``dtype``, and the course tokenizer (its ids are valid in any vocabulary of ≥ 4,096). For speed only:
    its text is noise. ``max_position`` caps the RoPE table (the shape's own window is not needed here)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from course_lib.core.paths import data_dir
    from course_lib.models.load import parse_device
    from course_lib.models.tokenizer import load_tokenizer

    s = resolve_shape(shape)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if not isinstance(max_position, int) or max_position < 1:
        raise ValueError(f"max_position must be a positive int, got {max_position!r}")
    dev = parse_device(device)
    tokenizer = load_tokenizer(data_dir() / "models" / "tokenizer")
    if s.vocab_size < len(tokenizer):
        raise ValueError(f"shape {s.name!r} has a vocabulary of {s.vocab_size}; the tokenizer needs ≥ {len(tokenizer)}")
    config = LlamaConfig(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        max_position_embeddings=min(max_position, s.max_position),
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=s.tie_embeddings,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        hidden_act="silu",
    )
    torch.manual_seed(seed)
    with torch.device(dev):  # made where it runs: a 1B model's fp32 init on the host would take a minute
        model = LlamaForCausalLM(config)
    return model.to(DTYPES[dtype]).eval(), tokenizer


def mbu_rows(
    shape="llama-3.2-1b",
    device="cpu",
    dtype: str = "bf16",
    levers=("eager", "fused"),
    context: int = 64,
    steps: int = 10,
    repeats: int = 3,
    bandwidth_gbps: float | None = None,
) -> list[MbuRow]:
    """One ``MbuRow`` per lever: the engine on a random ``shape`` model, batch 1, at ``context`` tokens.
    ``bandwidth_gbps``: the roof to divide by (default: the device's measured copy/triad peak)."""
    from course_lib.engine.engine import Engine
    from course_lib.engine.fast_decode import DECODE_MODES
    from course_lib.engine.scheduler import SchedulerConfig

    s = resolve_shape(shape)
    bad = [lv for lv in levers if lv not in DECODE_MODES]
    if not levers or bad:
        raise ValueError(f"levers must be a non-empty list of {DECODE_MODES}, got {list(levers)!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    for arg, v, least in (("steps", steps, 1), ("repeats", repeats, 2)):
        if not isinstance(v, int) or v < least:
            raise ValueError(f"{arg} must be an int ≥ {least}, got {v!r}")
    if not isinstance(context, int) or not 1 <= context <= 256:
        raise ValueError(f"context must be an int in 1..256 (the engine's cache here holds 256), got {context!r}")
    if bandwidth_gbps is None:
        from course_lib.measure import microbench

        bandwidth_gbps = microbench.measured_peaks(str(torch.device(device).type)).bandwidth / 1e9
    if not bandwidth_gbps > 0:
        raise ValueError(f"bandwidth_gbps must be positive, got {bandwidth_gbps!r}")
    model, tok = random_llama(s, device, dtype, max_position=256)
    engine = Engine(model, tok, config=SchedulerConfig(max_model_len=256, max_num_seqs=1))
    need = decode_step_bytes(s, context, 1, dtype)
    rows = []
    for lever in levers:
        r = measure_lever(engine, lever, s.name, context, steps, repeats)
        gbps = need / (r.step_us * 1e-6) / 1e9
        rows.append(
            MbuRow(
                s.name, dtype, engine.device.type, lever, context, need, r.step_us, gbps, bandwidth_gbps,
                gbps / bandwidth_gbps, r.spread, r.compile_s, r.samples_us,
            )
        )  # fmt: skip
    return rows


def best(rows: list[MbuRow]) -> MbuRow:
    """The lever with the highest MBU (every row stays in the record)."""
    if not rows:
        raise ValueError("rows must be non-empty")
    return max(rows, key=lambda r: r.mbu)


def goal_verdict(row: MbuRow, goal: float = GOAL, where: str = "on this machine"):
    """Verdict: ``row`` reads at ≥ ``goal`` of the measured bandwidth (``where``: whose run, see ``claim``)."""
    return claim(
        f"{row.shape} {row.dtype} on {row.device}, the {row.lever} step: {row.gbps:.0f} GB/s of "
        f"{row.bandwidth_gbps:.0f} measured is at least {goal:.0%} of the bandwidth",
        row.mbu,
        at_least=goal,
        spread=row.spread,
        why_not="per-op launch or dispatch time, not bytes, still sets this step's time (or the products read "
        "below the copy rate)",
        where=where,
    )


def format_rows(rows: list[MbuRow]) -> str:
    head = (
        f"{'shape':<14} {'dtype':<5} {'lever':<10} {'MB/step':>8} {'µs/step':>9} {'± spread':>8} {'GB/s':>7} {'MBU':>6}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.shape:<14} {r.dtype:<5} {r.lever:<10} {r.bytes_per_step / 1e6:>8.0f} {r.step_us:>9.0f} "
            f"{r.spread:>8.0%} {r.gbps:>7.1f} {r.mbu:>6.0%}"
        )
    return "\n".join(lines)


def as_record(rows: list[MbuRow], command: str, machine: str) -> dict:
    """The JSON a run writes: every row, the best lever's MBU, and where it ran."""
    b = best(rows)
    meta = {"machine": machine, "date": time.strftime("%Y-%m-%d"), "command": command, "goal": GOAL}
    return {
        "meta": meta,
        "rows": [asdict(r) for r in rows],
        "best": {"lever": b.lever, "mbu": b.mbu, "shape": b.shape, "dtype": b.dtype},
    }


def stored_runs(measurements=None) -> list[dict]:
    """Every stored run of ``benchmarks/decode_mbu.py``: the ``decode-mbu-*.json`` files and the ``decode_mbu``
    section of each GPU record (``<gpu>.json``, written by ``benchmarks/gpu_collect.py``) under
    ``measurements`` (default ``data/measurements``), each as ``{"where", "gpu", "meta", "rows"}``."""
    import json
    from pathlib import Path

    from course_lib.core.paths import data_dir

    folder = Path(measurements) if measurements is not None else data_dir() / "measurements"
    if not folder.is_dir():
        raise ValueError(f"measurements must be a folder, got {str(folder)!r}")
    runs = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if not isinstance(data, dict):
            continue
        gpu = isinstance(data.get("decode_mbu"), dict)
        rec = data["decode_mbu"] if gpu else (data if path.name.startswith("decode-mbu-") else None)
        if isinstance(rec, dict) and rec.get("rows"):
            runs.append({"where": path.name, "gpu": gpu, "meta": rec.get("meta", {}), "rows": rec["rows"]})
    return runs


def stored_verdicts(runs: list[dict], goal: float = GOAL) -> list:
    """One goal verdict per stored run, on its best lever, labelled with the run's file and date."""
    return [
        goal_verdict(
            best([MbuRow(**r) for r in run["rows"]]),
            goal,
            where=f"in the recorded run ({run['where']}, {run['meta'].get('date', 'undated')})",
        )
        for run in runs
    ]


def format_stored(runs: list[dict]) -> str:
    """The stored runs, each with its file, machine, date and command, then its rows."""
    out = []
    for run in runs:
        m = run["meta"]
        out.append(f"{run['where']}: recorded {m.get('date', '?')} on {m.get('machine', '?')}")
        rows = [MbuRow(**r) for r in run["rows"]]
        out.append(
            f"  by: {m.get('command', '?')}; MBU divides by that machine's measured {rows[0].bandwidth_gbps:.0f} GB/s"
        )
        out.append(format_rows(rows))
    return "\n".join(out)


__all__ = [
    "GOAL",
    "MbuRow",
    "SHAPES",
    "as_record",
    "best",
    "format_rows",
    "format_stored",
    "goal_verdict",
    "mbu_rows",
    "random_llama",
    "resolve_shape",
    "stored_runs",
    "stored_verdicts",
]
