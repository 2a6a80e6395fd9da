"""KV offload to host memory: copy a sequence's cache out and back, or drop it and recompute it by prefill?

A server that runs out of GPU memory (preemption, a conversation that pauses between turns) can keep the
K/V in host memory (vLLM's swap space, LMCache, SGLang's hierarchical cache) or throw them away and prefill
the tokens again later. The copy costs bytes / link bandwidth (+ the link's latency): ``b · N / BW`` for N
tokens of b bytes each over PCIe. Recompute costs the prefill's FLOPs at the achieved rate F: 2 · P · N for
the weights plus 2 · layers · H · head_dim · N² for causal attention (QKᵀ and PV, half the square each).
Per token the copy is b / BW and the weight part 2P / F, so the ratio does not depend on N until attention's
N² term makes long prompts ever dearer to recompute: :func:`break_even_tokens` solves for the crossing. On
a CPU the "link" is a copy within DRAM: :func:`measure_swap` times the engine's ``PagedBackend.swap_out`` /
``swap_in`` there as the stand-in, and :func:`measure_prefill` the recompute. Introduced in
05_attention_kv_cache.ipynb."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch

from course_lib.kv.checks import check_int


def link(key: str = "pcie5_x16") -> dict:
    """One row of data/interconnects.json (GB/s per direction, latency in µs)."""
    from course_lib.core.paths import data_dir

    rows = json.loads((data_dir() / "interconnects.json").read_text())
    rows = rows["links"] if isinstance(rows, dict) else rows
    for r in rows:
        if r.get("key") == key:
            return r
    raise ValueError(
        f"link must be a key of data/interconnects.json, one of {[r.get('key') for r in rows]}, got {key!r}"
    )


@dataclass(frozen=True)
class OffloadModel:
    """What one token costs to move (bytes) and to recompute (FLOPs), and the two rates."""

    bytes_per_token: float
    params: float
    layers: int
    heads: int
    head_dim: int
    link_bytes_per_s: float
    link_latency_s: float
    flops_per_s: float

    def transfer_s(self, tokens: int) -> float:
        """One direction: bytes / bandwidth + the link's latency."""
        return self.bytes_per_token * tokens / self.link_bytes_per_s + self.link_latency_s

    def recompute_s(self, tokens: int) -> float:
        """The prefill of ``tokens`` at the achieved rate: weights plus causal attention."""
        flops = 2 * self.params * tokens + 2 * self.layers * self.heads * self.head_dim * tokens**2
        return flops / self.flops_per_s


def break_even_tokens(m: OffloadModel) -> float:
    """The prompt length past which recompute costs more than one copy back (0: the copy always wins)."""
    per_token_gap = m.bytes_per_token / m.link_bytes_per_s - 2 * m.params / m.flops_per_s  # s per token
    if per_token_gap <= 0:
        return 0.0
    return per_token_gap * m.flops_per_s / (2 * m.layers * m.heads * m.head_dim)


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def measure_swap(backend, tokens: int, repeats: int = 3) -> tuple[float, float, int]:
    """Median seconds of ``swap_out`` and of ``swap_in`` for one sequence of ``tokens`` tokens on a
    ``PagedBackend``, and the bytes each copies."""
    check_int("tokens", tokens, 1)
    outs, ins, nbytes = [], [], 0
    h = backend.allocate()
    backend.append(h, tokens)
    h = backend.swap_in(backend.swap_out(h))  # warm-up, untimed: first touches of fresh pages
    for _ in range(repeats):
        t0 = time.perf_counter()
        host = backend.swap_out(h)
        outs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        h = backend.swap_in(host)
        ins.append(time.perf_counter() - t0)
        nbytes = host.num_bytes
    backend.free(h)
    return _median(outs), _median(ins), nbytes


@torch.inference_mode()
def measure_prefill(engine, ids, repeats: int = 3) -> list[float]:
    """Seconds of the engine's prefill of ``ids`` (a fresh sequence, its K/V written), per repeat."""
    kv, out = engine.backend, []
    ids = list(ids)
    for _ in range(repeats):
        h = kv.allocate()
        try:
            kv.append(h, len(ids))
            t0 = time.perf_counter()
            engine.forward([h], [ids], [0])
            out.append(time.perf_counter() - t0)
        finally:
            kv.free(h)
    return out


def copy_verdict(prefill_s, swap_in_s: float):
    """The chapter's claim on this machine: copying the cache back beats recomputing it by ≥ 10×."""
    from course_lib.measure.claims import claim, relative_spread

    prefill_s = list(prefill_s)
    return claim(
        "on this CPU, copying the cache back beats recomputing it by ≥ 10×",
        min(prefill_s) / swap_in_s,
        at_least=10,
        why_not="a neighbour slowed the copy, or the prefill ran at a much higher FLOP rate than the copy's bandwidth",
        spread=relative_spread(prefill_s) if len(prefill_s) > 1 else None,
    )
