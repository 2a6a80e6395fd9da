"""Distil a small draft for SmolLM2-135M-Instruct from its own layers: k decoder layers initialised from
the target's, the target's final norm, and an LM head over only the N tokens the target emits most.

Why this shape: a draft's cost c (its time per token over the target's) is about its bytes over the
target's, since both decode steps are bandwidth-bound. SmolLM2's tied 49,152 × 576 LM head alone is
113 MB of its 538 MB, so a draft that keeps it has c ≥ 0.2 whatever its depth; a head over the most
frequent N = 8,192 tokens (FR-Spec, EAGLE-3's reduced draft vocabulary) is 19 MB, and four layers
57 MB, c ≈ 0.14. The draft shares the target's tokenizer and input embedding (not shipped: taken from
the target at load time). Training is teacher forcing only (no generation): the target runs once over
chat-formatted code tasks built from the course corpus, its top-16 next-token probabilities are kept,
and the draft learns them with a soft cross-entropy restricted to its vocabulary. Run offline
(``python -m course_lib.decoding.layer_draft_train --out data/models/smollm2-draft``, ~15 min on two
cores); the notebook loads the result with ``engine.speculative.layer_draft.load_layer_draft``.
Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib.engine.speculative.layer_draft import CONFIG_NAME, WEIGHTS_NAME, build_hf_draft

TASKS = (
    "Add type hints to this function.",
    "Add a docstring to this function.",
    "Rename the variables to clearer names.",
    "Rewrite this code so that it is easier to read.",
    "Fix any bug in this code.",
    "Repeat this code exactly.",
    "Add comments to this code.",
    "Convert this function into a method of a class.",
)


def code_chunks(text: str, min_lines: int = 6, max_lines: int = 40) -> list[str]:
    """Top-level blocks of the corpus (split at two blank lines) of ``min_lines``..``max_lines`` lines."""
    out = []
    for block in text.split("\n\n\n"):
        block = block.strip("\n")
        n = block.count("\n") + 1
        if min_lines <= n <= max_lines and ("def " in block or "class " in block):
            out.append(block)
    return out


def task_sequences(tokenizer, chunks: list[str], count: int, max_len: int, seed: int) -> list[list[int]]:
    """``count`` chat-formatted copy/edit tasks: the user gives a code block and an instruction, the
    assistant's turn is the code again (teacher forcing stands in for the target's own answer)."""
    rng = random.Random(seed)
    seqs = []
    for chunk in rng.sample(chunks, min(count, len(chunks))):
        msgs = [
            {"role": "user", "content": f"{rng.choice(TASKS)}\n\n```python\n{chunk}\n```"},
            {"role": "assistant", "content": f"```python\n{chunk}\n```"},
        ]
        ids = tokenizer.apply_chat_template(msgs, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        seqs.append(ids[:max_len])
    return seqs


@torch.inference_mode()
def teacher_topk(target_hf, seqs: list[list[int]], k: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The target's top-``k`` next-token ids (T, k) and probabilities (T, k) at every position of each sequence."""
    out = []
    for ids in seqs:
        logits = target_hf(torch.tensor([ids])).logits[0].float()  # (T, V)
        p, i = logits.softmax(-1).topk(k, dim=-1)  # (T, k) each
        out.append((i, p.half()))
    return out


def draft_vocab(
    teacher: list[tuple[torch.Tensor, torch.Tensor]], seqs: list[list[int]], n: int, vocab_size: int
) -> torch.Tensor:
    """The ``n`` most frequent tokens of the target's argmax over the training data, topped up with the
    most frequent input tokens, then the lowest ids (byte-level BPE merges its commonest pairs first);
    sorted ids (n,)."""
    if not 1 <= n <= vocab_size:
        raise ValueError(f"n must be in [1, vocab_size={vocab_size}], got {n}")
    counts = -torch.arange(vocab_size, dtype=torch.float64) * 1e-12  # ties: the lower id first
    for (ids, _), s in zip(teacher, seqs):
        counts.index_add_(0, ids[:, 0], torch.full((ids.shape[0],), 1.0, dtype=torch.float64))
        counts.index_add_(0, torch.tensor(s), torch.full((len(s),), 1e-3, dtype=torch.float64))
    return counts.topk(n).indices.sort().values


