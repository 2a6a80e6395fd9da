"""Decode speed of our engine vs Hugging Face ``generate`` on the same model, inputs and machine.

Decode time per step is measured as (time to generate N tokens − time to generate 1 token) / (N−1):
the prefill and set-up cancel, what is left is the bandwidth-bound decode loop. Two ways to read it:
- MBU: the bytes a step must move (every weight + the KV cache read) over the measured bandwidth;
- the effective weight bandwidth: the bytes of the weights a step multiplies by, divided by the
  step time, i.e. how fast the engine streams its weights, to set beside the STREAM bandwidth.
Introduced in 02_metrics_2_throughput_utilization.ipynb; ``benchmarks/engine_vs_hf.py`` runs it at full size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from course_lib.engine.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.measure.bench import benchmark
from course_lib.models.accounting import ModelShape, kv_bytes_per_token, weights_read_per_step

PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n"


@dataclass
class DecodeRow:
    batch: int
    engine_tok_s: float
    hf_tok_s: float
    ratio: float  # engine / HF
    step_ms_engine: float
    step_ms_hf: float
    bytes_per_step: float
    mbu_engine: float | None  # vs the measured bandwidth; None if not given
    weight_gbps_engine: float = 0.0  # bytes of the matmul weights / step time
    weight_gbps_hf: float = 0.0


def matmul_weight_bytes(engine: Engine) -> int:
    """Bytes of every weight a decode step multiplies by (all linear layers, the LM head included)."""
    return sum(lin.nbytes for _, lin in engine.model.linears())


def step_time(run, new_tokens: int, repeats: int, device: str = "cpu") -> float:
    """Seconds per decode step of ``run(n)`` (which generates n tokens): (median time for ``new_tokens``
    − median time for 1) / (``new_tokens`` − 1), so prefill and set-up cancel."""
    long = benchmark(lambda: run(new_tokens), warmup=1, repeats=repeats, device=device, label="N tokens")
    short = benchmark(lambda: run(1), warmup=1, repeats=repeats, device=device, label="1 token")
    return max(long.median_s - short.median_s, 1e-9) / (new_tokens - 1)


@torch.inference_mode()
def engine_vs_hf(
    engine: Engine,
    batches=(1, 8),
    new_tokens: int = 64,
    repeats: int = 3,
    bandwidth_bytes_per_s: float | None = None,
    prompt: str = PROMPT,
) -> list[DecodeRow]:
    """Decode tokens/s (all sequences together) of ``engine`` and of ``engine.hf_model.generate``."""
    if not isinstance(new_tokens, int) or new_tokens < 2:
        raise ValueError(f"new_tokens must be an int ≥ 2 (we subtract a 1-token run), got {new_tokens!r}")
    if not batches or any(not isinstance(b, int) or b <= 0 for b in batches):
        raise ValueError(f"batches must be positive ints, got {batches!r}")
    hf, tok = engine.hf_model, engine.tokenizer
    shape = ModelShape.from_config(hf.config)
    dtype = str(engine.model.dtype).removeprefix("torch.")
    ids = tok(prompt, return_tensors="pt")["input_ids"].to(engine.device)
    w_bytes = matmul_weight_bytes(engine)
    rows = []
    for b in batches:
        prompts = [prompt] * b

        def ours(n: int) -> None:
            engine.generate(prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))

        def theirs(n: int) -> None:
            hf.generate(
                input_ids=ids.expand(b, -1),
                attention_mask=torch.ones_like(ids).expand(b, -1),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )

        t_ours = step_time(ours, new_tokens, repeats, engine.device.type)
        t_hf = step_time(theirs, new_tokens, repeats, engine.device.type)
        context = ids.shape[1] + new_tokens / 2  # average keys per step
        moved = weights_read_per_step(shape, b, dtype) + kv_bytes_per_token(shape, dtype) * context * b
        mbu = moved / t_ours / bandwidth_bytes_per_s if bandwidth_bytes_per_s else None
        rows.append(
            DecodeRow(
                b,
                b / t_ours,
                b / t_hf,
                t_hf / t_ours,
                t_ours * 1e3,
                t_hf * 1e3,
                moved,
                mbu,
                w_bytes / t_ours / 1e9,
                w_bytes / t_hf / 1e9,
            )
        )
    return rows


def profile_decode_step(engine: Engine, batch: int = 1, steps: int = 20, row_limit: int = 15) -> str:
    """``torch.profiler`` table of ``steps`` decode steps at ``batch``: where a step's time goes, by op."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(batch):
        engine.add_request(PROMPT, SamplingParams(max_new_tokens=steps + 2, ignore_eos=True))
    engine.step()  # prefill
    engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit)


def format_rows(rows: list[DecodeRow], stream_gbps: float | None = None) -> str:
    head = (
        f"{'batch':>5} {'engine tok/s':>13} {'HF tok/s':>10} {'ratio':>6} {'step ms (ours/HF)':>18} {'MBU':>7} "
        f"{'weights GB/s (ours/HF)':>23}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        mbu = f"{r.mbu_engine:.1%}" if r.mbu_engine is not None else "—"
        bw = f"{r.weight_gbps_engine:6.1f} / {r.weight_gbps_hf:<6.1f}"
        if stream_gbps:
            bw += f" ({r.weight_gbps_engine / stream_gbps:.0%})"
        lines.append(
            f"{r.batch:>5} {r.engine_tok_s:>13.1f} {r.hf_tok_s:>10.1f} {r.ratio:>5.2f}x "
            f"{r.step_ms_engine:>8.2f} / {r.step_ms_hf:<7.2f} {mbu:>7} {bw:>23}"
        )
    return "\n".join(lines)


def as_dicts(rows: list[DecodeRow]) -> list[dict]:
    return [asdict(r) for r in rows]
