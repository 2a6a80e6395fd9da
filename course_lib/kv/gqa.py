"""MHA vs GQA vs MQA: how many KV heads a model keeps, what that saves, and how to get there by uptraining.

    rows = kv_heads_rows(kv_heads=(8, 2, 1), batch=8, contexts=(256, 1024))   # bytes + predicted/measured ms
    mqa = convert_kv_heads(hf_model, 1)                                        # mean-pool K/V heads (Ainslie 2023)
    log = uptrain(mqa, tokenizer, steps=200)                                   # brief continued pre-training
    python -m course_lib.kv.gqa uptrain --kv-heads 1 --steps 200 --out data/models/tiny-target-mqa

A decode step is bandwidth-bound: it streams every weight once plus each sequence's whole KV cache,
2 · layers · kv_heads · head_dim · bytes per token. Queries keep all their heads; only K/V are shared
(Shazeer 2019, MQA; Ainslie et al. 2023, GQA), so the cache, and the bytes a long-context step reads,
shrink by heads / kv_heads while the weights barely change (the attention FLOPs do not: with few KV heads
on a slow CPU core the step turns compute-bound, ``KVHeadsRow.compute_ms``). The price is quality: a checkpoint trained
with H KV heads converted by mean-pooling each group's K and V projections loses some, and a short
continued pre-training ("uptraining", ~5% of the original steps in the paper) wins most of it back.
Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from course_lib.models.accounting import ModelShape, decode_flops, kv_bytes_per_token, weights_read_per_step
from course_lib.models.family import TinySpec

#: where the shipped MQA uptrained from tiny-target lives (``load_uptrained`` reads it)
UPTRAINED_NAME = "tiny-target-mqa"


def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_ints(name: str, values, minimum: int = 1) -> tuple[int, ...]:
    if isinstance(values, int) and not isinstance(values, bool):
        values = (values,)
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{name} must be a non-empty list of ints >= {minimum}, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{name} must be a non-empty list of ints >= {minimum}, got {values!r}")
    return tuple(values)


def attention_kind(num_heads: int, num_kv_heads: int) -> str:
    """'MHA' (one KV head per query head), 'MQA' (one KV head) or 'GQA-g' (g query heads per KV head)."""
    if num_kv_heads == num_heads:
        return "MHA"
    if num_kv_heads == 1:
        return "MQA"
    return f"GQA-{num_heads // num_kv_heads}"


# ============================================================================ 1. bytes and decode time
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

    _check_int("batch", batch)
    _check_int("context", context, 2)
    _check_int("repeats", repeats)
    _check_int("warmup", warmup, 0)
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
    kv_bytes_used: int  # the engine backend's bytes_used() at that point (must equal the formula)
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

    @property
    def efficiency(self) -> float:
        """predicted / measured: the fraction of the assumed bandwidth the step reached."""
        return self.predicted_ms / self.measured_ms


def default_bandwidth() -> float:
    """This machine's measured STREAM bandwidth in bytes/s (``hardware.machine_peaks``, cached per machine)."""
    from course_lib.measure.hardware import machine_peaks

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
    from course_lib.measure.hardware import machine_peaks, timing_threads
    from course_lib.models.train import load_tokenizer

    kv_heads = _check_ints("kv_heads", kv_heads)
    contexts = _check_ints("contexts", contexts, 2)
    _check_int("batch", batch)
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
        _check_int("threads", threads)
    tokenizer = tokenizer or load_tokenizer(data_dir() / "models" / "tokenizer")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads or timing_threads())
    try:
        bw = float(bandwidth) if bandwidth is not None else default_bandwidth()
        peak = float(peak_flops) if peak_flops is not None else machine_peaks().peak_flops(dtype)
        return _measure_rows(
            kv_heads,
            batch,
            contexts,
            hidden_size,
            num_layers,
            num_heads,
            intermediate_size,
            dtype,
            bw,
            peak,
            repeats,
            warmup,
            seed,
            tokenizer,
        )
    finally:
        torch.set_num_threads(saved)


def _measure_rows(
    kv_heads,
    batch,
    contexts,
    hidden_size,
    num_layers,
    num_heads,
    intermediate_size,
    dtype,
    bw,
    peak,
    repeats,
    warmup,
    seed,
    tokenizer,
) -> list[KVHeadsRow]:
    from course_lib.engine.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig

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
                )
            )
        del engine, model
    return rows


