"""The colocated baseline at its best: chunked prefill (Sarathi-Serve) in the scale model of ``simulate``.

Each step of a GPU carries every running decode's next token plus prompt chunks that fill the rest of a
per-step token budget, so a 2,048-token prompt no longer stalls the decodes for its whole prefill: it is
spread over several steps, each a little longer than a pure decode step. A step's time is the roofline
bound of what it carries: max(FLOPs / peak, bytes / bandwidth), with the FLOPs of the decodes plus the
chunks (a chunk at offset o of c tokens costs ``prefill_flops(o + c) − prefill_flops(o)``, its attention to
the earlier chunks included) and the bytes of the weights once, the decodes' KV and the chunks' prefix KV.
``best_chunk_budget`` picks the budget with the highest goodput per GPU over a few candidates, so the
baseline the split setup is compared with is tuned as a practitioner would tune it.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from collections import deque

import numpy as np

from course_lib.measure.metrics import SLO
from course_lib.serving.disagg.simulate import SimConfig, SimResult, _arrivals, _Costs


def _step_time(costs: _Costs, contexts: list[int], pieces: list[tuple[int, int]]) -> float:
    """One mixed step: decodes at ``contexts`` plus prompt chunks (offset, tokens)."""
    from course_lib.models.accounting import decode_flops, prefill_flops, weights_read_per_step

    shape, dt = costs.shape, costs.cfg.dtype
    flops = decode_flops(shape, max(contexts), len(contexts)) if contexts else 0.0
    for off, c in pieces:
        flops += prefill_flops(shape, off + c) - (prefill_flops(shape, off) if off else 0.0)
    tokens = len(contexts) + sum(c for _, c in pieces)
    by = weights_read_per_step(shape, tokens, dt) + costs.kv_per_token * (
        sum(contexts) + sum(off + c for off, c in pieces)
    )
    return max(flops / costs.flops, by / costs.bw)


def simulate_colocated_chunked(cfg: SimConfig, rate: float, num_gpus: int = 1, budget: int = 512) -> SimResult:
    """``num_gpus`` GPUs each doing both phases (requests round-robin) with chunked prefill: each step holds
    the running decodes (one token each) and prompt chunks, first come first served, up to ``budget`` tokens."""
    for name, v in (("num_gpus", num_gpus), ("budget", budget)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    costs = _Costs(cfg)
    arr = _arrivals(cfg, rate)
    n = len(arr)
    first, last, itl = np.zeros(n), np.zeros(n), np.zeros(n)
    P, T = cfg.prompt_len, cfg.output_len
    for g in range(num_gpus):
        mine = deque(range(g, n, num_gpus))
        waiting: deque = deque()
        done: dict[int, int] = {}  # prompt tokens prefilled so far
        running: list[list] = []  # [id, context, generated, last token time]
        t = 0.0
        while mine or waiting or running:
            while mine and arr[mine[0]] <= t:
                waiting.append(mine.popleft())
            if not waiting and not running:
                t = arr[mine[0]]
                continue
            left = max(0, budget - len(running))
            pieces, ids = [], []
            for i in waiting:
                if left == 0 or len(running) + len(ids) >= cfg.max_batch:
                    break
                c = min(left, P - done.get(i, 0))
                pieces.append((done.get(i, 0), c))
                ids.append(i)
                left -= c
            t += _step_time(costs, [r[1] for r in running], pieces)
            for r in running:
                itl[r[0]] = max(itl[r[0]], t - r[3])
                r[1], r[2], r[3] = r[1] + 1, r[2] + 1, t
                if r[2] == T:
                    last[r[0]] = t
            running = [r for r in running if r[2] < T]
            for i, (off, c) in zip(ids, pieces):
                done[i] = off + c
                if done[i] == P:
                    waiting.remove(i)
                    first[i] = t
                    if T == 1:
                        last[i] = t
                    else:
                        running.append([i, P + 1, 1, t])
    tpot = (last - first) / max(T - 1, 1)
    return SimResult(f"colocated ×{num_gpus}, chunked {budget}", float(rate), num_gpus, first - arr, tpot, itl, 0.0)


def best_chunk_budget(cfg: SimConfig, rates, num_gpus: int, slo: SLO, budgets=(256, 512, 1024, 2048)) -> int:
    """The budget whose sweep over ``rates`` reaches the highest rate at ≥ 90% SLO attainment (ties: the
    larger total attainment), the chunked baseline at its best for this SLO."""
    if not budgets or any(not isinstance(b, int) or b <= 0 for b in budgets):
        raise ValueError(f"budgets must be positive ints, got {budgets!r}")

    def score(b):
        att = [simulate_colocated_chunked(cfg, r, num_gpus, b).attainment(slo) for r in rates]
        return (max((r for r, a in zip(rates, att) if a >= 0.9), default=0.0), sum(att))

    return max(budgets, key=score)
