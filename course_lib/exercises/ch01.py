"""Exercises of 01_bottlenecks_1_roofline_overhead.ipynb and 01_bottlenecks_2_prefill_decode.ipynb: GEMV intensity, decode intensity, batch to the ridge, bound."""

from __future__ import annotations

from course_lib.bottlenecks.llm_phases import batch_to_reach, llm_phases
from course_lib.exercises import check
from course_lib.measure.claims import Verdict
from course_lib.measure.costs import gemv_cost
from course_lib.measure.hardware.datasheet import gpu_spec
from course_lib.models.accounting import ModelShape, decode_intensity


def check_gemv_intensity(answer, n: int = 4096, dtype: str = "fp16") -> Verdict:
    """Part 1, exercise 1: arithmetic intensity of an n×n matrix times a vector in ``dtype``."""
    return check(
        f"intensity of a {n}x{n} {dtype} GEMV",
        answer,
        gemv_cost(n, n, dtype).intensity,
        unit="FLOP/byte",
        hint="2·n² FLOPs over (n² + 2n) elements × bytes per element.",
    )


def check_decode_intensity(
    answer, model: str = "llama-2-7b", batch: int = 8, context_len: int = 512, dtype: str = "bf16"
) -> Verdict:
    """Part 2, exercise 1: intensity of one decode step of ``model`` at ``batch``, with the KV cache."""
    expected = decode_intensity(ModelShape.from_name(model), context_len, batch, dtype)
    return check(
        f"decode intensity of {model} at batch {batch}, context {context_len}",
        answer,
        expected,
        rtol=0.05,
        unit="FLOP/byte",
        hint="accounting.decode_flops / accounting.decode_step_bytes (the weights a step streams — only `batch` "
        "embedding rows — + every KV cache).",
    )


def check_batch_to_ridge(
    answer, model: str = "llama-2-7b", gpu: str = "H100 SXM", dtype: str = "bf16", context_len: int = 1
) -> Verdict:
    """Part 2, exercise 2: the smallest decode batch that reaches ``gpu``'s ridge point."""
    expected = batch_to_reach(gpu_spec(gpu).ridge(dtype), model, context_len=context_len, dtype=dtype)
    return check(
        f"smallest batch where {model} decode reaches the {gpu} ridge",
        answer,
        expected,
        rtol=0.0,
        hint="decode intensity ≈ batch × 2 FLOP / bytes per parameter: solve for batch, round up.",
    )


def check_bound(
    answer,
    phase: str = "prefill",
    model: str = "llama-2-7b",
    gpu: str = "A100 80GB SXM",
    batch: int = 1,
    tokens: int = 512,
) -> Verdict:
    """Part 2, exercise 3: 'memory-bound' or 'compute-bound' for ``phase`` on ``gpu``."""
    report = llm_phases(gpu, model, batch=batch, prompt_len=tokens, context_len=tokens)
    expected = (report.prefill if phase == "prefill" else report.decode).bound
    return check(
        f"{phase} of {model} (batch {batch}, {tokens} tokens) on {gpu}",
        answer,
        expected,
        hint="compare the phase's intensity with the GPU's ridge point.",
    )


def check_remeasured_decode_ms(answer_ms, model, shape, batch: int = 8, context_len: int = 512, dtype: str = "fp32"):
    """Part 2, exercise 4 (re-measure): the median time (ms) of one decode step of section 4's model at
    ``batch`` with a ``context_len``-token KV cache, measured by the learner; the check measures again."""
    from course_lib.bottlenecks.phases import time_decode
    from course_lib.exercises import check_measurement

    return check_measurement(
        f"decode step at batch {batch}, context {context_len}",
        answer_ms,
        lambda: time_decode(model, shape, batch=batch, context_len=context_len, dtype=dtype, repeats=5).median_s * 1e3,
        unit="ms",
        hint="phases.time_decode(model, shape, batch=..., context_len=..., dtype=DT).median_s * 1e3",
    )


def check_ridge_batch_here(answer, shape: ModelShape, ridge: float, context_len: int = 16, dtype: str = "fp32"):
    """Part 2, exercise 5 (your peaks): the smallest batch at which ``shape``'s decode reaches this
    machine's measured ``ridge`` (FLOP/byte)."""
    if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or ridge <= 0:
        raise ValueError(f"ridge must be a positive number of FLOP/byte, got {ridge!r}")
    return check(
        "smallest batch where this model's decode reaches this machine's ridge",
        answer,
        batch_to_reach(ridge, shape, context_len=context_len, dtype=dtype),
        rtol=0.0,
        hint="loop over batches with accounting.decode_intensity(shape, 16, b, DT) until it reaches roof.ridge.",
    )
