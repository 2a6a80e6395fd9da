"""Paged vs contiguous KV cache: one decode step of tiny-target timed with each backend, whole and attention alone.

Decode is bandwidth-bound: the step streams the weights and every cached K/V once. The paged backend's
torch path gathers each sequence's blocks into a padded copy first, writing and re-reading every cached
byte once more; this measures what that costs on top of the contiguous slab (the Triton paged-decode
kernel reads the blocks in place instead). Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from course_lib.measure.costs import check_positive_int


@dataclass(frozen=True)
class PagedStep:
    """Decode-step and attention-only times of one backend at a batch and context (median of rounds)."""

    backend: str
    step_s: float
    attention_s: float


def paged_step_times(
    batch: int = 8, context: int = 256, repeats: int = 10, rounds: int = 3, block_size: int = 16, model="tiny-target"
) -> dict[str, PagedStep]:
    """Time one decode step of ``model`` (the whole forward) and its attention alone, with the contiguous and
    the paged backend (torch gather path), at ``batch`` sequences of ``context`` cached tokens. Rounds
    alternate between the backends, so a noisy neighbour slows both. Each repeat appends one token and
    truncates it back, so every repeat decodes at the same length."""
    import torch

    from course_lib.engine.attention.contiguous import ContiguousBackend
    from course_lib.engine.attention.paged import PagedBackend
    from course_lib.engine.engine import Engine
    from course_lib.engine.model import LlamaEngineModel
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.measure.bench import benchmark
    from course_lib.models.load import load_model

    for name, value in (("batch", batch), ("context", context), ("repeats", repeats), ("rounds", rounds)):
        check_positive_int(name, value)
    hf, tok = load_model(model)
    m = LlamaEngineModel(hf)
    if context + block_size > m.max_position:
        raise ValueError(f"context must be ≤ {m.max_position - block_size} for {model}, got {context}")
    cfg = SchedulerConfig(max_num_seqs=batch, max_model_len=context + block_size)
    backends = {
        "contiguous": ContiguousBackend(m.num_layers, m.num_kv_heads, m.head_dim, context + block_size, batch),
        "paged": PagedBackend.for_model(m, cfg, block_size=block_size, decode="gather"),
    }
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, m.vocab_size, (batch, context), generator=g).tolist()
    H, Hkv, hd = m.num_heads, m.num_kv_heads, m.head_dim
    q, k, v = (
        torch.randn(batch, H, hd, generator=g),
        torch.randn(batch, Hkv, hd, generator=g),
        torch.randn(batch, Hkv, hd, generator=g),
    )
    pos = torch.full((batch,), context)
    fns = {}
    with torch.inference_mode():
        for name, kv in backends.items():
            eng = Engine(hf, tok, config=cfg, backend=kv)
            handles = [kv.allocate() for _ in range(batch)]
            for h in handles:
                kv.append(h, context)
            eng.forward(handles, prompts, [0] * batch)  # prefill: every sequence holds `context` tokens

            def step(eng=eng, kv=kv, handles=handles):
                for h in handles:
                    kv.append(h, 1)
                eng.forward(handles, [[7]] * batch, [context] * batch)
                for h in handles:
                    kv.truncate(h, context)

            def attention(kv=kv, handles=handles):
                for h in handles:
                    kv.append(h, 1)
                meta = kv.prepare(handles, [1] * batch, pos)
                for layer in range(m.num_layers):
                    kv.forward(layer, q, k, v, meta)
                for h in handles:
                    kv.truncate(h, context)

            fns[name] = (step, attention)
        res = {n: ([], []) for n in backends}
        for _ in range(rounds):
            for name, (step, attention) in fns.items():
                res[name][0].append(benchmark(step, warmup=2, repeats=repeats, device="cpu").median_s)
                res[name][1].append(benchmark(attention, warmup=2, repeats=repeats, device="cpu").median_s)
    return {n: PagedStep(n, statistics.median(s), statistics.median(a)) for n, (s, a) in res.items()}