def format_kv_rows(rows: list[KVHeadsRow]) -> str:
    """A text table: prediction before measurement, as every chapter prints them."""
    head = (
        f"{'attention':>9} {'kv heads':>8} {'context':>7} {'KV/token':>9} {'KV MiB':>8} {'weights MiB':>11} "
        f"{'predicted ms':>12} {'compute ms':>10} {'measured ms':>11} {'of bw':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.attention:>9} {r.num_kv_heads:>8} {r.context:>7} {r.kv_bytes_per_token / 1024:>7.1f}Ki "
            f"{r.kv_bytes_used / 2**20:>8.1f} {r.weight_bytes / 2**20:>11.1f} {r.predicted_ms:>12.2f} "
            f"{r.compute_ms:>10.2f} "
            f"{r.measured_ms:>11.2f} {r.efficiency:>6.0%}"
        )
    return "\n".join(lines)


def plot_kv_heads(rows: list[KVHeadsRow], ax=None):
    """Decode step time vs context, one colour per attention kind: measured (solid, IQR band) beside the
    bandwidth prediction (dashed). With a single context, grouped bars instead. Returns the axes."""
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("rows must be a non-empty list of KVHeadsRow (from kv_heads_rows)")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    kinds = list(dict.fromkeys(r.attention for r in rows))
    contexts = sorted({r.context for r in rows})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(contexts) == 1:
        width = 0.38
        for i, kind in enumerate(kinds):
            r = next(r for r in rows if r.attention == kind)
            ax.bar(i - width / 2, r.predicted_ms, width, color=colours[i % len(colours)], alpha=0.35, hatch="//")
            ax.bar(i + width / 2, r.measured_ms, width, color=colours[i % len(colours)], yerr=r.iqr_ms / 2)
        ax.set_xticks(
            range(len(kinds)), [f"{k}\n({next(r for r in rows if r.attention == k).num_kv_heads} KV)" for k in kinds]
        )
        ax.bar(0, 0, color="grey", alpha=0.35, hatch="//", label="predicted (bytes / bandwidth)")
        ax.bar(0, 0, color="grey", label="measured (median)")
        ax.set_title(f"decode step, batch {rows[0].batch}, context {contexts[0]}")
    else:
        for i, kind in enumerate(kinds):
            mine = sorted((r for r in rows if r.attention == kind), key=lambda r: r.context)
            x = [r.context for r in mine]
            c = colours[i % len(colours)]
            ax.plot(x, [r.measured_ms for r in mine], "o-", color=c, label=f"{kind} measured")
            ax.fill_between(
                x,
                [r.measured_ms - r.iqr_ms / 2 for r in mine],
                [r.measured_ms + r.iqr_ms / 2 for r in mine],
                color=c,
                alpha=0.15,
            )
            ax.plot(x, [r.predicted_ms for r in mine], "--", color=c, label=f"{kind} predicted")
        ax.set_xlabel("context (tokens per sequence)")
        ax.set_title(f"decode step time vs context, batch {rows[0].batch}")
    ax.set_ylabel("ms per decode step")
    ax.legend(fontsize=8)
    return ax


# ============================================================================ 2. conversion
def _attention_modules(hf_model):
    layers = getattr(getattr(hf_model, "model", None), "layers", None)
    if layers is None:
        raise ValueError("hf_model must be a Llama-family causal LM (model.model.layers[i].self_attn)")
    return [layer.self_attn for layer in layers]


def pool_kv_weight(weight: torch.Tensor, old_kv_heads: int, new_kv_heads: int) -> torch.Tensor:
    """Mean of the grouped heads' rows. ``weight`` (old_kv_heads·hd, D) (or a bias, (old_kv_heads·hd,)) →
    (new_kv_heads·hd, D). New head j averages old heads j·r … j·r + r − 1 (r = old / new): the same
    contiguous grouping that maps query heads to KV heads, so every query head keeps attending to the
    average of the heads it (and its neighbours) used before."""
    r = old_kv_heads // new_kv_heads
    hd = weight.shape[0] // old_kv_heads
    rest = weight.shape[1:]
    grouped = weight.reshape(new_kv_heads, r, hd, *rest)  # (new, r, hd, D)
    return grouped.mean(dim=1).reshape(new_kv_heads * hd, *rest)  # (new·hd, D)


