"""KV-cache quantization: int8/int4 absmax or fp8-e4m3 storage of K and V, its bytes and its price in quality.

A decode step reads the whole cache, so storing it in fewer bits is bandwidth and capacity at once. Absmax
quantization keeps one scale per group: per *token* (one scale per token and KV head, over ``head_dim``;
each token is quantized once, when it is written, as LMDeploy's online int8/int4 cache does, where vLLM's
fp8 and TensorRT-LLM's int8 caches use one calibrated scale per tensor) or per *channel* (one scale per
channel over a group of tokens). KIVI (Liu et al., 2024) and KVQuant (Hooper et al., 2024) found that keys
have outlier *channels*, so they quantize K per channel and V per token; :func:`roundtrip_error` measures
that on real tensors. fp8-e4m3 (1 sign, 4 exponent, 3 mantissa bits) needs no integer grid; here it uses
vLLM's default per-tensor scale of 1.0. Keys are quantized after RoPE, as the engine's cache holds them
(KVQuant quantizes them before RoPE, where their channels are steadier). :class:`QuantizedKVBackend` is
the engine's contiguous cache with every written token's K/V round-tripped through the chosen format
(storage simulated in fp32: the values attention reads are exactly those a quantized cache would return;
the bytes come from :func:`quantize` on the same tensors). :func:`cache_perplexity` scores a text through
it. ``python -m course_lib.kv.kv_quant`` records SmolLM2 to ``data/measurements/smollm2-kv-quant.json``.
Introduced in 05_attention_kv_cache.ipynb."""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass

import torch

from course_lib.engine.attention.contiguous import ContiguousBackend
from course_lib.kv.checks import check_int

SCHEMES = ("fp32", "int8-token", "int4-token", "int8-channel", "int4-channel", "fp8-e4m3")
PER_TOKEN = ("fp32", "int8-token", "int4-token", "fp8-e4m3")  # what a cache written token by token can do
FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def _check_scheme(scheme: str, allowed=SCHEMES) -> str:
    if scheme not in allowed:
        raise ValueError(f"scheme must be one of {list(allowed)}, got {scheme!r}")
    return scheme


def _bits(scheme: str) -> int:
    return {"fp32": 32, "fp8-e4m3": 8}.get(scheme) or int(scheme[3])


@dataclass(frozen=True)
class Quantized:
    """What a quantized cache stores: ``data`` (int8, uint8 nibble pairs or float8) and ``scale`` (fp16)."""

    data: torch.Tensor
    scale: torch.Tensor | None
    scheme: str
    shape: tuple

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.scale is None else self.scale.nbytes)


def quantize(x: torch.Tensor, scheme: str) -> Quantized:
    """Quantize ``x`` (..., T, head_dim): '-token' scales over head_dim, '-channel' over the T tokens."""
    _check_scheme(scheme)
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_floating_point():
        raise ValueError(f"x must be a float tensor (..., T, head_dim), got {type(x).__name__}")
    if scheme == "fp32":
        return Quantized(x.float().clone(), None, scheme, tuple(x.shape))
    if scheme == "fp8-e4m3":  # per-tensor scale 1.0 (vLLM's default without calibration); clamp, no inf
        return Quantized(x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), None, scheme, tuple(x.shape))
    bits = _bits(scheme)
    qmax = 2 ** (bits - 1) - 1  # 127 or 7: symmetric absmax
    dim = -1 if scheme.endswith("token") else -2
    scale = (x.float().abs().amax(dim=dim, keepdim=True) / qmax).clamp_min(1e-8).half()  # (..., T, 1) or (..., 1, d)
    q = torch.round(x.float() / scale.float()).clamp(-qmax, qmax).to(torch.int8)
    if bits == 4:  # two nibbles per byte, as an int4 cache stores them
        if q.shape[-1] % 2:
            raise ValueError(f"int4 packing needs an even head_dim, got {q.shape[-1]}")
        u = (q + 8).to(torch.uint8)
        q = u[..., 0::2] | (u[..., 1::2] << 4)
    return Quantized(q, scale, scheme, tuple(x.shape))


def dequantize(qt: Quantized) -> torch.Tensor:
    """Back to fp32, the values attention reads."""
    if qt.scheme == "fp32":
        return qt.data
    if qt.scheme == "fp8-e4m3":
        return qt.data.float()
    q = qt.data
    if _bits(qt.scheme) == 4:
        lo, hi = (q & 0xF).to(torch.int8) - 8, (q >> 4).to(torch.int8) - 8
        q = torch.stack((lo, hi), dim=-1).flatten(-2)
    return q.float() * qt.scale.float()


def roundtrip(x: torch.Tensor, scheme: str) -> torch.Tensor:
    return dequantize(quantize(x, scheme)).to(x.dtype)


def roundtrip_error(x: torch.Tensor, scheme: str) -> float:
    """‖x − dequant(quant(x))‖ / ‖x‖."""
    return float((roundtrip(x, scheme).float() - x.float()).norm() / x.float().norm().clamp_min(1e-30))


