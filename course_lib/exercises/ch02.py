"""Exercises of chapter 02 (02_metrics_1_latency.ipynb, 02_metrics_2_throughput_utilization.ipynb): TTFT/TPOT from a trace, MBU from a published speed, goodput, percentiles,
and the roofline's version of Anyscale's "100 input tokens ≈ 1 output token"."""

from __future__ import annotations

from course_lib.bottlenecks.time_floors import output_input_ratio
from course_lib.core.dtypes import dtype_bytes
from course_lib.exercises import check
from course_lib.measure.claims import Verdict
from course_lib.measure.hardware.datasheet import gpu_spec
from course_lib.measure.metrics import SLO, RequestTrace, mbu, percentiles, summarize
from course_lib.models.accounting import ModelShape, param_count


def exercise_trace() -> RequestTrace:
    """Exercise 1's request: arrives at t = 10 s, six tokens stream out (times in seconds)."""
    return RequestTrace("ex1", arrival=10.0, prompt_tokens=400, token_times=[10.45, 10.49, 10.55, 10.58, 10.64, 10.70])


def check_ttft_tpot(ttft_ms, tpot_ms) -> Verdict:
    """Exercise 1: TTFT and TPOT (both in ms) of ``exercise_trace()``."""
    trace = exercise_trace()
    ok_ttft = check(
        "TTFT of the trace", ttft_ms, trace.ttft * 1e3, unit="ms", hint="TTFT = first token time − arrival."
    )
    ok_tpot = check(
        "TPOT of the trace",
        tpot_ms,
        trace.tpot * 1e3,
        unit="ms",
        hint="TPOT = (last − first token time) / (tokens − 1): the first token is not a decode gap.",
    )
    return ok_ttft and ok_tpot


def mbu_expected(
    model: str = "llama-2-7b", gpu: str = "A100 80GB SXM", dtype: str = "int8", tokens_per_s: float = 170.8
) -> float:
    """MBU of a batch-1 decode at ``tokens_per_s`` with every parameter stored in ``dtype`` (KV cache ignored)."""
    return mbu(param_count(ModelShape.from_name(model)), dtype_bytes(dtype), tokens_per_s, gpu_spec(gpu).bandwidth)


def check_mbu(
    answer, model: str = "llama-2-7b", gpu: str = "A100 80GB SXM", dtype: str = "int8", tokens_per_s: float = 170.8
) -> Verdict:
    """Exercise 2: MBU (a fraction, not %) of ``model`` decoding at ``tokens_per_s`` on ``gpu`` in ``dtype``."""
    return check(
        f"MBU of {model} {dtype} at {tokens_per_s} tok/s on {gpu}",
        answer,
        mbu_expected(model, gpu, dtype, tokens_per_s),
        rtol=0.03,
        hint="params × bytes/param × tokens/s ÷ bandwidth (bytes/s); give a fraction such as 0.5.",
    )


def exercise_traces() -> list[RequestTrace]:
    """Exercise 3's six requests (times in seconds)."""
    spec = [  # (arrival, first token, tokens, seconds between tokens)
        (0.0, 0.30, 11, 0.05),
        (0.5, 1.40, 11, 0.05),  # slow first token
        (1.0, 1.25, 21, 0.15),  # slow stream
        (1.5, 1.80, 6, 0.08),
        (2.0, 2.20, 1, 0.00),  # one token: only TTFT is judged
        (2.5, 2.90, 16, 0.09),
    ]
    return [RequestTrace(i, a, 100, [f + k * dt for k in range(n)]) for i, (a, f, n, dt) in enumerate(spec)]


EXERCISE_SLO = SLO(ttft_s=0.5, tpot_s=0.1)


def check_goodput(answer) -> Verdict:
    """Exercise 3: goodput in requests/s of ``exercise_traces()`` under ``EXERCISE_SLO`` (window: first
    arrival → last token, as ``summarize`` uses by default)."""
    expected = summarize(exercise_traces(), slo=EXERCISE_SLO).goodput_rps
    return check(
        "goodput of the six requests",
        answer,
        expected,
        unit="req/s",
        hint="count requests with TTFT ≤ 0.5 s and TPOT ≤ 0.1 s, divide by (last token time − first arrival).",
    )


EXERCISE_LATENCIES_S = (0.8, 0.9, 1.0, 0.85, 1.1, 0.95, 1.2, 0.9, 1.0, 12.0)


def check_p50_mean(p50, mean) -> Verdict:
    """Exercise 4: median and mean (s) of ``EXERCISE_LATENCIES_S``."""
    ok_p50 = check(
        "p50 latency",
        p50,
        percentiles(EXERCISE_LATENCIES_S, (50,))[50],
        unit="s",
        hint="sort the ten values and average the 5th and 6th (numpy's linear interpolation).",
    )
    ok_mean = check("mean latency", mean, sum(EXERCISE_LATENCIES_S) / len(EXERCISE_LATENCIES_S), unit="s")
    return ok_p50 and ok_mean


