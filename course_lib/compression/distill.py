"""Knowledge distillation: a small student trained on the soft predictions of the shipped target.

    python -m course_lib.compression.distill --steps 1500 --batch 16 --seq-len 256 --lr 3e-3 \\
        --temperature 2.0 --alpha 0.5 --seed 0 --eval-every 250 --out data/models/tiny-draft-distilled
    python -m course_lib.compression.distill --smoke --out /tmp/distill-smoke   # a few steps, seconds

The loss (``distill_loss``, Hinton, Vinyals & Dean 2015, "Distilling the Knowledge in a Neural
Network") mixes two terms: the KL divergence from the teacher's softened distribution
softmax(t/T) to the student's softmax(s/T), and the usual next-token cross-entropy on the data.
Softening with T > 1 exposes the teacher's "dark knowledge" (which wrong tokens it finds plausible);
since the soft term's gradient shrinks as 1/T², it is multiplied by T² so both terms keep a
comparable scale whatever T is.

``train_student`` is ``course_lib.models.train``'s loop with that loss: the same student shape
(``family.SPECS``), the same initialisation and batches for the same seed (so the only difference with
the draft trained from scratch is the loss), AdamW β 0.9/0.95 with weight decay 0.1 on matrices,
warm-up then cosine decay to 10% (``train.lr_at``), gradient clip 1.0, a checkpoint and a validation
evaluation every ``eval_every`` steps, ``save_pretrained`` + tokenizer + ``train_log.json``. The teacher
runs in eval mode, fp32, under ``torch.no_grad``; each evaluation also records the KL from teacher to
student, the top-1 agreement with the teacher (chapter 04's α for greedy speculative decoding) and
the expected acceptance Σ min(p, q) of speculative *sampling* at temperature 1.
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

from course_lib.compression.checks import check_int, check_positive
from course_lib.models.evaluation import _windows, evaluate
from course_lib.models.family import SPECS
from course_lib.models.tokenizer import load_tokenizer, token_ids
from course_lib.models.train import (
    command_line,
    get_batch,
    lr_at,
    make_optimizer,
    optimizer_step,
    run_info,
    warmup_steps,
)


# ---------------------------------------------------------------------------- the loss
def _check_hyper(temperature, alpha) -> tuple[float, float]:
    temperature = check_positive("temperature", temperature)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return temperature, float(alpha)


def distill_terms(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor, temperature: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(T²·KL(softmax(t/T) ‖ softmax(s/T)), CE(s, targets)), each a mean over token positions.

    ``student_logits`` and ``teacher_logits``: (..., V), same shape; ``targets``: the (...) next-token
    ids. The teacher is detached: no gradient ever reaches it."""
    temperature, _ = _check_hyper(temperature, 0.0)
    if not isinstance(student_logits, torch.Tensor) or student_logits.dim() < 2:
        raise ValueError(f"student_logits must be a (..., vocab) tensor, got {type(student_logits).__name__}")
    if not isinstance(teacher_logits, torch.Tensor) or teacher_logits.shape != student_logits.shape:
        shape = tuple(teacher_logits.shape) if isinstance(teacher_logits, torch.Tensor) else type(teacher_logits)
        raise ValueError(f"teacher_logits must have the student's shape {tuple(student_logits.shape)}, got {shape}")
    if not isinstance(targets, torch.Tensor) or targets.shape != student_logits.shape[:-1]:
        shape = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets)
        raise ValueError(
            f"targets must have shape {tuple(student_logits.shape[:-1])} (logits without vocab), got {shape}"
        )
    vocab = student_logits.shape[-1]
    s = student_logits.reshape(-1, vocab).float()
    t = teacher_logits.detach().reshape(-1, vocab).float()
    log_q = F.log_softmax(s / temperature, dim=-1)  # student
    log_p = F.log_softmax(t / temperature, dim=-1)  # teacher
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="sum") / s.shape[0]  # Σ p (log p − log q), per token
    ce = F.cross_entropy(s, targets.reshape(-1))
    return temperature**2 * kl, ce


def distill_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 2.0,
    alpha: float = 0.5,
) -> torch.Tensor:
    """alpha·T²·KL(softmax(t/T) ‖ softmax(s/T)) + (1 − alpha)·CE(s, targets), mean over positions.

    Hinton et al. (2015): the soft targets' gradient scales as 1/T², so the T² factor keeps the two
    terms' gradients comparable when T changes. ``alpha=0`` is plain next-token training; ``alpha=1``
    ignores the data and imitates the teacher only. Raises ValueError naming ``temperature`` (≤ 0),
    ``alpha`` (outside [0, 1]) or the tensor whose shape does not match."""
    temperature, alpha = _check_hyper(temperature, alpha)
    return _mix(*distill_terms(student_logits, teacher_logits, targets, temperature), alpha)