def predicted_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, scheme: str, group: int) -> float:
    """2 · layers · kv_heads · (head_dim · bits/8 + scale bytes): a 2-byte scale per head per token, or
    ``head_dim`` 2-byte scales per head per group of ``group`` tokens (per channel)."""
    _check_scheme(scheme)
    bits = _bits(scheme)
    if scheme in ("fp32", "fp8-e4m3"):
        scale = 0.0  # no scales (fp8: one per-tensor scale, nothing per token)
    elif scheme.endswith("token"):
        scale = 2.0  # one fp16 scale per token and head
    else:
        check_int("group", group, 1)
        scale = 2.0 * head_dim / group  # head_dim fp16 scales shared by `group` tokens
    return 2 * num_layers * num_kv_heads * (head_dim * bits / 8 + scale)


def measured_bytes_per_token(k_layers, v_layers, scheme: str) -> float:
    """Σ nbytes of every layer's quantized K and V (data + scales) / tokens, from real (Hkv, T, hd) tensors."""
    T = k_layers[0].shape[-2]
    return sum(quantize(t, scheme).nbytes for t in list(k_layers) + list(v_layers)) / T


class QuantizedKVBackend(ContiguousBackend):
    """The contiguous cache whose written K/V round-trip through ``scheme`` (a per-token one) first."""

    name = "contiguous+kvquant"

    def __init__(self, *args, scheme: str = "int8-token", **kwargs) -> None:
        self.scheme = _check_scheme(scheme, PER_TOKEN)
        super().__init__(*args, **kwargs)

    @classmethod
    def from_engine(cls, engine, scheme: str, max_len: int, max_seqs: int = 1) -> QuantizedKVBackend:
        m = engine.model
        return cls(m.num_layers, m.num_kv_heads, m.head_dim, max_len, max_seqs, m.dtype, m.device, scheme=scheme)

    def forward(self, layer, q, k, v, meta):
        if self.scheme != "fp32":
            k, v = roundtrip(k, self.scheme), roundtrip(v, self.scheme)  # (N, Hkv, hd): per token and head
        return super().forward(layer, q, k, v, meta)


@torch.inference_mode()
def cache_perplexity(engine, ids, backend: ContiguousBackend) -> tuple[float, torch.Tensor]:
    """Perplexity of ``ids`` prefilled through ``backend`` with the engine's model, and the argmax token at
    every position (teacher-forced: what greedy would pick next). Leaves the text's K/V in row 0."""
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1).to(engine.model.device)
    T = ids.numel()
    if T < 2 or T > backend.max_len:
        raise ValueError(f"ids must hold 2..{backend.max_len} tokens (the backend's max_len), got {T}")
    h = backend.allocate()
    try:
        backend.append(h, T)
        positions = torch.arange(T, device=ids.device)  # (T,)
        meta = backend.prepare([h], [T], positions)
        x = engine.model.run_layers(engine.model.embed(ids), positions, meta, backend)  # (T, D)
    finally:
        backend.free(h)
    nll, top = 0.0, []
    for a in range(0, T - 1, 32):  # the LM head 32 rows at a time: (32, V) logits, not (T, V)
        b = min(a + 32, T - 1)
        logits = engine.model.head(x[a:b]).float()  # (≤32, V)
        nll += float(torch.nn.functional.cross_entropy(logits, ids[a + 1 : b + 1], reduction="sum"))
        top.append(logits.argmax(-1).cpu())
    return math.exp(nll / (T - 1)), torch.cat(top)


def cached_kv(backend: ContiguousBackend, T: int, row: int = 0):
    """The real K and V a run left in ``row``: per layer (Hkv, T, hd)."""
    return [k[row, :, :T] for k in backend.k], [v[row, :, :T] for v in backend.v]


def kv_quant_rows(engine, ids, group: int | None = None) -> list[dict]:
    """Per scheme: bytes per token predicted and measured on the real cache, K and V round-trip error, and
    (per-token schemes) perplexity and teacher-forced top-1 agreement with fp32 through the engine."""
    T = len(ids)
    group = group or T
    m = engine.model
    ref = QuantizedKVBackend.from_engine(engine, "fp32", T)
    ppl32, top32 = cache_perplexity(engine, ids, ref)
    K, V = cached_kv(ref, T)
    rows = []
    for s in SCHEMES:
        row = {
            "scheme": s,
            "bytes_per_token_predicted": predicted_bytes_per_token(m.num_layers, m.num_kv_heads, m.head_dim, s, group),
            "bytes_per_token_measured": measured_bytes_per_token(K, V, s),
            "k_error": sum(roundtrip_error(k, s) for k in K) / len(K),
            "v_error": sum(roundtrip_error(v, s) for v in V) / len(V),
            "ppl": None,
            "top1_agreement": None,
        }
        if s == "fp32":
            row["ppl"], row["top1_agreement"] = ppl32, 1.0
        elif s in PER_TOKEN:
            ppl, top = cache_perplexity(engine, ids, QuantizedKVBackend.from_engine(engine, s, T))
            row["ppl"], row["top1_agreement"] = ppl, float((top == top32).float().mean())
        rows.append(row)
    return rows