def soft_ce(logits: torch.Tensor, t_ids: torch.Tensor, t_p: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """−Σ p_teacher log q_draft over the teacher's top-k restricted to the draft's vocabulary (renormalised).
    logits (T, N); t_ids, t_p (T, k); pos (V,) the draft index of each target id, −1 when absent."""
    j = pos[t_ids]  # (T, k)
    keep = (j >= 0).float() * t_p.float()
    keep = keep / keep.sum(-1, keepdim=True).clamp_min(1e-9)
    logq = logits.log_softmax(-1).gather(-1, j.clamp_min(0))  # (T, k)
    return -(keep * logq).sum(-1).mean()


def agreement(model, head_w, embed, seqs, teacher, pos) -> dict:
    """Teacher-forced greedy agreement (draft argmax == target argmax) and the share of the target's argmax
    inside the draft vocabulary, over ``seqs``."""
    agree = total = covered = 0
    with torch.inference_mode():
        for s, (t_ids, _) in zip(seqs, teacher):
            h = model.model(inputs_embeds=F.embedding(torch.tensor([s]), embed)).last_hidden_state[0]  # (T, D)
            pred = (h @ head_w.T).argmax(-1)  # (T,) draft index
            tgt = pos[t_ids[:, 0]]
            agree += int((pred == tgt).sum())
            covered += int((tgt >= 0).sum())
            total += len(s)
    return {"top1_agreement": agree / total, "vocab_coverage": covered / total, "tokens": total}


def train(
    out: Path, layers: list[int], vocab: int, sequences: int, max_len: int, epochs: int, lr: float, seed: int, log
) -> dict:
    """Prepare the teacher's targets, train, save weights, config and log in ``out``; returns the log."""
    from course_lib.models.corpus import corpus_text
    from course_lib.models.load import load_model

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    target, tok = load_model("smollm2-135m-instruct")
    chunks = code_chunks(corpus_text("train"))
    seqs = task_sequences(tok, chunks, sequences, max_len, seed)
    n_val = max(4, len(seqs) // 10)
    cache = out / "teacher_cache.pt"  # not shipped: lets a crashed run restart without the teacher pass
    if cache.is_file():
        teacher = torch.load(cache)
    else:
        teacher = teacher_topk(target, seqs)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(teacher, cache)
    log(f"teacher: {len(seqs)} sequences, {sum(map(len, seqs))} tokens, {time.perf_counter() - t0:.0f} s")
    ids = draft_vocab(
        teacher[n_val:], seqs[n_val:], vocab, target.config.vocab_size
    )  # the vocabulary from the training split only
    embed = target.model.embed_tokens.weight.detach()
    draft = build_hf_draft(target, layers)
    del target
    pos = torch.full((embed.shape[0],), -1, dtype=torch.long)
    pos[ids] = torch.arange(len(ids))
    head_w = torch.nn.Parameter(embed[ids].clone())  # (N, D) the tied embedding's rows, then trained
    for p in draft.parameters():
        p.requires_grad_(True)
    params = [p for p in draft.parameters()] + [head_w]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    train_seqs, train_teacher = seqs[n_val:], teacher[n_val:]
    steps = epochs * len(train_seqs)
    history = {"val": [{"step": 0, **agreement(draft, head_w, embed, seqs[:n_val], teacher[:n_val], pos)}], "train": []}
    log(f"step 0: {history['val'][-1]}")
    step = 0
    for epoch in range(epochs):
        order = list(range(len(train_seqs)))
        random.Random(seed + epoch).shuffle(order)
        for i in order:
            s, (t_ids, t_p) = train_seqs[i], train_teacher[i]
            for g in opt.param_groups:
                g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
            h = draft.model(inputs_embeds=F.embedding(torch.tensor([s]), embed)).last_hidden_state[0]
            loss = soft_ce(h @ head_w.T, t_ids, t_p, pos)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            history["train"].append({"step": step, "loss": float(loss.detach())})
            if step % 50 == 0:
                log(f"step {step}/{steps} loss {sum(r['loss'] for r in history['train'][-50:]) / 50:.3f}")
        val = agreement(draft, head_w, embed, seqs[:n_val], teacher[:n_val], pos)
        history["val"].append({"step": step, **val})
        log(f"epoch {epoch + 1}: {val}")
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    state = {
        f"layers.{j}.{k}": v.detach().half().contiguous()
        for j, layer in enumerate(draft.model.layers)
        for k, v in layer.state_dict().items()
    }
    state["norm.weight"] = draft.model.norm.weight.detach().half().contiguous()
    state["lm_head.weight"] = head_w.detach().half().contiguous()
    state["vocab_ids"] = ids.to(torch.int32)
    save_file(state, str(out / WEIGHTS_NAME))
    cfg = {"target": "smollm2-135m-instruct", "init_layers": layers, "num_layers": len(layers), "vocab": len(ids)}
    (out / CONFIG_NAME).write_text(json.dumps(cfg, indent=1) + "\n")
    history.update(
        max_len=max_len,
        config=cfg,
        seconds=time.perf_counter() - t0,
        sequences=len(seqs),
        val_sequences=n_val,
        epochs=epochs,
        lr=lr,
        seed=seed,
    )
    return history


def card(history: dict, machine: str) -> str:
    """The model card (README.md) written from a training log."""
    cfg, val0, val = history["config"], history["val"][0], history["val"][-1]
    return f"""# smollm2-135m-draft

A draft model for speculative decoding with **SmolLM2-135M-Instruct** (chapter 04, section 6b). It shares
the target's tokenizer and input embedding (taken from the target at load time, not stored here) and has:

* {cfg["num_layers"]} Llama decoder layers, initialised from the target's layers {cfg["init_layers"]}, then distilled;
* the target's final RMSNorm (distilled too);
* an LM head over only {cfg["vocab"]:,} of the target's 49,152 tokens (`vocab_ids`): the most frequent argmax
  tokens of the target on the training data. `engine.speculative.TruncatedHead` scatters its logits into the
  target's vocabulary (−inf elsewhere), so verification by the target stays exact.

Weights in fp16 in `draft.safetensors` (layers, norm, head, vocab ids); `draft_config.json` names the shape.
Load with `course_lib.engine.speculative.load_layer_draft(target_engine, "smollm2-135m-draft")`.

## Training

Teacher forcing only, no generation: {history["sequences"]} chat-formatted code tasks built from the course
corpus (a code block and an instruction in the user turn, the code again in the assistant turn, at most
{history["max_len"]} tokens each); the target's top-16 next-token probabilities at every position; soft
cross-entropy restricted to the draft's vocabulary; AdamW, lr {history["lr"]} with a cosine decay,
{history["epochs"]} epochs of one sequence per step; {history["val_sequences"]} sequences held out.

Command: `{history["command"]}`
Machine: {machine}; {history["seconds"] / 60:.1f} min wall.

| held out, teacher-forced | before training | after |
|---|---|---|
| top-1 agreement with the target | {val0["top1_agreement"]:.3f} | {val["top1_agreement"]:.3f} |
| target's argmax inside the draft's vocabulary | {val0["vocab_coverage"]:.3f} | {val["vocab_coverage"]:.3f} |

The log is `train_log.json` (loss per step, validation per epoch, the command and its printed lines).
"""


def main(argv: list[str] | None = None) -> int:
    from course_lib.models.train import command_line

    ap = argparse.ArgumentParser(
        prog="python -m course_lib.decoding.layer_draft_train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", default="0,1,2,3", help="target layers that initialise the draft's, in order")
    ap.add_argument("--vocab", type=int, default=8192, help="tokens in the draft's LM head")
    ap.add_argument("--sequences", type=int, default=96)
    ap.add_argument("--max-len", type=int, default=256, help="tokens per training sequence (truncated)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--machine", default="2-core AMD EPYC VM shared with other jobs, torch CPU")
    ap.add_argument("--card-only", action="store_true", help="only (re)write README.md from train_log.json")
    args = ap.parse_args(argv)
    if args.card_only:
        history = json.loads((args.out / "train_log.json").read_text())
        (args.out / "README.md").write_text(card(history, args.machine))
        return 0
    torch.set_num_threads(args.threads)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    layers = [int(x) for x in args.layers.split(",")]
    history = train(args.out, layers, args.vocab, args.sequences, args.max_len, args.epochs, args.lr, args.seed, log)
    history["command"] = command_line("course_lib.decoding.layer_draft_train", argv)
    history["stdout"] = lines
    (args.out / "train_log.json").write_text(json.dumps(history) + "\n")
    (args.out / "README.md").write_text(card(history, args.machine))
    (args.out / "teacher_cache.pt").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


#: The command that made data/models/smollm2-135m-draft (its card records the one that really ran).
DEFAULT_COMMAND = (
    "python -m course_lib.decoding.layer_draft_train --out data/models/smollm2-135m-draft "
    "--layers 0,1,2 --vocab 8192 --sequences 32 --max-len 256 --epochs 2 --lr 1e-3 --threads 2"
)


def plot_log(history: dict):
    """The training log: the loss per step, and the held-out agreement and vocabulary coverage per epoch."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.3), dpi=80)
    axes[0].plot([r["step"] for r in history["train"]], [r["loss"] for r in history["train"]], lw=0.6)
    axes[0].set_title("distilling the draft: loss per training sequence")
    axes[0].set_xlabel("step (one sequence)")
    axes[0].set_ylabel("soft cross-entropy to the target (nats)")
    val = history["val"]
    axes[1].plot([r["step"] for r in val], [r["top1_agreement"] for r in val], "o-", label="top-1 agreement")
    axes[1].plot([r["step"] for r in val], [r["vocab_coverage"] for r in val], "--", label="target's token in vocab")
    axes[1].set_title("held out: how often the draft's top-1 is the target's")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("share of held-out tokens")
    axes[1].set_ylim(0, 1)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig
