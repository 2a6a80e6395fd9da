"""Padding waste: a padded batch against length buckets and packed (varlen) prefill, counted and timed.

A framework that runs a batch as one (B, L) tensor pads every prompt to the longest: B · max(len) tokens go
through every layer, and the pads' work is thrown away. Two remedies (Xiao & Zhu, *Foundations of LLMs*, on
batching variable-length inputs): **length bucketing** sorts prompts by length and pads only within batches
of similar lengths; **packing** puts every real token of every prompt back to back in one ragged batch, with
attention kept inside each sequence, which is what the course engine's flat batch (``input_ids (N,)`` plus
per-sequence metadata) does, as vLLM's and FlashAttention's varlen kernels do. ``tokens_computed`` counts each
layout's tokens; ``time_layouts`` runs each on the engine as prefills (a padded prompt is the prompt followed
by pad tokens: the same tokens through the same layers as a padded row) and reports the median time of
``repeats`` runs with its spread. Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import statistics
import time

LAYOUTS = ("padded", "bucketed", "packed")


def _check_lengths(lengths) -> list[int]:
    lengths = list(lengths)
    if not lengths or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in lengths):
        raise ValueError(f"lengths must be a non-empty list of positive ints, got {lengths!r}")
    return lengths


def batches(lengths, layout: str, bucket_size: int = 4) -> list[list[int]]:
    """The prompt indices of each forward: one padded batch of all, buckets of ``bucket_size`` prompts sorted
    by length, or one packed batch."""
    lengths = _check_lengths(lengths)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not isinstance(bucket_size, int) or bucket_size < 1:
        raise ValueError(f"bucket_size must be a positive int, got {bucket_size!r}")
    idx = list(range(len(lengths)))
    if layout == "bucketed":
        idx.sort(key=lambda i: lengths[i])
        return [idx[k : k + bucket_size] for k in range(0, len(idx), bucket_size)]
    return [idx]


def tokens_computed(lengths, layout: str, bucket_size: int = 4) -> int:
    """Tokens that go through the layers: each batch's size × its longest prompt, or the real tokens packed."""
    lengths = _check_lengths(lengths)
    if layout == "packed":
        return sum(lengths)
    return sum(len(b) * max(lengths[i] for i in b) for b in batches(lengths, layout, bucket_size))


def time_layouts(engine, prompts: list[list[int]], pad_id: int, bucket_size: int = 4, repeats: int = 3) -> dict:
    """{layout: {"tokens", "s", "spread"}}: each layout's prefills on ``engine`` (one output token each, so
    the time is the prefill), median of ``repeats`` rounds (layouts interleaved) and its relative spread."""
    from course_lib.engine import SamplingParams
    from course_lib.measure.claims import relative_spread

    if not prompts or not all(prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token id lists")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    lengths = [len(p) for p in prompts]
    total = tokens_computed(lengths, "padded")
    budget = engine.config.max_num_batched_tokens
    if total > budget:
        raise ValueError(f"the padded batch ({total} tokens) must fit one step ({budget} max_num_batched_tokens)")
    params = SamplingParams(max_new_tokens=1, ignore_eos=True)
    plan = {}
    for layout in LAYOUTS:
        runs = []
        for b in batches(lengths, layout, bucket_size):
            width = max(lengths[i] for i in b)
            pad = layout != "packed"
            runs.append([list(prompts[i]) + [pad_id] * (width - lengths[i]) * pad for i in b])
        plan[layout] = runs
    engine.generate(plan["packed"][0], params)  # warm-up
    times = {layout: [] for layout in LAYOUTS}
    for _ in range(repeats):
        for layout in LAYOUTS:
            t0 = time.perf_counter()
            for run in plan[layout]:
                engine.generate(run, params)
            times[layout].append(time.perf_counter() - t0)
    return {
        layout: {
            "tokens": tokens_computed(lengths, layout, bucket_size),
            "s": statistics.median(times[layout]),
            "spread": relative_spread(times[layout]),
        }
        for layout in LAYOUTS
    }


def saved_share(results: dict) -> float:
    """The notebook's verdict quantity: (padded ÷ packed time − 1) ÷ (padded ÷ packed tokens − 1), the share of
    the padding's predicted cost that packing saved (1 = time follows the tokens exactly)."""
    token_ratio = results["padded"]["tokens"] / results["packed"]["tokens"]
    if token_ratio <= 1:
        raise ValueError("the padded batch has no padding (all prompts the same length): nothing to save")
    return (results["padded"]["s"] / results["packed"]["s"] - 1) / (token_ratio - 1)