def ratio_expected(model: str = "llama-2-7b", gpu: str = "H200 SXM", dtype: str = "bf16") -> float:
    spec = gpu_spec(gpu)
    return output_input_ratio(ModelShape.from_name(model), spec.peak_flops(dtype), spec.bandwidth, dtype)


def check_ratio(answer, model: str = "llama-2-7b", gpu: str = "H200 SXM", dtype: str = "bf16") -> Verdict:
    """Exercise 5: by the datasheet roofline, one batch-1 decode step of ``model`` costs as much time
    as how many compute-bound prefill tokens on ``gpu``?"""
    return check(
        f"input tokens per output token, {model} {dtype} on {gpu}",
        answer,
        ratio_expected(model, gpu, dtype),
        rtol=0.05,
        hint="decode step: weight bytes it streams (accounting.weights_read_per_step) ÷ bandwidth. "
        "One prefill token: 2 × params ÷ peak FLOP/s.",
    )


# ----------------------------------------------------------------------------- exercises that measure
def _shape(model: str) -> ModelShape:
    """An embedded model's shape (``data/models``) or a preset's (``ModelShape.from_name``)."""
    from course_lib.models.load import EMBEDDED

    return ModelShape.from_embedded(model) if model in EMBEDDED else ModelShape.from_name(model)


def check_weight_stream_ms(answer, bandwidth: float, model: str = "tiny-target", dtype: str = "fp32") -> Verdict:
    """Part 1, exercise 4 (your peaks): the least batch-1 step time (ms) that streaming ``model``'s
    weights once allows at the learner's measured ``bandwidth`` (bytes/s)."""
    from course_lib.models.accounting import weight_bytes

    if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or bandwidth <= 0:
        raise ValueError(f"bandwidth must be a positive number of bytes/s, got {bandwidth!r}")
    return check(
        f"{model} {dtype} weights streamed once at this machine's bandwidth",
        answer,
        weight_bytes(_shape(model), dtype) / bandwidth * 1e3,
        unit="ms",
        hint="accounting.weight_bytes(shape, 'fp32') / BW, times 1e3 for milliseconds.",
    )


def check_remeasured_ttft(answer_ms, engine, pool, n_tokens: int = 900, rtol: float = 0.35) -> Verdict:
    """Part 1, exercise 3 (re-measure): the learner predicts the TTFT (ms) of an ``n_tokens`` prompt
    from their section-1 measurements; the check measures it and accepts within ``rtol``. ``engine``
    is an engine, or a function of no arguments that builds one: called only once there is an answer
    to check (the notebook has freed the chat model's engine by then)."""
    from course_lib.exercises import check_measurement
    from course_lib.serving import ttft_sweep

    if not hasattr(engine, "generate") and not callable(engine):
        raise ValueError(f"engine must be an Engine or a function that returns one, got {type(engine).__name__}")

    def measure() -> float:
        eng = engine if hasattr(engine, "generate") else engine()
        return ttft_sweep(eng, pool, [n_tokens], repeats=3)[0].ttft_s * 1e3

    return check_measurement(
        f"TTFT of a {n_tokens}-token prompt",
        answer_ms,
        measure,
        rtol=rtol,
        unit="ms",
        hint="prefill_flops(shape, n_tokens) / prefill_rate, with the rate measured at the longest live prompt.",
    )


def check_remeasured_throughput(
    answer, engine, pool, batch: int = 8, prompt_len: int = 512, new_tokens: int = 32, rtol: float = 0.35
) -> Verdict:
    """Part 2, exercise 4 (re-measure): decode tokens/s at ``batch`` with ``prompt_len``-token
    prompts, measured by the learner; the check measures it again."""
    from course_lib.exercises import check_measurement
    from course_lib.serving import tpot_sweep

    return check_measurement(
        f"decode throughput at batch {batch} with {prompt_len}-token prompts",
        answer,
        lambda: tpot_sweep(engine, pool, [batch], prompt_len=prompt_len, new_tokens=new_tokens)[0].decode_tokens_per_s,
        rtol=rtol,
        unit="tok/s",
        hint="use run.decode_tokens_per_s of serving.tpot_sweep's result.",
    )


def check_ratio_on_this_machine(
    answer, peak_flops: float, bandwidth: float, model: str = "tiny-target", dtype: str = "fp32"
) -> Verdict:
    """Part 2, exercise 5 (your peaks): the roofline's output/input token ratio on the learner's
    measured peaks."""
    for name, v in (("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    return check(
        f"output/input token ratio of {model} {dtype} on this machine",
        answer,
        output_input_ratio(_shape(model), peak_flops, bandwidth, dtype),
        hint="time_floors.output_input_ratio(shape, PEAK, BW, DT).",
    )