def greedy_agreement(engine, prompts, params, scheme: str) -> float:
    """Share of greedy tokens equal to the fp32 cache's, position by position, until the first difference."""
    from course_lib.kv.paged_serving import with_backend

    ref = [r.output_ids for r in engine.generate(list(prompts), params)]
    longest = max(len(i) for i in engine.encode(list(prompts))) + params.max_new_tokens
    qb = QuantizedKVBackend.from_engine(engine, scheme, longest, max_seqs=len(prompts))
    with with_backend(engine, qb):
        out = [r.output_ids for r in engine.generate(list(prompts), params)]
    same = 0
    for a, b in zip(ref, out):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same += n
    return same / sum(len(a) for a in ref)


def record(T: int = 2048, new_tokens: int = 48) -> dict:
    """SmolLM2 on the held-out text of ``T`` tokens (as the sliding-window record) and greedy agreement."""
    from course_lib.core.paths import data_dir
    from course_lib.engine import Engine, SamplingParams, SchedulerConfig
    from course_lib.kv.sliding_window import held_out_ids
    from course_lib.measure.hardware import detect_device

    eng = Engine("smollm2-135m-instruct", config=SchedulerConfig(max_model_len=T, max_num_seqs=2), linear="packed")
    ids = held_out_ids(eng.tokenizer, T)
    rows = kv_quant_rows(eng, ids)
    prompts = [
        eng.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in ("What is the capital of France?", "Write a Python function that reverses a string.")
    ]
    p = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    greedy = {s: greedy_agreement(eng, prompts, p, s) for s in PER_TOKEN if s != "fp32"}
    return {
        "model": "smollm2-135m-instruct",
        "tokens": T,
        "rows": rows,
        "greedy_agreement": greedy,
        "greedy_new_tokens": new_tokens,
        "machine": detect_device().describe(),
        "measured": time.strftime("%Y-%m-%d %H:%M"),
        "command": f"python -m course_lib.kv.kv_quant --tokens {T}",
        "_path": str(data_dir() / "measurements" / "smollm2-kv-quant.json"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="record SmolLM2's perplexity with a quantized KV cache")
    ap.add_argument("--tokens", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = record(args.tokens)
    path = out.pop("_path")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps(out, indent=1), "\n→", path)


if __name__ == "__main__":
    main()


def format_rows(rows: list[dict]) -> str:
    """One line per scheme: bytes per token (predicted / measured), K and V error, perplexity, agreement."""
    ref = next(r for r in rows if r["scheme"] == "fp32")
    out = [
        f"{'scheme':<14}{'B/token pred':>13}{'measured':>10}{'K err':>8}{'V err':>8}{'ppl':>9}{'Δppl':>8}{'top-1':>7}"
    ]
    for r in rows:
        ppl = "" if r["ppl"] is None else f"{r['ppl']:9.3f}{r['ppl'] / ref['ppl'] - 1:+8.2%}{r['top1_agreement']:7.1%}"
        out.append(
            f"{r['scheme']:<14}{r['bytes_per_token_predicted']:>13,.0f}{r['bytes_per_token_measured']:>10,.0f}"
            f"{r['k_error']:>8.4f}{r['v_error']:>8.4f}{ppl}"
        )
    return "\n".join(out)


def verdicts(rows: list[dict], label: str = "") -> list:
    """The chapter's claims on one set of rows: int8 and fp8 caches cost < 1% perplexity; at 4 bits, keys
    quantized per channel err ≥ 1.5× less than per token, values per token ≥ 1.1× less than per channel
    (KIVI/KVQuant: outlier channels in K, none in V)."""
    from course_lib.measure.claims import claim

    by = {r["scheme"]: r for r in rows}
    for s in SCHEMES:
        if s not in by:
            raise ValueError(f"rows must hold the scheme {s!r} (from kv_quant_rows), got {sorted(by)}")
    base = by["fp32"]["ppl"]
    why = {
        "int8-token": "this text or model has K/V outliers the per-token scale cannot hold; see the K/V error columns",
        "fp8-e4m3": "fp8-e4m3 keeps 3 mantissa bits: every element carries a relative error of a few percent "
        "(the K/V error columns), where int8's 255 levels per token and head err less",
    }
    out = [
        claim(
            f"{label}an {s} KV cache costs < 1% perplexity",
            by[s]["ppl"] / base - 1,
            at_most=0.01,
            why_not=why[s],
        )
        for s in ("int8-token", "fp8-e4m3")
    ]
    out.append(
        claim(
            f"{label}at 4 bits, per-channel keys err ≥ 1.5× less than per-token keys (KIVI)",
            by["int4-token"]["k_error"] / by["int4-channel"]["k_error"],
            at_least=1.5,
            why_not="this model's keys have no outlier channels for a per-channel scale to isolate",
        )
    )
    out.append(
        claim(
            f"{label}at 4 bits, per-token values err ≥ 1.1× less than per-channel values (KIVI)",
            by["int4-channel"]["v_error"] / by["int4-token"]["v_error"],
            at_least=1.1,
            why_not="over a short text each channel's scale covers few tokens and stays tight; over a long one "
            "an outlier token sets it for every token of the group",
        )
    )
    return out
