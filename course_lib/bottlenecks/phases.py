"""Prefill vs decode, measured on a small random-weight ``transformers`` Llama.

Prefill pushes many tokens through every weight matrix at once (a GEMM: each weight byte is
reused by every token, compute-bound); a decode step pushes one token per sequence (a GEMV at
batch 1: each weight byte is used for 2 FLOPs per sequence, bandwidth-bound). Batching decode
raises its intensity toward the ridge. The predicted FLOPs and bytes come from
``course_lib.models.accounting``; only the seconds come from the clock.
Introduced in 01_bottlenecks_2_prefill_decode.ipynb.
"""

from __future__ import annotations

import torch

from course_lib.core.dtypes import canonical, torch_dtype
from course_lib.measure.costs import check_positive_int


def tiny_llama(
    *,
    hidden_size: int = 1024,
    intermediate_size: int = 2816,
    num_layers: int = 4,
    num_heads: int = 8,
    num_kv_heads: int = 8,
    vocab_size: int = 4096,
    dtype: str = "fp32",
    seed: int = 0,
    device: str = "cpu",
):
    """A ``LlamaForCausalLM`` with random weights (no download) and its accounting ``ModelShape``.
    The default is ~59M parameters: 236 MB in fp32, far larger than a CPU's last-level cache, so a
    decode step really streams its weights from DRAM."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from course_lib.models.accounting import ModelShape

    for name, value in (
        ("hidden_size", hidden_size),
        ("intermediate_size", intermediate_size),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("num_kv_heads", num_kv_heads),
        ("vocab_size", vocab_size),
    ):
        check_positive_int(name, value)
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of num_heads ({num_heads})")
    tdt = torch_dtype(canonical(dtype))
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(device=device, dtype=tdt).eval()
    return model, ModelShape.from_config(config, name="tiny-llama")


def _cache_kw(model) -> str:
    """transformers >= 5.2x calls the KV-cache argument ``cache``; older releases ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _ids(model, batch: int, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, n), generator=gen).to(model.device)  # (B, T)


@torch.inference_mode()
def time_prefill(model, shape, *, batch: int, n_tokens: int, dtype: str = "fp32", repeats: int | None = None):
    """Time one forward pass over (batch, n_tokens) prompt tokens; FLOPs/bytes from accounting."""
    from course_lib.measure.bench import benchmark
    from course_lib.models.accounting import prefill_flops, prefill_step_bytes

    check_positive_int("batch", batch)
    check_positive_int("n_tokens", n_tokens)
    ids = _ids(model, batch, n_tokens, seed=1)  # (B, T)
    flops = prefill_flops(shape, n_tokens, batch)
    moved = prefill_step_bytes(shape, n_tokens, batch, dtype)  # weights read once + the KV cache written
    return benchmark(
        lambda: model(input_ids=ids, use_cache=False),
        flops=flops,
        bytes=moved,
        device=model.device.type,
        label=f"prefill b={batch} T={n_tokens}",
        dtype=dtype,
        repeats=repeats,
        warmup=1,
    )


def decode_step(model, *, batch: int, context_len: int = 16):
    """A callable that runs one decode step of ``batch`` sequences over a ``context_len``-token KV cache and
    crops the cache back, so every call sees the same context (what ``time_decode`` times, and what
    ``profiling.count_ops`` counts the torch ops of)."""
    from transformers import DynamicCache

    check_positive_int("batch", batch)
    check_positive_int("context_len", context_len)
    cache = DynamicCache(config=model.config)
    kw = {_cache_kw(model): cache}
    with torch.inference_mode():
        model(input_ids=_ids(model, batch, context_len, seed=2), use_cache=True, **kw)  # fill the cache
    step = _ids(model, batch, 1, seed=3)  # (B, 1)

    @torch.inference_mode()
    def one_step():
        model(input_ids=step, use_cache=True, **kw)
        cache.crop(-1)  # drop the token just added: every call sees the same context

    return one_step


@torch.inference_mode()
def time_decode(model, shape, *, batch: int, context_len: int = 16, dtype: str = "fp32", repeats: int | None = None):
    """Time one decode step: ``batch`` sequences, each with a ``context_len``-token KV cache, add
    one token. The cache is cropped back after every step so each timed call sees the same context."""
    from course_lib.measure.bench import benchmark
    from course_lib.models.accounting import decode_flops, decode_step_bytes

    one_step = decode_step(model, batch=batch, context_len=context_len)
    return benchmark(
        one_step,
        flops=decode_flops(shape, context_len, batch),
        bytes=decode_step_bytes(shape, context_len, batch, dtype),
        device=model.device.type,
        label=f"decode b={batch} ctx={context_len}",
        dtype=dtype,
        repeats=repeats,
        warmup=1,
    )


def unet_block(channels: int = 64, *, seed: int = 0) -> torch.nn.Module:
    """A UNet-style residual block (conv3x3 → GroupNorm → SiLU → conv3x3, plus the skip), the
    workhorse of image generators such as Stable Diffusion."""
    check_positive_int("channels", channels)
    torch.manual_seed(seed)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1)
            self.norm = torch.nn.GroupNorm(8 if channels % 8 == 0 else 1, channels)
            self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1)

        def forward(self, x):  # (B, C, H, W) -> (B, C, H, W)
            return x + self.conv2(torch.nn.functional.silu(self.norm(self.conv1(x))))

    return Block().eval()


def unet_block_cost(channels: int, h: int, w: int, batch: int = 1, dtype: str = "fp32"):
    """Two convolutions dominate: FLOPs of both; bytes = both convs' weights + image in and out
    (the intermediate activations counted once each way, a lower bound for an unfused block)."""
    from course_lib.measure.costs import Cost, conv2d_cost

    conv = conv2d_cost(batch, channels, channels, h, w, 3, dtype)
    return Cost(f"UNet block C={channels} {h}x{w}", 2 * conv.flops, 2 * conv.bytes)
