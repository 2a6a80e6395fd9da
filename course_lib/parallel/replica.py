"""Replica parallelism (data parallel for serving): N independent engines, each holding the whole model,
each serving its share of the requests. Nothing is communicated between replicas, so each one's step is
exactly a single engine's (bandwidth-bound decode, compute-bound prefill); throughput grows with N as long
as each replica has hardware of its own, and a request's latency does not improve at all. The router's job
is the only new part: round-robin spreads requests evenly by *count*, least-loaded by *work*
(prompt + max_new_tokens tokens), which matters when requests differ in size.

Honest about this machine: on a 2-core CPU, 2 replicas with one thread each get one core each, and the
1-replica baseline also runs with one thread (``threads_per_worker=1``), leaving the other core idle. So
"2 replicas vs 1" here measures what a second copy of the engine on a second core buys — the picture of
a second GPU — not what 2 threads in one engine would do. When other processes share the cores, the two
replicas compete with them and the speed-up falls below 2. Introduced in 07_parallelism.ipynb.

    res = serve_replicas("tiny-target", prompts, n_replicas=2, policy="least_loaded")
    res.tokens_per_s, res.output_ids[0]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from course_lib.engine.sampling import SamplingParams

POLICIES = ("round_robin", "least_loaded")


# ----------------------------------------------------------------------------- the router (pure)
def assign(costs: Sequence[int], n_replicas: int, policy: str = "round_robin") -> list[list[int]]:
    """Request indices per replica, requests taken in arrival order. ``round_robin``: request i → replica
    i mod N. ``least_loaded``: each request → the replica with the least work (sum of ``costs``) so far,
    the lowest index on a tie."""
    if isinstance(n_replicas, bool) or not isinstance(n_replicas, int) or n_replicas < 1:
        raise ValueError(f"n_replicas must be an int >= 1, got {n_replicas!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if any(isinstance(c, bool) or not isinstance(c, (int, float)) or c < 0 for c in costs):
        raise ValueError(f"costs must be numbers >= 0, got {list(costs)!r:.80}")
    out: list[list[int]] = [[] for _ in range(n_replicas)]
    load = [0] * n_replicas
    for i, c in enumerate(costs):
        r = i % n_replicas if policy == "round_robin" else min(range(n_replicas), key=lambda k: (load[k], k))
        out[r].append(i)
        load[r] += c
    return out


# ----------------------------------------------------------------------------- the worker side
def replica_worker(
    rank: int,
    world_size: int,
    model,
    prompts: list,
    params: list[SamplingParams],
    assignment: list[list[int]],
    max_num_seqs: int = 8,
    linear: str = "auto",
    probes: list[list[int]] | None = None,
) -> dict:
    """Per rank (under ``launch``): one engine serves requests ``assignment[rank]`` after a short warm-up.
    Times run from rank 0's instant after a barrier (``perf_counter`` is one system-wide clock). ``probes``
    (one replica only): afterwards the same engine serves each of these shares alone, timed ("probe_s")."""
    import torch.distributed as dist

    from course_lib.engine import Engine, SchedulerConfig

    engine = Engine(model, config=SchedulerConfig(policy="continuous", max_num_seqs=max_num_seqs), linear=linear)
    mine = assignment[rank]
    if mine:  # warm-up: first calls pay for allocation and weight packing
        engine.generate([prompts[mine[0]]], SamplingParams(max_new_tokens=2, ignore_eos=True))
    dist.barrier()
    t0 = torch.tensor([time.perf_counter()], dtype=torch.float64)
    dist.broadcast(t0, src=0)
    results = engine.generate([prompts[i] for i in mine], [params[i] for i in mine]) if mine else []
    elapsed = time.perf_counter() - t0.item()
    probe_s = []
    for share in probes or []:
        t1 = time.perf_counter()
        engine.generate([prompts[i] for i in share], [params[i] for i in share])
        probe_s.append(time.perf_counter() - t1)
    return {
        "indices": mine,
        "output_ids": [r.output_ids for r in results],
        "elapsed_s": elapsed if mine else 0.0,
        "tokens": sum(len(r.output_ids) for r in results),
        "probe_s": probe_s,
    }


# ----------------------------------------------------------------------------- the caller side
@dataclass
class ReplicaResult:
    """Outputs in request order, who served what, and the throughput of the whole group."""

    output_ids: list[list[int]]
    assignment: list[list[int]]
    replica_s: list[float]  # each replica's time from the common start to its last token
    tokens: int  # generated tokens over all requests
    probe_s: list[float] | None = None  # one replica, probe_split=k: the same engine serving each k-way share alone

    @property
    def ideal_speedup(self) -> float | None:
        """With ``probe_split`` = k: what k replicas could gain at best, from this engine's own times — the
        whole load over the slowest share alone (T(all) / max T(share)), not k: an engine that already
        batches every request gains little from splitting them."""
        if not self.probe_s:
            return None
        return self.wall_s / max(self.probe_s)

    @property
    def wall_s(self) -> float:
        """The group is done when its slowest replica is."""
        return max(self.replica_s)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def _prompt_lengths(model, prompts) -> list[int]:
    """Tokens per prompt: id lists as they are, strings through the model's tokenizer."""
    if not any(isinstance(p, str) for p in prompts):
        return [len(p) for p in prompts]
    from transformers import AutoTokenizer

    from course_lib.models.load import resolve

    kind, path = resolve(model)
    tok = AutoTokenizer.from_pretrained(str(path) if path is not None else str(model))
    return [len(tok(p)["input_ids"]) if isinstance(p, str) else len(p) for p in prompts]


