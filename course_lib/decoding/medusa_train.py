"""Training Medusa heads on the frozen target: the loss, the loop, the evaluation and the command line.

The target stays frozen; only the heads learn, from the hidden states the engine's own forward computes
(``target_hidden``: exactly what the decoder hands the heads at decode time). Head k is trained to
predict token t+1+k from h_t, with Σ_k 0.8^k · CE(head_k(h_t), x_{t+1+k}) (Medusa's λ_k = 0.8^k: later
heads are less accurate and weigh less). Each step is one no-grad target forward plus K head matmuls
and their backward: compute-bound on the heads' D×V projections at B·T tokens. The heads themselves,
their file format and the proposers are ``course_lib.engine.speculative.medusa``.

    python -m course_lib.decoding.medusa_train train --heads 4 --steps 300 --batch 8 --seq-len 256 --lr 2e-3 \\
        --seed 0 --eval-every 100 --threads 2 --out data/models/tiny-target-medusa

Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.engine.engine import Engine
from course_lib.engine.speculative.medusa import MedusaHeads, check_engine, positive_int, save_medusa
from course_lib.models.train import command_line

HEAD_DECAY = 0.8  # Medusa's λ_k = 0.8^k: later heads are less accurate and weigh less in the loss


def target_hidden(target: Engine, x: torch.Tensor) -> torch.Tensor:
    """(B, T) ids, each row from position 0 → (B, T, D) last-layer hidden states before the final norm,
    from the engine's own forward (no cache): what the decoder hands the heads at decode time."""
    from course_lib.engine.attention import NoCacheBackend

    m = target.model
    B, T = x.shape
    backend = NoCacheBackend(T)
    positions = torch.arange(T, device=m.device).repeat(B)  # (B·T,)
    meta = backend.prepare([backend.allocate() for _ in range(B)], [T] * B, positions)
    with torch.no_grad():
        h = m.run_layers(m.embed(x.reshape(-1).to(m.device)), positions, meta, backend)  # (B·T, D)
    return h.view(B, T, -1).float()


def head_losses(heads: MedusaHeads, hidden: torch.Tensor, x: torch.Tensor) -> tuple[list[torch.Tensor], list[float]]:
    """Per head k: CE(head_k(h_t), x_{t+1+k}) over every t that has such a token, and top-1 accuracy.
    ``hidden`` (B, T, D) at the inputs ``x`` (B, T+1) (the window including the next token)."""
    T = hidden.shape[1]
    logits = heads(hidden)  # (K, B, T, V)
    losses, accs = [], []
    for k in range(1, heads.num_heads + 1):
        lg = logits[k - 1, :, : T - k]  # (B, T-k, V): positions t with t+1+k inside the window
        y = x[:, 1 + k : T + 1].to(lg.device)  # (B, T-k)
        losses.append(F.cross_entropy(lg.flatten(0, 1), y.flatten()))
        accs.append(float((lg.argmax(-1) == y).float().mean()))
    return losses, accs


@torch.no_grad()
def evaluate_heads(heads: MedusaHeads, target: Engine, data: np.ndarray, seq_len: int, max_tokens: int) -> dict:
    """Per-head loss and top-1 accuracy on consecutive windows of ``data`` (e.g. the validation split)."""
    from course_lib.models.evaluation import _windows

    was = heads.training
    heads.eval()
    K = heads.num_heads
    loss, acc, n = [0.0] * K, [0.0] * K, 0
    for w in _windows(data, seq_len, max_tokens):
        x = torch.from_numpy(w[None])  # (1, T+1)
        losses, accs = head_losses(heads, target_hidden(target, x[:, :-1]), x)
        n += 1
        for k in range(K):
            loss[k] += float(losses[k])
            acc[k] += accs[k]
    heads.train(was)
    return {"loss": [v / n for v in loss], "top1": [v / n for v in acc], "tokens": n * seq_len}


