"""Why consistent lengths are easier to serve, and when precomputing answers beats serving them online.

In a static batch every row runs as many decode steps as the batch's longest answer (``client.serve``):
with output lengths of the same mean but a larger variance, more slots are padding. ``equal_mean_workloads``
builds two workloads with the same prompts and mean output length, one constant and one log-normal;
``static_efficiency`` predicts the useful share of the slots from the lengths alone, before anything runs.
``precompute_breakeven`` is classic ML's batch prediction (score every known input offline) against online
serving: precomputing wins when enough of the precomputed answers are used, and an LLM's inputs cannot be
enumerated at all. Decode here is overhead- or bandwidth-bound, so a padded slot costs nearly a full one.
Introduced in 02_metrics_2_throughput_utilization.ipynb (Huyen, *AI Engineering*, ch. 9).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from course_lib.measure.claims import Verdict, claim
from course_lib.measure.costs import check_positive_int
from course_lib.serving.workload import Request, prompt_of_length


def equal_mean_workloads(
    pool: Sequence[int], n: int, *, mean_output: int = 16, sigma: float = 1.0, prompt_len: int = 32, seed: int = 0
) -> tuple[list[Request], list[Request]]:
    """(constant, variable): ``n`` requests each, the same prompts; outputs all ``mean_output`` in the first,
    log-normal (``sigma``) in the second, rescaled and rounded so that both total ``n × mean_output`` tokens."""
    check_positive_int("n", n)
    check_positive_int("mean_output", mean_output)
    check_positive_int("prompt_len", prompt_len)
    if not (isinstance(sigma, (int, float)) and sigma > 0):
        raise ValueError(f"sigma must be a number > 0, got {sigma!r}")
    if mean_output < 2:
        raise ValueError(f"mean_output must be >= 2 (TPOT needs two tokens), got {mean_output}")
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(0.0, sigma, size=n)
    outs = np.maximum(2, np.rint(raw / raw.mean() * mean_output)).astype(int)
    diff = n * mean_output - int(outs.sum())  # fix the rounding on the longest answers so the totals match
    order = np.argsort(-outs)
    for i in range(abs(diff)):
        j = order[i % n]
        outs[j] += 1 if diff > 0 else (-1 if outs[j] > 2 else 0)
    prompts = [tuple(prompt_of_length(pool, prompt_len, i * prompt_len)) for i in range(n)]
    return [Request(p, mean_output) for p in prompts], [Request(p, int(m)) for p, m in zip(prompts, outs)]


def static_efficiency(output_lens: Sequence[int], batch_size: int) -> float:
    """Useful share of the decode slots when consecutive static batches of ``batch_size`` each run to their
    longest answer: Σ n_i ÷ Σ_batches (rows × max n)."""
    check_positive_int("batch_size", batch_size)
    lens = [int(x) for x in output_lens]
    if not lens or min(lens) < 1:
        raise ValueError("output_lens must be a non-empty sequence of positive ints")
    slots = sum(len(lens[i : i + batch_size]) * max(lens[i : i + batch_size]) for i in range(0, len(lens), batch_size))
    return sum(lens) / slots


def consistent_is_faster(measured_gain: float, predicted_gain: float, spread=None) -> Verdict:
    """Claim: the constant-length workload's useful tokens/s beat the variable one's by at least half the
    gain its slot efficiency predicts (1 + (predicted − 1) / 2)."""
    need = 1 + (predicted_gain - 1) / 2
    return claim(
        f"consistent lengths are easier to serve: the same mean with no variance delivers >= {need:.2f}x the "
        f"useful tokens/s (half the {predicted_gain:.2f}x the padding predicts)",
        measured_gain,
        at_least=need,
        spread=spread,
        why_not="a padded slot costs less than a full one here (the step time grows with the rows still running)",
    )


def precompute_breakeven(batch_s_per_request: float, online_s_per_request: float) -> float:
    """Share of precomputed answers that must be used for precomputing every known input in a batch job to
    cost no more per *used* answer than serving each on demand: batch cost ÷ online cost."""
    if not (batch_s_per_request > 0 and online_s_per_request > 0):
        raise ValueError("both costs must be > 0 seconds per request")
    return batch_s_per_request / online_s_per_request


def input_space_log10(vocab_size: int, prompt_tokens: int) -> float:
    """log10 of the number of distinct prompts of ``prompt_tokens`` tokens: what precomputing would enumerate."""
    check_positive_int("vocab_size", vocab_size)
    check_positive_int("prompt_tokens", prompt_tokens)
    return prompt_tokens * math.log10(vocab_size)


__all__ = [
    "consistent_is_faster",
    "equal_mean_workloads",
    "input_space_log10",
    "precompute_breakeven",
    "static_efficiency",
]