def check_new_kv_heads(config, new_kv_heads) -> int:
    """Raise ValueError unless ``new_kv_heads`` is a positive int dividing the current KV heads (and heads)."""
    heads = config.num_attention_heads
    old = getattr(config, "num_key_value_heads", None) or heads
    if isinstance(new_kv_heads, bool) or not isinstance(new_kv_heads, int) or new_kv_heads <= 0:
        raise ValueError(
            f"new_kv_heads must be a positive int dividing the current {old} KV heads, got {new_kv_heads!r}"
        )
    if heads % new_kv_heads:
        raise ValueError(f"new_kv_heads={new_kv_heads} must divide num_attention_heads={heads}")
    if old % new_kv_heads:
        raise ValueError(
            f"new_kv_heads={new_kv_heads} must divide the current num_key_value_heads={old} "
            f"(mean-pooling merges whole groups of heads; valid: {[d for d in range(1, old + 1) if old % d == 0]})"
        )
    return new_kv_heads


@torch.no_grad()
def convert_kv_heads(hf_model, new_kv_heads: int):
    """A new model like ``hf_model`` with ``num_key_value_heads = new_kv_heads``: each new K (and V) head is
    the mean of the old heads of its group (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query
    Transformer Models from Multi-Head Checkpoints"); every other weight is copied. The same number of
    heads gives an identical copy. ``hf_model`` is not modified; the copy has its dtype, device and mode."""
    config = getattr(hf_model, "config", None)
    if config is None or not hasattr(config, "num_attention_heads"):
        raise ValueError(f"hf_model must be a transformers causal LM with a config, got {type(hf_model).__name__}")
    check_new_kv_heads(config, new_kv_heads)
    old = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    attn = _attention_modules(hf_model)
    new_config = copy.deepcopy(config)
    new_config.num_key_value_heads = new_kv_heads
    if getattr(new_config, "head_dim", None) is None:
        new_config.head_dim = config.hidden_size // config.num_attention_heads
    state = {k: v.clone() for k, v in hf_model.state_dict().items()}
    prefix = {id(m): name for name, m in hf_model.named_modules()}
    for a in attn:
        for proj in (a.k_proj, a.v_proj):
            name = prefix[id(proj)]
            state[f"{name}.weight"] = pool_kv_weight(proj.weight, old, new_kv_heads)  # (new·hd, D)
            if getattr(proj, "bias", None) is not None:
                state[f"{name}.bias"] = pool_kv_weight(proj.bias, old, new_kv_heads)  # (new·hd,)
    param = next(hf_model.parameters())
    with torch.device(param.device):
        new = type(hf_model)(new_config).to(param.dtype)
    new.load_state_dict(state, strict=True)
    if getattr(hf_model, "generation_config", None) is not None:
        new.generation_config = copy.deepcopy(hf_model.generation_config)
    new.train(hf_model.training)
    return new


# ============================================================================ 3. perplexity and uptraining
def val_metrics(model, tokenizer, max_tokens: int = 16_384, seq_len: int = 256, data=None) -> dict[str, float]:
    """Loss, perplexity, top-1 on the validation split through the course engine's forward
    (``compression.evaluate.evaluate``: consecutive ``seq_len`` windows, the first ``max_tokens`` tokens)."""
    from course_lib.compression.evaluate import evaluate
    from course_lib.engine.engine import Engine

    was_training = model.training
    model.eval()
    try:
        engine = Engine(model, tokenizer, linear="reference")  # borrows (copies fused q/k/v) the current weights
        return evaluate(engine, data, seq_len=seq_len, max_tokens=max_tokens)
    finally:
        model.train(was_training)