def _mix(soft: torch.Tensor, ce: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha·soft + (1 − alpha)·ce, exactly one term at the ends (no 0·x, which is NaN for x = inf)."""
    if alpha == 0:
        return ce
    if alpha == 1:
        return soft
    return alpha * soft + (1 - alpha) * ce


# ---------------------------------------------------------------------------- evaluation against the teacher
@torch.no_grad()
def compare_to_teacher(
    student, teacher, data: np.ndarray, seq_len: int = 256, max_tokens: int = 65_536, batch: int = 8
) -> dict[str, float]:
    """Over the same consecutive validation windows as ``evaluation.evaluate`` / ``evaluation.top1_agreement``:
    ``kl`` = mean KL(teacher ‖ student) at temperature 1 (nats/token), ``agreement`` = fraction of
    positions where both pick the same argmax (greedy speculative decoding's α), ``accept`` = mean
    Σ min(p, q) (the acceptance rate of speculative sampling at temperature 1), ``tokens``."""
    was_training = student.training
    student.eval()
    kl, agree, accept, total = 0.0, 0, 0.0, 0
    windows = _windows(data, seq_len, max_tokens)
    for first in range(0, len(windows), batch):
        x = torch.from_numpy(np.stack(windows[first : first + batch]))[:, :-1]
        log_p = F.log_softmax(teacher(input_ids=x).logits.float(), dim=-1)
        log_q = F.log_softmax(student(input_ids=x).logits.float(), dim=-1)
        kl += F.kl_div(log_q, log_p, log_target=True, reduction="sum").item()
        agree += (log_p.argmax(-1) == log_q.argmax(-1)).sum().item()
        accept += torch.minimum(log_p, log_q).exp().sum().item()
        total += x.numel()
    student.train(was_training)
    return {"kl": kl / total, "agreement": agree / total, "accept": accept / total, "tokens": total}


# ---------------------------------------------------------------------------- training
def train_student(
    out: Path,
    student: str = "tiny-draft",
    teacher: str | Path = "tiny-target",
    tokenizer_dir: Path | None = None,
    steps: int = 1500,
    batch: int = 16,
    seq_len: int = 256,
    lr: float = 3e-3,
    temperature: float = 2.0,
    alpha: float = 0.5,
    seed: int = 0,
    eval_every: int = 250,
    threads: int | None = None,
    command: str = "",
    eval_tokens: int = 1_000_000,
    progress: bool = True,
) -> dict:
    """Train a fresh ``family.SPECS[student]`` model with ``distill_loss`` against ``teacher`` (an
    embedded name or a checkpoint folder) and save it in ``out`` like ``train.train`` does. Returns
    the final validation metrics plus the comparison with the teacher."""
    from tqdm.auto import tqdm
    from transformers import LlamaForCausalLM

    from course_lib.core.paths import data_dir
    from course_lib.models.load import load_model

    temperature, alpha = _check_hyper(temperature, alpha)
    if student not in SPECS:
        raise ValueError(f"unknown student spec {student!r}; valid: {sorted(SPECS)}")
    for name, value in (
        ("steps", steps),
        ("batch", batch),
        ("seq_len", seq_len),
        ("eval_every", eval_every),
        ("eval_tokens", eval_tokens),
    ):
        check_int(name, value, 1)
    check_positive("lr", lr)
    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    # Same order as train.train: seed, tokenizer, config, model -> the scratch draft's initial weights.
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(tokenizer_dir or data_dir() / "models" / "tokenizer")
    spec = SPECS[student]
    if seq_len > spec.max_position:
        raise ValueError(f"seq_len {seq_len} exceeds the student's max_position {spec.max_position}")
    model = LlamaForCausalLM(spec.to_config(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id))
    teacher_model, _ = load_model(teacher, dtype="fp32")  # eval(), fp32, CPU
    teacher_model.requires_grad_(False)
    if teacher_model.config.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"teacher vocabulary ({teacher_model.config.vocab_size}) differs from the student's "
            f"({model.config.vocab_size}): distillation on logits needs the same tokenizer"
        )
    if seq_len > teacher_model.config.max_position_embeddings:
        raise ValueError(f"seq_len {seq_len} exceeds the teacher's max_position_embeddings")
    train_ids, val_ids = token_ids(tokenizer, "train"), token_ids(tokenizer, "val")
    opt = make_optimizer(model, lr)
    gen = torch.Generator().manual_seed(seed)
    warmup = warmup_steps(steps)
    log: list[dict] = []
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    ema: dict[str, float] = {}

    def save(step: int, final: bool) -> dict:
        n = eval_tokens if final else min(eval_tokens, 32_768)
        metrics = evaluate(model, val_ids, seq_len=seq_len, max_tokens=n)
        vs_teacher = compare_to_teacher(model, teacher_model, val_ids, seq_len=seq_len, max_tokens=n)
        model.train()
        record = {
            "step": step,
            "wall_s": round(time.perf_counter() - start, 1),
            "train_ema": {k: round(v, 4) for k, v in ema.items()},
            "val": metrics,
            "teacher": vs_teacher,
        }
        log.append(record)
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        info = {
            "model": student,
            "method": "distillation",
            "teacher": str(teacher),
            "temperature": temperature,
            "alpha": alpha,
            "loss": "alpha*T^2*KL(softmax(t/T)||softmax(s/T)) + (1-alpha)*CE(s, next token)",
            "command": command,
            "commands": [command],
            **run_info(model, steps, batch, seq_len, lr, seed, train_ids, val_ids, step, final, log),
        }
        (out / "train_log.json").write_text(json.dumps(info, indent=1))
        return {**metrics, "teacher": vs_teacher}

    model.train()
    bar = tqdm(range(steps), desc=f"distill {student}", mininterval=5, disable=not progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        x, y = get_batch(train_ids, batch, seq_len, gen)
        x, y = x.to(next(model.parameters()).device), y.to(next(model.parameters()).device)
        with torch.no_grad():
            teacher_logits = teacher_model(input_ids=x).logits
        logits = model(input_ids=x).logits  # (B, T, V)
        soft, ce = distill_terms(logits, teacher_logits, y, temperature)
        loss = _mix(soft, ce, alpha)
        optimizer_step(opt, loss, model.parameters())
        for key, value in (("loss", loss.item()), ("soft", soft.item()), ("ce", ce.item())):
            ema[key] = value if key not in ema else 0.98 * ema[key] + 0.02 * value
        bar.set_postfix(loss=f"{ema['loss']:.3f}", ce=f"{ema['ce']:.3f}", refresh=False)
        if (step + 1) % eval_every == 0 and step + 1 < steps:
            m = save(step + 1, final=False)
            bar.write(
                f"step {step + 1}: train~{ema['loss']:.3f} (ce~{ema['ce']:.3f}) val loss {m['loss']:.3f} "
                f"ppl {m['perplexity']:.2f} agreement {m['teacher']['agreement']:.3f} kl {m['teacher']['kl']:.3f}"
            )
    final = save(steps, final=True)
    final["train_ema"] = dict(ema)
    final["wall_s"] = time.perf_counter() - start
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.compression.distill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--student", default="tiny-draft", choices=sorted(SPECS), help="shape of the student")
    parser.add_argument("--teacher", default="tiny-target", help="embedded model name or checkpoint folder")
    parser.add_argument("--tokenizer", type=Path, default=None, help="default: data/models/tokenizer")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--alpha", type=float, default=0.5, help="weight of the soft (teacher) term")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--eval-tokens", type=int, default=1_000_000, help="validation tokens, final evaluation")
    parser.add_argument("--smoke", action="store_true", help="'smoke' student, 5 steps: checks the pipeline")
    args = parser.parse_args(argv)
    command = command_line("course_lib.compression.distill", argv)
    if args.smoke:
        args.student, args.steps, args.batch, args.seq_len, args.eval_every = "smoke", 5, 2, 32, 5
        args.eval_tokens = 2048
    result = train_student(
        args.out,
        student=args.student,
        teacher=args.teacher,
        tokenizer_dir=args.tokenizer,
        steps=args.steps,
        batch=args.batch,
        seq_len=args.seq_len,
        lr=args.lr,
        temperature=args.temperature,
        alpha=args.alpha,
        seed=args.seed,
        eval_every=args.eval_every,
        threads=args.threads,
        command=command,
        eval_tokens=args.eval_tokens,
    )
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