def serve_replicas(
    model,
    prompts,
    n_replicas: int = 2,
    policy: str = "round_robin",
    params: SamplingParams | list[SamplingParams] | None = None,
    *,
    max_num_seqs: int = 8,
    linear: str = "auto",
    threads_per_worker: int = 1,
    timeout_s: float = 180.0,
    probe_split: int = 0,
) -> ReplicaResult:
    """Serve ``prompts`` (strings or token-id lists) on ``n_replicas`` engine processes (``model``: an embedded
    name or a folder, loaded by each), routed by ``policy``. Outputs equal one engine's for the same params.
    ``probe_split`` = k (with one replica): the engine then also serves alone each share that ``policy``
    would give k replicas, so ``ideal_speedup`` comes from its own times."""
    from course_lib.parallel.launcher import launch

    if not isinstance(model, (str, Path)):
        raise ValueError("model must be an embedded name or a folder: each replica process loads its own copy")
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings or token-id lists")
    if params is None or isinstance(params, SamplingParams):
        plist = [params or SamplingParams()] * len(prompts)
    elif isinstance(params, (list, tuple)) and len(params) == len(prompts):
        plist = list(params)
    else:
        raise ValueError("params must be one SamplingParams or a list with one per prompt")
    lens = _prompt_lengths(model, prompts)
    costs = [n + p.max_new_tokens for n, p in zip(lens, plist)]
    assignment = assign(costs, n_replicas, policy)
    if isinstance(probe_split, bool) or not isinstance(probe_split, int) or probe_split < 0:
        raise ValueError(f"probe_split must be an int >= 0, got {probe_split!r}")
    if probe_split and n_replicas != 1:
        raise ValueError(f"probe_split needs n_replicas=1 (one engine times the shares), got n_replicas={n_replicas}")
    probes = assign(costs, probe_split, policy) if probe_split else None
    results = launch(
        replica_worker,
        n_replicas,
        model,
        list(prompts),
        plist,
        assignment,
        max_num_seqs,
        linear,
        probes,
        threads_per_worker=threads_per_worker,
        timeout_s=timeout_s,
    )
    outputs: list[list[int]] = [[] for _ in prompts]
    for r in results:
        for i, out in zip(r["indices"], r["output_ids"]):
            outputs[i] = out
    return ReplicaResult(
        outputs,
        assignment,
        [r["elapsed_s"] for r in results],
        sum(r["tokens"] for r in results),
        results[0]["probe_s"] if probes else None,
    )


__all__ = ["POLICIES", "ReplicaResult", "assign", "replica_worker", "serve_replicas"]
