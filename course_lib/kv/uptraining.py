"""Uptraining: a short continued pre-training that wins back the quality a KV-head conversion lost.

A checkpoint trained with H KV heads and converted by mean-pooling (``heads_pooling.convert_kv_heads``)
loses some perplexity; Ainslie et al. (2023) recover most of it with ~5% of the original pre-training
steps. ``uptrain`` runs that loop on the course's train split with the recipe of ``models.train``
(compute-bound: forward + backward of every weight per step); ``val_metrics`` measures perplexity through
the course engine; ``run_uptrain`` converts, uptrains and saves a checkpoint with its train_log.json
(the shipped ``data/models/tiny-target-mqa``, which ``load_uptrained`` reads). Its command line is
``python -m course_lib.kv.cli uptrain``; ``plots.plot_uptrain`` draws the log.

    log = uptrain(mqa, tokenizer, steps=200)

Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path

import torch

from course_lib.kv.checks import check_int
from course_lib.kv.heads_pooling import convert_kv_heads

#: where the shipped MQA uptrained from tiny-target lives (``load_uptrained`` reads it)
UPTRAINED_NAME = "tiny-target-mqa"


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
    from course_lib.models.tokenizer import token_ids
    from course_lib.models.train import (
        get_batch,
        lm_loss,
        lr_at,
        make_optimizer,
        optimizer_step,
        run_info,
        warmup_steps,
    )

    check_int("steps", steps)
    check_int("batch", batch)
    check_int("seq_len", seq_len, 2)
    check_int("eval_tokens", eval_tokens, seq_len)
    check_int("print_every", print_every, 0)
    if eval_every is not None:
        check_int("eval_every", eval_every)
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
        losses.append(optimizer_step(opt, lm_loss(model, x, y), model.parameters()))
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
    from course_lib.measure.hardware.cpu_probe import physical_cores
    from course_lib.measure.hardware.device import detect_device

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

    check_int("final_tokens", final_tokens)
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
