"""How good are the embedded models? Perplexity, top-1 accuracy, draft–target agreement, samples, speed.

    python -m course_lib.models.quality            # measures the embedded models, writes data/models/quality.json
                                                   # and regenerates data/models/README.md

The draft's greedy top-1 agreement with the target on held-out text is the α of chapter 04: the
probability that the target accepts a drafted token, which fixes speculative decoding's speedup.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

#: tokens of the validation split the tests re-measure (the full split takes too long for CI)
CHECK_TOKENS = 16_384

#: Greedy-sample prompts. None ends in a newline: the tokenizer merges "\n" with the indentation that
#: follows it, so a prompt cut right after "\n" starts from a token boundary training never showed.
PROMPTS = (
    "def fibonacci(n):",
    "import os\nimport sys\nimport re",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x",
    "    def close(self):\n        if self.",
)


def _windows(data: np.ndarray, seq_len: int, max_tokens: int) -> list[np.ndarray]:
    if len(data) < seq_len + 1:
        raise ValueError(f"split has {len(data)} tokens, fewer than seq_len+1={seq_len + 1}")
    n = max(1, min(max_tokens, len(data) - 1) // seq_len)
    return [data[i * seq_len : i * seq_len + seq_len + 1].astype(np.int64) for i in range(n)]


@torch.no_grad()
def evaluate(model, data: np.ndarray, seq_len: int = 256, max_tokens: int = 65_536, batch: int = 8) -> dict[str, float]:
    """Mean next-token loss, perplexity and top-1 accuracy over consecutive windows of ``data``."""
    was_training = model.training
    model.eval()
    windows = _windows(data, seq_len, max_tokens)
    total_loss, correct, total = 0.0, 0, 0
    for first in range(0, len(windows), batch):
        x = torch.from_numpy(np.stack(windows[first : first + batch]))  # (B, T+1)
        logits = model(input_ids=x[:, :-1]).logits.float()  # (B, T, V)
        target = x[:, 1:]
        total_loss += torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum").item()
        correct += (logits.argmax(-1) == target).sum().item()
        total += target.numel()
    model.train(was_training)
    mean = total_loss / total
    return {"loss": mean, "perplexity": math.exp(mean), "top1": correct / total, "tokens": total}


@torch.no_grad()
def top1_agreement(target, draft, data: np.ndarray, seq_len: int = 256, max_tokens: int = 65_536) -> float:
    """Fraction of positions where draft and target pick the same greedy next token (chapter 04's α)."""
    agree, total = 0, 0
    for w in _windows(data, seq_len, max_tokens):
        x = torch.from_numpy(w[None, :-1])
        agree += (target(input_ids=x).logits.argmax(-1) == draft(input_ids=x).logits.argmax(-1)).sum().item()
        total += x.numel()
    return agree / total


@torch.no_grad()
def greedy_sample(model, tokenizer, prompt: str, max_new_tokens: int = 48) -> str:
    ids = tokenizer(prompt, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


@torch.no_grad()
def generate_speed(model, tokenizer, new_tokens: int = 64, repeats: int = 3) -> float:
    """Decode tokens/s of HF ``generate`` at batch 1 (median of ``repeats``; EOS ignored)."""
    ids = tokenizer(PROMPTS[0], return_tensors="pt")
    kwargs = dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    model.generate(**ids, **kwargs)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.generate(**ids, **kwargs)
        times.append(time.perf_counter() - start)
    return new_tokens / float(np.median(times))


def measure(max_tokens: int = 1_000_000) -> dict:
    from course_lib.models.load import EMBEDDED, load_model
    from course_lib.models.train import token_ids

    models = {name: load_model(name) for name in EMBEDDED}
    tokenizer = models["tiny-target"][1]
    val = token_ids(tokenizer, "val")
    result: dict = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": platform.machine(),
        "val_tokens": int(len(val)),
        "check_tokens": CHECK_TOKENS,
        "models": {},
    }
    from course_lib.measure.report import machine_name

    result["measured_on"] = machine_name()
    for name, (model, tok) in models.items():
        info = evaluate(model, val, max_tokens=max_tokens)
        info["check_perplexity"] = evaluate(model, val, max_tokens=CHECK_TOKENS)["perplexity"]
        info["params"] = sum(p.numel() for p in model.parameters())
        info["decode_tok_s_hf_generate"] = generate_speed(model, tok)
        info["samples"] = {p: greedy_sample(model, tok, p) for p in PROMPTS}
        result["models"][name] = info
    # every embedded model but the target is a draft candidate (tiny-draft, tiny-draft-distilled)
    result["top1_agreement_with_target"] = {
        name: top1_agreement(models["tiny-target"][0], model, val, max_tokens=max_tokens)
        for name, (model, _) in models.items()
        if name != "tiny-target"
    }
    result["draft_target_top1_agreement"] = result["top1_agreement_with_target"]["tiny-draft"]
    return result


def write_card(models_dir: Path) -> Path:
    """Regenerate ``data/models/README.md`` from ``train_log.json`` files and ``quality.json``."""
    quality = json.loads((models_dir / "quality.json").read_text())
    lines = [
        "# Embedded models",
        "",
        "Small Llama-architecture models (RoPE, RMSNorm, SwiGLU, grouped-query attention) trained by the course "
        "on the Python standard library, shipped so every chapter runs offline. Generated by "
        "`python -m course_lib.models.quality` from the training logs and a fresh measurement: do not edit by hand.",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'model = AutoModelForCausalLM.from_pretrained("data/models/tiny-target")',
        'tok = AutoTokenizer.from_pretrained("data/models/tiny-target")',
        '# or: from course_lib.models.load import load_model; model, tok = load_model("tiny-target")',
        "```",
        "",
        f"Measured on {quality['measured_on']}, Python {quality['python']}, torch {quality['torch']}; "
        f"validation split: {quality['val_tokens']:,} tokens.",
        "",
        "| model | parameters | file MB | val loss | val perplexity | val top-1 | HF generate tok/s (batch 1) | "
        "training wall time | command |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, info in quality["models"].items():
        log = json.loads((models_dir / name / "train_log.json").read_text())
        size = (models_dir / name / "model.safetensors").stat().st_size / 1e6
        wall = log["log"][-1]["wall_s"] / 60
        lines.append(
            f"| {name} | {info['params']:,} | {size:.1f} | {info['loss']:.3f} | {info['perplexity']:.2f} | "
            f"{info['top1']:.3f} | {info['decode_tok_s_hf_generate']:.0f} | {wall:.1f} min "
            f"({log['threads']} threads, {log['steps']} steps × {log['batch']}×{log['seq_len']} tokens) | "
            f"`{log['command']}` |"
        )
    agreements = quality.get("top1_agreement_with_target", {"tiny-draft": quality["draft_target_top1_agreement"]})
    lines += [
        "",
        "Greedy top-1 agreement with tiny-target on the validation split (teacher-forced; chapter 04's "
        "acceptance rate α): " + ", ".join(f"{name} **{value:.3f}**" for name, value in agreements.items()) + ".",
        "",
        "Training: next-token loss on random 256-token windows of the train split, AdamW (β 0.9/0.95, "
        "weight decay 0.1), warm-up then cosine decay to 10%, gradient clip 1.0, seed 0. "
        "Per-checkpoint validation losses are in each folder's `train_log.json`. The wall times were "
        "measured while the machine's two cores were shared with other jobs for part of the run, so they "
        "overstate what an idle machine needs.",
        "",
    ]
    for name in quality["models"]:
        log = json.loads((models_dir / name / "train_log.json").read_text())
        if log.get("method") == "distillation":
            lines += [
                f"{name} is distilled (`course_lib.compression.distill`): {log['model']}'s shape, initial weights, "
                f"batches and schedule ({log['steps']} steps, lr {log['lr']:g}), but the loss is "
                f"α·T²·KL(teacher ‖ student) + (1−α)·CE with T = {log['temperature']:g}, α = {log['alpha']:g} "
                f"and teacher {log['teacher']}. Its model card: `{name}/README.md`.",
                "",
            ]
    lines += [
        "Greedy samples below are repetitive (a 5M-parameter model loops easily) but clearly Python: "
        "indentation, `def`, `self.`, imports. Prompts do not end in a newline: the tokenizer merges a "
        "newline with the indentation after it, so a prompt cut right after `\\n` starts from a token "
        "boundary the model never saw in training (the problem that *token healing* fixes).",
        "",
        "The perplexity test (`tests/test_models.py`) allows 10% above the recorded value, since another Python "
        "version ships slightly different stdlib files.",
        "",
        "## Greedy samples",
        "",
    ]
    for name, info in quality["models"].items():
        lines.append(f"### {name}")
        for prompt, text in info["samples"].items():
            lines += ["", "```python", prompt + text, "```"]
        lines.append("")
    out = models_dir / "README.md"
    out.write_text("\n".join(lines))
    return out


def main(argv: list[str] | None = None) -> int:
    from course_lib.core.paths import data_dir

    parser = argparse.ArgumentParser(prog="python -m course_lib.models.quality", description=__doc__)
    parser.add_argument("--max-tokens", type=int, default=1_000_000)
    parser.add_argument("--card-only", action="store_true", help="rewrite README.md from the existing quality.json")
    args = parser.parse_args(argv)
    models_dir = data_dir() / "models"
    if not args.card_only:
        result = measure(args.max_tokens)
        (models_dir / "quality.json").write_text(json.dumps(result, indent=1))
        print(json.dumps({k: v for k, v in result.items() if k != "models"}, indent=1))
        for name, info in result["models"].items():
            print(name, {k: v for k, v in info.items() if k != "samples"})
    print("wrote", write_card(models_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
