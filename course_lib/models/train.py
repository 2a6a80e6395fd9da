"""Train the course's embedded models: ``python -m course_lib.models.train {tokenizer,train}``.

    python -m course_lib.models.train tokenizer --out data/models/tokenizer
    python -m course_lib.models.train train --model tiny-target --steps 1500 --out data/models/tiny-target
    python -m course_lib.models.train train --smoke --out /tmp/smoke     # a few steps, seconds

Training is plain next-token prediction on the stdlib corpus (random windows of ``seq_len``
tokens), AdamW with warm-up + cosine decay, seeded so a rerun on the same interpreter gives the
same weights. The model is a ``transformers`` LlamaForCausalLM; we save it with
``save_pretrained`` (safetensors) next to the tokenizer, so ``from_pretrained(path)`` works.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from course_lib.models.evaluation import evaluate
from course_lib.models.family import SPECS
from course_lib.models.tokenizer import build_tokenizer, load_tokenizer, token_ids


def get_batch(data: np.ndarray, batch: int, seq_len: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen).tolist()
    window = np.stack([data[s : s + seq_len + 1].astype(np.int64) for s in starts])
    x = torch.from_numpy(window)  # (B, T+1)
    return x[:, :-1], x[:, 1:]


def make_optimizer(model, lr: float) -> torch.optim.Optimizer:
    """AdamW β (0.9, 0.95), weight decay 0.1 on matrices only: the optimizer of every model the course trains."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def warmup_steps(steps: int) -> int:
    """Linear warm-up length: a tenth of the run, between 1 and 100 steps."""
    return max(1, min(100, steps // 10))


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def run_info(model, steps, batch, seq_len, lr, seed, train_ids, val_ids, step, final, log) -> dict:
    """The fields every training log records (``train.py`` and ``compression.distill`` write the same ones)."""
    return {
        "steps": steps,
        "batch": batch,
        "seq_len": seq_len,
        "lr": lr,
        "seed": seed,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "train_tokens": int(len(train_ids)),
        "val_tokens": int(len(val_ids)),
        "tokens_seen": step * batch * seq_len,
        "params": sum(p.numel() for p in model.parameters()),
        "finished": final,
        "log": log,
    }


def train(
    model_name: str,
    out: Path,
    tokenizer_dir: Path,
    steps: int,
    batch: int,
    seq_len: int,
    lr: float,
    seed: int,
    eval_every: int,
    threads: int | None = None,
    command: str = "",
    eval_tokens: int = 1_000_000,
    init_from: Path | None = None,
    start_step: int = 0,
) -> dict:
    from tqdm.auto import tqdm
    from transformers import LlamaForCausalLM

    if model_name not in SPECS:
        raise ValueError(f"unknown model {model_name!r}; valid: {sorted(SPECS)}")
    for name, value in (("steps", steps), ("batch", batch), ("seq_len", seq_len), ("eval_every", eval_every)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(tokenizer_dir)
    spec = SPECS[model_name]
    if seq_len > spec.max_position:
        raise ValueError(f"seq_len {seq_len} exceeds the model's max_position {spec.max_position}")
    config = spec.to_config(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    previous: dict = {}
    if init_from is not None:  # continue a run (e.g. with another thread count): weights + LR schedule position
        model = LlamaForCausalLM.from_pretrained(str(init_from), dtype=torch.float32)
        if (Path(init_from) / "train_log.json").exists():
            previous = json.loads((Path(init_from) / "train_log.json").read_text())
    else:
        model = LlamaForCausalLM(config)
    if not 0 <= start_step < steps:
        raise ValueError(f"start_step must be in [0, steps={steps}), got {start_step}")
    train_ids, val_ids = token_ids(tokenizer, "train"), token_ids(tokenizer, "val")
    opt = make_optimizer(model, lr)
    gen = torch.Generator().manual_seed(seed + start_step)  # a resumed run draws fresh windows
    warmup = warmup_steps(steps)
    log: list[dict] = list(previous.get("log", []))
    wall_before = log[-1]["wall_s"] if log else 0.0
    commands = previous.get("commands", [previous["command"]] if "command" in previous else []) + [command]
    start = time.perf_counter() - wall_before
    out.mkdir(parents=True, exist_ok=True)

    def save(step: int, final: bool) -> dict:
        metrics = evaluate(
            model, val_ids, seq_len=seq_len, max_tokens=eval_tokens if final else min(eval_tokens, 32_768)
        )
        model.train()
        record = {"step": step, "wall_s": round(time.perf_counter() - start, 1), "val": metrics}
        log.append(record)
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        info = {
            "model": model_name,
            "command": " && ".join(commands),
            "commands": commands,
            **run_info(model, steps, batch, seq_len, lr, seed, train_ids, val_ids, step, final, log),
        }
        (out / "train_log.json").write_text(json.dumps(info, indent=1))
        return metrics

    model.train()
    bar = tqdm(range(start_step, steps), desc=f"train {model_name}", mininterval=5, initial=start_step, total=steps)
    ema = None
    for step in bar:
        rewarm = min(1.0, (step - start_step + 1) / 20) if start_step else 1.0  # fresh Adam moments: ease in
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup) * rewarm
        x, y = get_batch(train_ids, batch, seq_len, gen)
        value = optimizer_step(opt, lm_loss(model, x, y), model.parameters())
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        bar.set_postfix(loss=f"{ema:.3f}")
        if (step + 1) % eval_every == 0 and step + 1 < steps and step + 1 > start_step:
            metrics = save(step + 1, final=False)
            bar.write(
                f"step {step + 1}: train~{ema:.3f} val loss {metrics['loss']:.3f} ppl {metrics['perplexity']:.2f}"
            )
    final = save(steps, final=True)
    final["train_loss_ema"] = ema
    final["wall_s"] = time.perf_counter() - start
    return final


def lm_loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of a causal LM on one batch: inputs ``x`` and targets ``y``, both (B, T)."""
    logits = model(input_ids=x).logits  # (B, T, V)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def optimizer_step(opt, loss: torch.Tensor, params, clip: float = 1.0, before_clip=None) -> float:
    """One update of every training loop in the course: zero the gradients, backpropagate ``loss``, run
    ``before_clip()`` if given (pruning masks the gradients there), clip the gradient norm of ``params`` to
    ``clip``, step. Returns the loss as a float."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if before_clip is not None:
        before_clip()
    torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    return loss.item()


def command_line(module: str, argv: list[str] | None = None) -> str:
    """The command that ran, as a training log records it: ``python -m module`` and the shell-quoted arguments
    (``argv``, or this process's own when None)."""
    return f"python -m {module} " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.models.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_tok = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer on the corpus")
    p_tok.add_argument("--out", type=Path, required=True)
    p_tok.add_argument("--vocab-size", type=int, default=4096)
    p_train = sub.add_parser("train", help="train one model of the family")
    p_train.add_argument("--model", default="tiny-target", choices=sorted(SPECS))
    p_train.add_argument("--out", type=Path, required=True)
    p_train.add_argument(
        "--tokenizer", type=Path, default=None, help="folder with tokenizer.json (default: data/models/tokenizer)"
    )
    p_train.add_argument("--steps", type=int, default=1500)
    p_train.add_argument("--batch", type=int, default=16)
    p_train.add_argument("--seq-len", type=int, default=256)
    p_train.add_argument("--lr", type=float, default=3e-3)
    p_train.add_argument("--seed", type=int, default=0)
    p_train.add_argument("--eval-every", type=int, default=250)
    p_train.add_argument("--threads", type=int, default=None)
    p_train.add_argument(
        "--eval-tokens", type=int, default=1_000_000, help="validation tokens for the final evaluation"
    )
    p_train.add_argument("--init-from", type=Path, default=None, help="checkpoint folder to continue from")
    p_train.add_argument("--start-step", type=int, default=0, help="with --init-from: the step it stopped at")
    p_train.add_argument("--smoke", action="store_true", help="tiny model, 5 steps: checks the pipeline in seconds")
    args = parser.parse_args(argv)
    command = command_line("course_lib.models.train", argv)
    if args.cmd == "tokenizer":
        tok = build_tokenizer(args.out, args.vocab_size)
        print(f"tokenizer with {len(tok)} tokens saved to {args.out}")
        return 0
    from course_lib.core.paths import data_dir

    tok_dir = args.tokenizer or data_dir() / "models" / "tokenizer"
    if args.smoke:
        args.model, args.steps, args.batch, args.seq_len, args.eval_every = "smoke", 5, 2, 32, 5
        args.eval_tokens = 2048
    result = train(
        args.model,
        args.out,
        tok_dir,
        args.steps,
        args.batch,
        args.seq_len,
        args.lr,
        args.seed,
        args.eval_every,
        args.threads,
        command,
        args.eval_tokens,
        args.init_from,
        args.start_step,
    )
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
