"""Sliding-window attention and attention sinks: what a bounded KV cache keeps, and what it costs in quality.

A window of ``W`` recent tokens (Mistral's sliding window; Longformer's local attention) caps the cache at W
tokens per sequence whatever the context; StreamingLLM (Xiao et al., 2023) keeps ``S`` "sink" tokens from
the start as well, because softmax piles attention on the first tokens and dropping them breaks the model.
``window_mask`` is the (T, T) pattern: query i sees key j ≤ i when i − j < W or j < S. ``window_perplexity``
scores a long text with that pattern through the model's own forward (a 4D additive mask; positions stay
the text's own, as a masked evaluation, not StreamingLLM's re-indexed rolling cache), and ``kv_bytes``
gives the cache each policy keeps. ``python -m course_lib.kv.sliding_window`` records SmolLM2's perplexity
over windows to ``data/measurements/smollm2-sliding-window.json``. Introduced in 05_attention_kv_cache.ipynb."""

from __future__ import annotations

import argparse
import json
import math
import time

import torch


def window_mask(T: int, window: int | None, sinks: int = 0) -> torch.Tensor:
    """(T, T) bool, True where query i may attend key j: causal, within ``window`` (None: all) or a sink."""
    for name, v in (("T", T), ("sinks", sinks)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "T" else 0):
            raise ValueError(f"{name} must be an int ≥ {1 if name == 'T' else 0}, got {v!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None (full attention) or an int ≥ 1, got {window!r}")
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    keep = j <= i
    if window is not None:
        keep &= (i - j < window) | (j < sinks)
    return keep


def kv_bytes(bytes_per_token: float, T: int, window: int | None, sinks: int = 0) -> float:
    """Bytes one sequence's cache holds at context ``T``: every token, or the window plus the sinks."""
    kept = T if window is None else min(T, window + sinks)
    return bytes_per_token * kept


@torch.inference_mode()
def window_perplexity(model, ids: torch.Tensor, window: int | None, sinks: int = 0) -> float:
    """Perplexity of ``ids`` (1-D) under ``model`` (a transformers causal LM) with the window/sink pattern."""
    ids = ids.reshape(1, -1)
    T = ids.shape[1]
    keep = window_mask(T, window, sinks)
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(1, 1, T, T, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)  # (1, 1, T, T)
    logits = model(input_ids=ids, attention_mask=mask).logits[0, :-1].float()  # (T-1, V)
    nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
    return math.exp(float(nll))


def held_out_ids(tok, T: int) -> torch.Tensor:
    """The first ``T`` tokens (1-D) of the held-out Python source, tokenized in 2,000-character chunks
    (exactly as serving.workload.prompt_pool, a layer above)."""
    from course_lib.models.corpus import corpus_text

    text, ids = corpus_text("val"), []
    for start in range(0, len(text), 2000):
        ids += tok(text[start : start + 2000])["input_ids"]
        if len(ids) >= T:
            break
    if len(ids) < T:
        raise ValueError(f"the held-out text yields only {len(ids)} tokens, fewer than T={T}")
    return torch.tensor(ids[:T])


def record(model_name: str = "smollm2-135m-instruct", T: int = 2048, windows=(64, 512), sinks: int = 4) -> dict:
    """Perplexity of a held-out text of ``T`` tokens: full attention, each window without and with sinks."""
    from course_lib.core.paths import data_dir
    from course_lib.measure.hardware import detect_device
    from course_lib.models.load import load_model

    model, tok = load_model(model_name)
    ids = held_out_ids(tok, T)
    rows = [{"window": None, "sinks": 0, "ppl": window_perplexity(model, ids, None)}]
    for w in windows:
        for s in (0, sinks):
            rows.append({"window": w, "sinks": s, "ppl": window_perplexity(model, ids, w, s)})
    return {
        "model": model_name,
        "tokens": T,
        "text": "course_lib.serving.prompt_pool (held-out text through the model's tokenizer), first T tokens",
        "rows": rows,
        "machine": detect_device().describe(),
        "measured": time.strftime("%Y-%m-%d %H:%M"),
        "command": f"python -m course_lib.kv.sliding_window --model {model_name} --tokens {T}",
        "_path": str(data_dir() / "measurements" / "smollm2-sliding-window.json"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="record perplexity over sliding windows with and without sinks")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = record(args.model, args.tokens)
    path = out.pop("_path")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps(out["rows"], indent=1), "\n→", path)


if __name__ == "__main__":
    main()
