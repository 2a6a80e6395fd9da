"""MHA vs GQA vs MQA: the KV bytes each keeps and the decode step time each takes, predicted and measured.

A decode step is bandwidth-bound: it streams every weight once plus each sequence's whole KV cache,
2 · layers · kv_heads · head_dim · bytes per token. Queries keep all their heads and only K/V are shared
(Shazeer 2019, MQA; Ainslie et al. 2023, GQA), so the cache, and the bytes a long-context step reads,
shrink by heads / kv_heads while the weights barely change. The attention FLOPs do not shrink: with few
KV heads on a slow CPU core the step turns compute-bound (``KVHeadsRow.compute_ms``). ``kv_heads_rows``
builds random-weight models that differ only in their KV heads and times one decode step of each through
the course engine; ``plots.format_kv_rows`` / ``plots.plot_kv_heads`` show the rows.

    rows = kv_heads_rows(kv_heads=(8, 2, 1), batch=8, contexts=(256, 1024))   # bytes + predicted/measured ms

Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.kv.checks import check_int, check_ints
from course_lib.models.accounting import ModelShape, decode_flops, kv_bytes_per_token, weights_read_per_step
from course_lib.models.family import TinySpec


def attention_kind(num_heads: int, num_kv_heads: int) -> str:
    """'MHA' (one KV head per query head), 'MQA' (one KV head) or 'GQA-g' (g query heads per KV head)."""
    if num_kv_heads == num_heads:
        return "MHA"
    if num_kv_heads == 1:
        return "MQA"
    return f"GQA-{num_heads // num_kv_heads}"


def bench_spec(
    num_kv_heads: int,
    hidden_size: int = 512,
    num_layers: int = 4,
    num_heads: int = 8,
    intermediate_size: int = 1408,
    max_position: int = 2048,
) -> TinySpec:
    """The benchmark shape with ``num_kv_heads`` KV heads (``TinySpec`` checks that it divides the heads).
    Defaults: hidden 512, 4 layers, 8 heads of 64: at batch 8 × 1024 tokens the MHA cache (128 MiB fp32)
    is ~2× the 57 MiB of weights a step reads, so the KV heads decide the bytes a step moves."""
    return TinySpec(
        f"bench-kv{num_kv_heads}",
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        intermediate_size,
        max_position,
        description=f"random-weight {attention_kind(num_heads, num_kv_heads)} model for decode timing",
    )


def bench_model(spec: TinySpec, tokenizer, dtype: str = "fp32", seed: int = 0):
    """A random-weight ``LlamaForCausalLM`` of ``spec`` (speed only: its text is noise), eval mode, CPU."""
    from transformers import LlamaForCausalLM

    from course_lib.core.dtypes import torch_dtype

    if not isinstance(spec, TinySpec):
        raise ValueError(f"spec must be a TinySpec (see bench_spec), got {type(spec).__name__}")
    config = spec.to_config(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(dtype=torch_dtype(dtype)).eval()


@torch.inference_mode()
def decode_step_timing(engine, batch: int, context: int, repeats: int = 10, warmup: int = 2):
    """(``bench.Timing`` of one decode step, KV bytes the backend holds) for ``batch`` sequences that each
    attend to ``context`` keys, through the engine's own forward and KV backend. The cache is filled by
    ``append`` without a prefill (the step time does not depend on the cached values), then every timed
    call appends one token per sequence, runs ``engine.forward`` and truncates back, so each sample is the
    same step. The engine must be idle and its backend must hold ``batch`` sequences of ``context`` tokens."""
    from course_lib.measure.bench import benchmark

    check_int("batch", batch)
    check_int("context", context, 2)
    check_int("repeats", repeats)
    check_int("warmup", warmup, 0)
    if engine.has_unfinished():
        raise RuntimeError("decode_step_timing needs an idle engine")
    kv = engine.backend
    if context > kv.max_tokens_per_seq():
        raise ValueError(f"context={context} exceeds the backend's {kv.max_tokens_per_seq()} tokens per sequence")
    handles = []
    try:
        for _ in range(batch):
            handles.append(kv.allocate())
        for h in handles:
            kv.append(h, context - 1)  # the cached prefix; the step adds token number `context`
        chunks, starts = [[1]] * batch, [context - 1] * batch

        def step() -> None:
            for h in handles:
                kv.append(h, 1)
            engine.forward(handles, chunks, starts)  # (B, V) logits: every layer reads B × context keys
            for h in handles:
                kv.truncate(h, context - 1)

        for h in handles:
            kv.append(h, 1)
        used = kv.bytes_used()  # B × context tokens stored
        for h in handles:
            kv.truncate(h, context - 1)
        timing = benchmark(step, warmup=warmup, repeats=repeats, device=engine.device, label="decode step")
    finally:
        for h in handles:
            kv.free(h)
    return timing, used


def tensor_bytes_per_token(backend) -> float:
    """KV bytes per token slot measured on the backend's real tensors: the storage bytes of every K and V
    tensor over the token slots they hold (rows × max_len, read from their shapes). Not the formula: a
    backend that padded heads, kept another dtype or a second copy would show it here."""
    tensors = [*getattr(backend, "k", []), *getattr(backend, "v", [])]
    if not tensors:
        raise ValueError(f"backend {type(backend).__name__} holds no K/V tensors (allocate a sequence first)")
    t0 = tensors[0]  # (rows, Hkv, max_len, hd) per layer
    slots = t0.shape[0] * t0.shape[2]
    return sum(t.untyped_storage().nbytes() for t in tensors) / slots


@dataclass
class KVHeadsRow:
    """One (attention kind, context) point: what the cache holds, what a step must read, how long it took."""

    attention: str  # "MHA", "GQA-g", "MQA"
    num_heads: int
    num_kv_heads: int
    batch: int
    context: int
    kv_bytes_per_token: int  # formula: 2 · layers · kv_heads · head_dim · bytes
    kv_bytes_formula: int  # kv_bytes_per_token · batch · context
    kv_bytes_used: int  # the engine backend's bytes_used() at that point (its bookkeeping: tokens × formula)
    weight_bytes: float  # weights one decode step streams (accounting.weights_read_per_step)
    bytes_per_step: float  # weights + the whole KV cache
    bandwidth_gbs: float  # the bandwidth the prediction assumes
    predicted_ms: float  # bytes_per_step / bandwidth
    measured_ms: float  # median decode step
    best_ms: float
    iqr_ms: float
    threads: int = 0  # torch threads while timing
    flops_per_step: float = 0.0  # accounting.decode_flops: matmuls + attention (the same for every kv_heads)
    compute_ms: float = 0.0  # flops_per_step / the matmul peak: the floor if a step were compute-bound
    kv_tensor_bytes_per_token: float = 0.0  # measured on the K/V tensors themselves (tensor_bytes_per_token)

    @property
    def efficiency(self) -> float:
        """predicted / measured: the fraction of the assumed bandwidth the step reached."""
        return self.predicted_ms / self.measured_ms


def default_bandwidth() -> float:
    """This machine's measured STREAM bandwidth in bytes/s (``microbench.machine_peaks``, cached per machine)."""
    from course_lib.measure.microbench import machine_peaks

    return machine_peaks().bandwidth


