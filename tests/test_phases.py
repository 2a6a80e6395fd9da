"""Prefill/decode timing on a tiny random Llama: accounting matches the real model, rates are sane."""

import pytest
import torch

from course_lib.bottlenecks import phases
from course_lib.models import accounting


@pytest.fixture(scope="module")
def tiny():
    return phases.tiny_llama(
        hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=256
    )


def test_accounting_matches_the_model(tiny):
    model, shape = tiny
    assert accounting.param_count(shape) == sum(p.numel() for p in model.parameters())
    assert shape.num_kv_heads == 2 and shape.head_dim == 16


def test_decode_and_prefill_counts(tiny):
    model, shape = tiny
    d1 = phases.time_decode(model, shape, batch=1, context_len=8, repeats=2)
    d4 = phases.time_decode(model, shape, batch=4, context_len=8, repeats=2)
    assert d4.flops == pytest.approx(4 * d1.flops)
    assert d4.intensity > 3 * d1.intensity  # weights dominate the bytes: intensity ~ batch
    p = phases.time_prefill(model, shape, batch=1, n_tokens=32, repeats=2)
    assert p.intensity > 20 * d1.intensity
    assert p.flops == pytest.approx(accounting.prefill_flops(shape, 32))


def test_decode_cache_is_cropped_back(tiny):
    from transformers import DynamicCache

    model, shape = tiny
    cache = DynamicCache(config=model.config)
    kw = {phases._cache_kw(model): cache}
    with torch.inference_mode():
        model(input_ids=torch.zeros(1, 5, dtype=torch.long), use_cache=True, **kw)
        model(input_ids=torch.zeros(1, 1, dtype=torch.long), use_cache=True, **kw)
    cache.crop(-1)
    assert cache.get_seq_length() == 5


def test_unet_block_is_dense():
    blk = phases.unet_block(16)
    x = torch.randn(1, 16, 8, 8)
    with torch.inference_mode():
        assert blk(x).shape == x.shape
    cost = phases.unet_block_cost(64, 64, 64)
    assert cost.intensity > 50  # every conv weight reused at 4096 pixels
    with pytest.raises(ValueError, match="channels must be a positive int"):
        phases.unet_block(0)
