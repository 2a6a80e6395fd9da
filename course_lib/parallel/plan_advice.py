"""Reading a parallel plan against practice: where the model contradicts deployed serving, when TP pays.

``practice_flag`` compares a ``planning.parallel_plan`` at batch 1 with what serving engines deploy for
latency inside one NVLink node — tensor parallelism over every GPU of the node (vLLM's distributed-serving
guide: TP inside a node, PP across nodes) — and, where the model ranks another plan first, says why in its
own numbers: the weight reads TP = n saves against the all-reduce latency it adds (calls × cost per call).
A flag is a question about the model's inputs (usually α), not a verdict on practice. ``tp_break_even``
solves the decode trade-off for the weight bytes at which TP = p starts to lower the time per token: it
saves W · (1 − 1/p) / bandwidth of weight reads and pays 2 · layers all-reduces. ``tp_vs_dp`` sets one
TP = n group beside n replicas (data parallelism, TP = 1 each) for a model that fits on one GPU: the same
GPUs, the same total batch, time per token and throughput. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.parallel.alpha_beta import fmt_seconds
from course_lib.parallel.planning import ParallelEstimate, _shape, estimate


def practice_flag(plan: list[ParallelEstimate]) -> str | None:
    """None when the fastest plan that fits (lowest TPOT) is TP over all the plan's GPUs with pp = 1, as
    deployed; otherwise a sentence naming both plans and the model's reason (compute saved vs comm added)."""
    if not plan or not all(isinstance(e, ParallelEstimate) for e in plan):
        raise ValueError("plan must be a non-empty list of ParallelEstimate (from planning.parallel_plan)")
    n = max(e.tp * e.pp for e in plan)
    full = next((e for e in plan if e.tp == n and e.pp == 1), None)
    fits = [e for e in plan if e.memory.fits]
    if full is None or not fits:
        raise ValueError(f"plan must hold a fitting plan and TP={n}, pp=1 to compare with practice")
    best = min(fits, key=lambda e: e.latency_s)
    if (best.tp, best.pp) == (full.tp, full.pp) or best.latency_s >= full.latency_s:
        return None
    saved = best.pp * best.compute_s - full.compute_s
    added = full.tp_comm_s - best.pp * best.tp_comm_s - (best.pp - 1) * best.p2p_s
    calls = round(2 * _shape(full.model).num_layers)
    return (
        f"⚠ contradicts deployed practice (TP = {n} inside one NVLink node for latency): the model ranks "
        f"tp={best.tp}, pp={best.pp} ({fmt_seconds(best.latency_s)}) above tp={n} ({fmt_seconds(full.latency_s)}), "
        f"because TP={n} saves {fmt_seconds(saved)} of weight reads but adds {fmt_seconds(added)} of all-reduces "
        f"({calls} calls at {fmt_seconds(full.tp_comm_s / calls)} each): check the link's latency per call"
    )


@dataclass(frozen=True)
class BreakEven:
    """Where TP = p starts to lower the decode time per token of a model (batch fixed, one node)."""

    tp: int
    weight_bytes: float  # the break-even: above it TP = p is faster than one GPU
    comm_s: float  # what TP = p adds per token (2 · layers all-reduces)
    bandwidth: float  # bytes/s each GPU reads its weights at

    def __str__(self) -> str:
        return (
            f"TP={self.tp} lowers TPOT once the weights exceed {self.weight_bytes / 1e9:.2f} GB: it adds "
            f"{fmt_seconds(self.comm_s)} of all-reduces per token and saves (1 − 1/{self.tp}) of the weight reads "
            f"at {self.bandwidth / 1e9:.0f} GB/s"
        )


def tp_break_even(
    num_layers: int, hidden_size: int, tp: int = 2, link_key="nvlink4", *, bandwidth: float, batch: int = 1, elem=2
) -> BreakEven:
    """Weight bytes W at which a bandwidth-bound decode step gains from TP = ``tp``:
    W · (1 − 1/tp) / ``bandwidth`` = 2 · ``num_layers`` · t_all-reduce(batch · hidden · elem). ``link_key``: a
    datasheet link or a measured ``AlphaBetaFit`` (this machine's)."""
    from course_lib.parallel.interconnects import collective_time

    for name, v in (("num_layers", num_layers), ("hidden_size", hidden_size), ("tp", tp), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (2 if name == "tp" else 1):
            raise ValueError(f"{name} must be an int >= {2 if name == 'tp' else 1}, got {v!r}")
    if not (isinstance(bandwidth, (int, float)) and bandwidth > 0):
        raise ValueError(f"bandwidth must be bytes/s > 0, got {bandwidth!r}")
    comm = 2 * num_layers * collective_time("all_reduce", batch * hidden_size * elem, tp, link_key)
    return BreakEven(tp, comm * bandwidth / (1 - 1 / tp), comm, float(bandwidth))


def tp_vs_dp(model="llama-3-8b", n_gpus: int = 8, link_key="nvlink4", *, batch: int = 64, **kw):
    """(tp_group, replica): one TP = ``n_gpus`` group serving ``batch`` sequences, and one of ``n_gpus``
    replicas (TP = 1) serving batch / n_gpus each. Throughput of the replicas: n_gpus × replica.tokens_per_s."""
    if batch % n_gpus:
        raise ValueError(f"batch={batch} must split evenly over n_gpus={n_gpus} replicas")
    return estimate(model, n_gpus, 1, link_key, batch=batch, **kw), estimate(model, 1, 1, batch=batch // n_gpus, **kw)


def format_tp_vs_dp(model="llama-3-8b", n_gpus: int = 8, batches=(8, 64, 256), link_key="nvlink4", **kw) -> str:
    """TPOT and throughput of TP = n vs n replicas at several total batches."""
    head = f"{'batch':>6}{'TP TPOT':>11}{'DP TPOT':>11}{'TP tok/s':>11}{'DP tok/s':>11}"
    lines = [
        f"{model} on {n_gpus} GPUs ({link_key}): one TP={n_gpus} group vs {n_gpus} replicas",
        head,
        "-" * len(head),
    ]
    for b in batches:
        tp, rep = tp_vs_dp(model, n_gpus, link_key, batch=b, **kw)
        lines.append(
            f"{b:>6}{fmt_seconds(tp.latency_s):>11}{fmt_seconds(rep.latency_s):>11}"
            f"{tp.tokens_per_s:>11.0f}{n_gpus * rep.tokens_per_s:>11.0f}"
        )
    return "\n".join(lines)


__all__ = ["BreakEven", "format_tp_vs_dp", "practice_flag", "tp_break_even", "tp_vs_dp"]