def train_heads(
    target: Engine,
    heads: MedusaHeads | None = None,
    num_heads: int = 4,
    steps: int = 20,
    batch: int = 4,
    seq_len: int = 128,
    lr: float = 1e-3,
    seed: int = 0,
    eval_every: int | None = None,
    eval_tokens: int = 4096,
    threads: int | None = None,
    out: str | Path | None = None,
    command: str = "",
    progress: bool = False,
    data: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict:
    """Train Medusa heads on the frozen ``target`` with Σ_k 0.8^k·CE(head_k(h_t), x_{t+1+k}); the defaults
    are a notebook's quick run (seconds). Returns the log: per step the training loss, per evaluation the
    validation loss and top-1 accuracy of every head. With ``out`` the heads, ``train_log.json`` are saved."""
    from course_lib.core.paths import data_dir
    from course_lib.models.tokenizer import load_tokenizer, token_ids
    from course_lib.models.train import get_batch, lr_at, make_optimizer, optimizer_step, run_info
    from course_lib.models.train import warmup_steps as warmup_of

    check_engine(target)
    for name, value in (("num_heads", num_heads), ("steps", steps), ("batch", batch), ("seq_len", seq_len)):
        positive_int(name, value)
    positive_int("eval_tokens", eval_tokens)
    if eval_every is not None:
        positive_int("eval_every", eval_every)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if seq_len <= num_heads + 1:
        raise ValueError(f"seq_len must exceed num_heads + 1 = {num_heads + 1} (head k needs a token k+1 ahead)")
    if seq_len > target.model.max_position:
        raise ValueError(f"seq_len {seq_len} exceeds the target's context window {target.model.max_position}")
    if heads is None:
        torch.manual_seed(seed)
        heads = MedusaHeads(target, num_heads)
    elif not isinstance(heads, MedusaHeads):
        raise ValueError(f"heads must be MedusaHeads or None, got {type(heads).__name__}")
    else:
        heads.check_target(target)
    if threads:
        torch.set_num_threads(threads)
    if data is None:
        tok = load_tokenizer(data_dir() / "models" / "tokenizer")
        data = (token_ids(tok, "train"), token_ids(tok, "val"))
    train_ids, val_ids = data
    heads.train().requires_grad_(True)
    opt = make_optimizer(heads, lr)
    gen = torch.Generator().manual_seed(seed)
    warmup = warmup_of(steps)
    weights = [HEAD_DECAY**k for k in range(1, heads.num_heads + 1)]
    log: dict = {"train": [], "eval": []}
    start = time.perf_counter()
    ema = None

    def evaluate(step: int, final: bool) -> None:
        m = evaluate_heads(heads, target, val_ids, seq_len, eval_tokens if final else min(eval_tokens, 16_384))
        rec = {"step": step, "wall_s": round(time.perf_counter() - start, 1), "train_ema": ema, "val": m}
        log["eval"].append(rec)
        if progress:
            loss = " ".join(f"{v:.3f}" for v in m["loss"])
            acc = " ".join(f"{v:.3f}" for v in m["top1"])
            print(
                f"step {step}: train~{ema if ema is not None else math.nan:.3f} val loss per head [{loss}] top-1 per head [{acc}]",
                flush=True,
            )
        if out is not None:
            save_medusa(heads, out)
            info = {
                "model": "tiny-target-medusa",
                "target_fingerprint": heads.fingerprint,
                "num_heads": heads.num_heads,
                "loss": "sum_k 0.8^k * CE(head_k(h_t), x_{t+1+k}), target frozen",
                "command": command,
                "eval_tokens": eval_tokens,
                **run_info(heads, steps, batch, seq_len, lr, seed, train_ids, val_ids, step, final, log["eval"]),
                "train_loss": log["train"],
            }
            Path(out, "train_log.json").write_text(json.dumps(info, indent=1))

    if eval_every:  # step 0: the untrained heads, each a copy of the base head (they predict t+1, asked for t+1+k)
        evaluate(0, final=False)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        x, y = get_batch(train_ids, batch, seq_len, gen)  # (B, T) each
        x, y = x.to(next(heads.parameters()).device), y.to(next(heads.parameters()).device)
        window = torch.cat([x, y[:, -1:]], dim=1)  # (B, T+1)
        hidden = target_hidden(target, x)  # (B, T, D), frozen target
        losses, accs = head_losses(heads, hidden, window)
        loss = sum(w * v for w, v in zip(weights, losses))
        value = optimizer_step(opt, loss, heads.parameters())
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        log["train"].append(
            {"step": step + 1, "loss": round(value, 4), "per_head": [round(float(v.detach()), 4) for v in losses]}
        )
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            evaluate(step + 1, final=False)
    evaluate(steps, final=True)
    heads.eval().requires_grad_(False)
    log["wall_s"] = time.perf_counter() - start
    log["heads"] = heads
    return log


# ---------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.decoding.medusa_train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train", help="train Medusa heads on the frozen tiny-target")
    p.add_argument("--target", default="tiny-target", help="embedded model name or checkpoint folder")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-tokens", type=int, default=1_000_000, help="validation tokens, final evaluation")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    command = command_line("course_lib.decoding.medusa_train", argv)
    torch.set_num_threads(args.threads)
    target = Engine(args.target)
    log = train_heads(
        target,
        num_heads=args.heads,
        steps=args.steps,
        batch=args.batch,
        seq_len=args.seq_len,
        lr=args.lr,
        seed=args.seed,
        eval_every=args.eval_every,
        eval_tokens=args.eval_tokens,
        threads=args.threads,
        out=args.out,
        command=command,
        progress=True,
    )
    final = log["eval"][-1]
    print(json.dumps({"final": final, "wall_s": round(log["wall_s"], 1)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