def uptrain(
    model,
    tokenizer,
    steps: int,
    *,
    batch: int = 16,
    seq_len: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
    eval_every: int | None = None,
    eval_tokens: int = 16_384,
    threads: int | None = None,
    print_every: int = 0,
) -> dict:
    """Continue pre-training ``model`` (in place, all weights) for ``steps`` steps on the course's train
    split: next-token loss, the recipe of ``models.train`` (AdamW β 0.9/0.95, weight decay 0.1 on matrices,
    warm-up then cosine decay to 10%, gradient clip 1.0, random ``seq_len`` windows). Returns the log:
    ``train_loss`` (one per step), ``lr_per_step``, and ``log`` = validation metrics at step 0, every
    ``eval_every`` steps and at the end, each ``{"step", "wall_s", "val": {loss, perplexity, top1, tokens}}``,
    plus ``models.train.run_info``'s fields."""
    from course_lib.models.train import get_batch, lr_at, make_optimizer, run_info, token_ids, warmup_steps

    _check_int("steps", steps)
    _check_int("batch", batch)
    _check_int("seq_len", seq_len, 2)
    _check_int("eval_tokens", eval_tokens, seq_len)
    _check_int("print_every", print_every, 0)
    if eval_every is not None:
        _check_int("eval_every", eval_every)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if seq_len > model.config.max_position_embeddings:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_position_embeddings")
    if threads:
        torch.set_num_threads(threads)
    train_ids, val_ids = token_ids(tokenizer, "train"), token_ids(tokenizer, "val")
    opt = make_optimizer(model, lr)
    gen = torch.Generator().manual_seed(seed)
    warmup = warmup_steps(steps)
    losses: list[float] = []
    lrs: list[float] = []
    log: list[dict] = []
    start = time.perf_counter()

    def evaluate_at(step: int) -> None:
        m = val_metrics(model, tokenizer, max_tokens=eval_tokens, seq_len=seq_len, data=val_ids)
        log.append({"step": step, "wall_s": round(time.perf_counter() - start, 1), "val": m})
        if print_every:
            print(f"step {step}: val loss {m['loss']:.4f} ppl {m['perplexity']:.2f}", flush=True)

    device = next(model.parameters()).device
    evaluate_at(0)
    model.train()
    for step in range(steps):
        rate = lr_at(step, steps, lr, warmup)
        for group in opt.param_groups:
            group["lr"] = rate
        x, y = get_batch(train_ids, batch, seq_len, gen)  # (B, T) each, on the CPU
        x, y = x.to(device), y.to(device)
        logits = model(input_ids=x).logits  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        lrs.append(rate)
        if print_every and (step + 1) % print_every == 0:
            print(
                f"step {step + 1}/{steps}: train loss {losses[-1]:.4f} lr {rate:.2e} "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            evaluate_at(step + 1)
    evaluate_at(steps)
    model.eval()
    return {
        "train_loss": losses,
        "lr_per_step": lrs,
        "wall_s": round(time.perf_counter() - start, 1),
        "eval_tokens": eval_tokens,
        **run_info(model, steps, batch, seq_len, lr, seed, train_ids, val_ids, steps, True, log),
    }


def plot_uptrain(log: dict, ax=None, original_ppl: float | None = None):
    """Training loss per step (left axis) and validation perplexity at the evaluations (right axis), with the
    original model's perplexity as a dotted line when given. ``log``: ``uptrain``'s result or a train_log.json."""
    import matplotlib.pyplot as plt

    if not isinstance(log, dict) or "train_loss" not in log or "log" not in log:
        raise ValueError("log must be uptrain()'s result (or a train_log.json) with 'train_loss' and 'log'")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    loss = log["train_loss"]
    ax.plot(range(1, len(loss) + 1), loss, color="C0", alpha=0.6, label="train loss (per step)")
    ax.set_xlabel("uptraining step")
    ax.set_ylabel("train loss", color="C0")
    right = ax.twinx()
    steps = [r["step"] for r in log["log"]]
    ppl = [r["val"]["perplexity"] for r in log["log"]]
    right.plot(steps, ppl, "o-", color="C3", label="val perplexity")
    if original_ppl is not None:
        right.axhline(original_ppl, color="k", ls=":", label=f"original ({original_ppl:.2f})")
    right.set_ylabel("validation perplexity", color="C3")
    lines = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + right.get_legend_handles_labels()[1]
    ax.legend(lines, labels, fontsize=8, loc="upper right")
    return ax


def uptrained_dir() -> Path:
    from course_lib.core.paths import data_dir

    return data_dir() / "models" / UPTRAINED_NAME


def load_uptrained(path: str | Path | None = None):
    """(model, tokenizer, train_log) of the shipped uptrained MQA model (``data/models/tiny-target-mqa``)."""
    from course_lib.models.load import load_model

    path = Path(path) if path is not None else uptrained_dir()
    model, tok = load_model(path)
    log_path = path / "train_log.json"
    log = json.loads(log_path.read_text()) if log_path.is_file() else None
    return model, tok, log


def _machine() -> dict:
    from course_lib.measure.hardware import detect_device, physical_cores

    return {
        "cpu": detect_device("cpu").name,
        "physical_cores": physical_cores(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }


def run_uptrain(
    out: Path,
    kv_heads: int = 1,
    source: str = "tiny-target",
    steps: int = 200,
    batch: int = 16,
    seq_len: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
    eval_every: int = 50,
    eval_tokens: int = 16_384,
    final_tokens: int = 1_000_000,
    threads: int | None = None,
    command: str = "",
) -> dict:
    """Convert ``source`` to ``kv_heads`` KV heads, uptrain, save weights + tokenizer + train_log.json in
    ``out``. The log records the whole validation split's metrics of the original, the converted (step 0)
    and the uptrained model, and the run's machine."""
    from course_lib.models.load import load_model

    _check_int("final_tokens", final_tokens)
    original, tok = load_model(source)
    start = time.perf_counter()
    before = val_metrics(original, tok, max_tokens=final_tokens, seq_len=seq_len)
    print(
        f"original ({source}, {original.config.num_key_value_heads} KV heads): ppl {before['perplexity']:.3f}",
        flush=True,
    )
    model = convert_kv_heads(original, kv_heads)
    converted = val_metrics(model, tok, max_tokens=final_tokens, seq_len=seq_len)
    print(f"converted to {kv_heads} KV heads, no training: ppl {converted['perplexity']:.3f}", flush=True)
    log = uptrain(
        model,
        tok,
        steps,
        batch=batch,
        seq_len=seq_len,
        lr=lr,
        seed=seed,
        eval_every=eval_every,
        eval_tokens=eval_tokens,
        threads=threads,
        print_every=10,
    )
    after = val_metrics(model, tok, max_tokens=final_tokens, seq_len=seq_len)
    print(f"uptrained {steps} steps: ppl {after['perplexity']:.3f}", flush=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    info = {
        "model": UPTRAINED_NAME if kv_heads == 1 and source == "tiny-target" else f"{source}-kv{kv_heads}",
        "method": "uptraining (Ainslie et al. 2023): mean-pool K/V heads per group, then continued pre-training",
        "source": source,
        "kv_heads_before": original.config.num_key_value_heads,
        "kv_heads_after": kv_heads,
        "command": command,
        "total_wall_s": round(time.perf_counter() - start, 1),
        "machine": _machine(),
        "final_eval": {"original": before, "converted": converted, "uptrained": after},
        **log,
    }
    (out / "train_log.json").write_text(json.dumps(info, indent=1))
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.kv.gqa", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("uptrain", help="convert tiny-target's KV heads by mean-pooling, then uptrain")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--source", default="tiny-target", help="embedded model name or checkpoint folder")
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-tokens", type=int, default=16_384, help="validation tokens at each evaluation")
    p.add_argument("--final-tokens", type=int, default=1_000_000, help="validation tokens, before/after evaluation")
    p.add_argument("--threads", type=int, default=None)
    b = sub.add_parser("bench", help="KV bytes and decode step time of MHA / GQA / MQA random models")
    b.add_argument("--kv-heads", type=int, nargs="+", default=[8, 2, 1])
    b.add_argument("--batch", type=int, default=8)
    b.add_argument("--contexts", type=int, nargs="+", default=[1024])
    b.add_argument("--repeats", type=int, default=10)
    b.add_argument("--threads", type=int, default=None, help="default: the idle cores")
    b.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.cmd == "bench":
        rows = kv_heads_rows(
            tuple(args.kv_heads), args.batch, tuple(args.contexts), repeats=args.repeats, threads=args.threads
        )
        print(f"bandwidth assumed: {rows[0].bandwidth_gbs:.1f} GB/s (measured STREAM), {rows[0].threads} thread(s)")
        print(format_kv_rows(rows))
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    command = "python -m course_lib.kv.gqa " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    info = run_uptrain(
        args.out,
        args.kv_heads,
        args.source,
        args.steps,
        args.batch,
        args.seq_len,
        args.lr,
        args.seed,
        args.eval_every,
        args.eval_tokens,
        args.final_tokens,
        args.threads,
        command,
    )
    print(json.dumps(info["final_eval"], indent=1))
    print(f"wall time {info['total_wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