def kv_heads_rows(
    kv_heads=(8, 2, 1),
    batch: int = 8,
    contexts=(1024,),
    *,
    hidden_size: int = 512,
    num_layers: int = 4,
    num_heads: int = 8,
    intermediate_size: int = 1408,
    dtype: str = "fp32",
    bandwidth: float | None = None,
    repeats: int = 10,
    warmup: int = 2,
    seed: int = 0,
    tokenizer=None,
    threads: int | None = None,
    peak_flops: float | None = None,
) -> list[KVHeadsRow]:
    """For each KV-head count and context: KV bytes per token (formula and backend), bytes per decode
    step, the step time predicted at ``bandwidth`` bytes/s (default: this machine's measured STREAM
    bandwidth) and the step time measured with the course engine at ``batch`` sequences. Same random
    model shape for all but the K/V projections, so the only thing that changes is the KV heads.
    ``threads``: torch threads while timing (default ``hardware.timing_threads()``, the idle cores: on a
    shared CPU more threads than free cores make every op wait at OpenMP's barrier, ~10x slower); the
    default bandwidth is the one measured with that many threads. ``peak_flops`` (default: the measured
    matmul peak) gives each row's ``compute_ms``: attention FLOPs grow with context whatever the KV heads,
    so with few KV heads on a slow core the step stops being purely bandwidth-bound."""
    from course_lib.core.paths import data_dir
    from course_lib.engine.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.measure.hardware.cores import timing_threads
    from course_lib.measure.microbench import machine_peaks
    from course_lib.models.tokenizer import load_tokenizer

    kv_heads = check_ints("kv_heads", kv_heads)
    contexts = check_ints("contexts", contexts, 2)
    check_int("batch", batch)
    bad = [k for k in kv_heads if num_heads % k]
    if bad:
        raise ValueError(f"kv_heads must divide num_heads={num_heads}, got {bad}")
    if bandwidth is not None and (
        isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or not bandwidth > 0
    ):
        raise ValueError(f"bandwidth must be a number of bytes/s > 0 (e.g. 30e9), got {bandwidth!r}")
    if peak_flops is not None and (
        isinstance(peak_flops, bool) or not isinstance(peak_flops, (int, float)) or not peak_flops > 0
    ):
        raise ValueError(f"peak_flops must be a number of FLOP/s > 0 (e.g. 1e11), got {peak_flops!r}")
    if threads is not None:
        check_int("threads", threads)
    tokenizer = tokenizer or load_tokenizer(data_dir() / "models" / "tokenizer")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads or timing_threads())
    try:
        bw = float(bandwidth) if bandwidth is not None else default_bandwidth()
        peak = float(peak_flops) if peak_flops is not None else machine_peaks().peak_flops(dtype)
        longest = max(contexts)
        rows = []
        for k in kv_heads:
            spec = bench_spec(k, hidden_size, num_layers, num_heads, intermediate_size, max_position=max(longest, 2))
            model = bench_model(spec, tokenizer, dtype, seed)
            shape = ModelShape.from_config(model.config, name=spec.name)
            engine = Engine(model, tokenizer, config=SchedulerConfig(max_num_seqs=batch, max_model_len=longest))
            per_token = int(kv_bytes_per_token(shape, dtype))
            weights = weights_read_per_step(shape, batch, dtype)
            for ctx in contexts:
                timing, used = decode_step_timing(engine, batch, ctx, repeats, warmup)
                measured_per_token = tensor_bytes_per_token(engine.backend)
                flops = decode_flops(shape, ctx, batch)
                kv = per_token * batch * ctx
                total = weights + kv
                rows.append(
                    KVHeadsRow(
                        attention_kind(num_heads, k),
                        num_heads,
                        k,
                        batch,
                        ctx,
                        per_token,
                        kv,
                        used,
                        weights,
                        total,
                        bw / 1e9,
                        total / bw * 1e3,
                        timing.median_s * 1e3,
                        timing.best_s * 1e3,
                        timing.iqr_s * 1e3,
                        torch.get_num_threads(),
                        flops,
                        flops / peak * 1e3,
                        measured_per_token,
                    )
                )
            del engine, model
        return rows
    finally:
        torch.set_num_threads(saved)


def gap_by_context(rows, num_kv_heads: int = 1) -> tuple[dict[int, float], bool]:
    """Measured − predicted step time (ms) per context for the rows with ``num_kv_heads``, and whether the gap
    is a fixed per-step cost: True when it grows by less than half its size from the shortest context to the
    longest (a gap that grows with context is attention's work, not a fixed cost)."""
    gaps = {r.context: r.measured_ms - r.predicted_ms for r in rows if r.num_kv_heads == num_kv_heads}
    if len(gaps) < 2:
        raise ValueError(f"rows must hold ≥ 2 contexts with num_kv_heads={num_kv_heads}, got {sorted(gaps)}")
    lo, hi = min(gaps), max(gaps)
    return gaps, (gaps[hi] - gaps[lo]) < 0.5 * max(abs(gaps[hi]), 1e-9)
