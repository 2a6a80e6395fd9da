"""Parallel sampling (``SamplingParams.n > 1``): n samples of one prompt that share its prefill.

The request runs as one sequence until its prompt is done; in that step the engine forks it into n
sequences (``fork_samples``): each child takes the parent's KV by ``backend.fork`` (copy-on-write blocks
on the paged backend, so the prompt's K/V is stored once until a sample writes into a shared block; a
copied row on the contiguous one) and draws its first token from the parent's logits row with its own
generator (seed + j). Where the backend cannot fork now (no KV is stored, no free row, or
``max_num_seqs`` already runs), a sample is queued as an independent request of the same prompt
instead and computes its own prefill (prefix caching, when on, still shares the blocks). Sample j ≥ 1 of
request ``R`` is the sequence ``sample_id(R, j)``; ``Engine.abort(R)`` aborts all of them. vLLM's
"parallel sampling" does the same (its v0 forked on the first token; v1 fans out child requests).
Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import dataclasses

from course_lib.engine.sequence import Sequence, SequenceStatus


def sample_id(request_id, j: int):
    """The sequence id of sample ``j`` of request ``request_id`` (sample 0 is the request itself)."""
    return request_id if j == 0 else f"{request_id}/{j}"


def sample_ids(request_id, n: int) -> list:
    """The ids of all ``n`` samples of ``request_id``."""
    return [sample_id(request_id, j) for j in range(n)]


def fork_samples(engine, seq: Sequence) -> list[Sequence]:
    """Create samples 1..n−1 of ``seq`` (whose prompt was just processed). Returns those that share its KV
    and must be sampled in this step from its logits row; the others wait in the queue for their own prefill."""
    seq.forked = True
    p, backend, scheduler = seq.params, engine.backend, engine.scheduler
    now_running = []
    for j in range(1, p.n):
        params = dataclasses.replace(p, n=1, seed=None if p.seed is None else p.seed + j)
        child = Sequence(sample_id(seq.request_id, j), seq.prompt_ids, params, seq.arrival, engine.device)
        child.parent = seq.request_id
        child.first_scheduled = seq.first_scheduled
        child.grammar = seq.grammar.fresh() if seq.grammar is not None else None
        shares = (
            backend.stores_kv
            and len(scheduler.running) < engine.config.max_num_seqs
            and backend.can_allocate(0)  # a free row (contiguous); the paged backend forks without new blocks
        )
        if shares:
            child.kv = backend.fork(seq.kv)
            child.num_cached_tokens = seq.num_cached_tokens
            child.status = SequenceStatus.RUNNING
            scheduler.running.append(child)
            now_running.append(child)
        else:
            scheduler.add(child)
        engine._live[child.request_id] = child
    return now_running
