"""Chapter 05's KV additions: a quantized cache path, the radix prefix tree, cache operations, offload."""

import math
import random

import pytest
import torch

from course_lib.engine import Engine, SamplingParams, SchedulerConfig
from course_lib.kv import cache_ops, kv_quant, offload, radix
from course_lib.measure.claims import Verdict


@pytest.fixture(scope="module")
def tiny():
    return Engine("tiny-target", config=SchedulerConfig(max_num_seqs=2, max_model_len=96), linear="reference")


# ---------------------------------------------------------------- quantization
@pytest.mark.parametrize("scheme", kv_quant.SCHEMES)
def test_quantize_round_trip_and_bytes(scheme):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 40, 64, generator=g)
    x[..., 5] *= 20  # an outlier channel, as keys have
    qt = kv_quant.quantize(x, scheme)
    err = kv_quant.roundtrip_error(x, scheme)
    bound = {"fp32": 0, "int8-token": 0.02, "int8-channel": 0.01, "fp8-e4m3": 0.04}.get(scheme, 0.3)
    assert err <= bound
    pred = kv_quant.predicted_bytes_per_token(1, 3, 64, scheme, group=40) / 2  # one tensor, not K and V
    assert qt.nbytes / 40 == pytest.approx(pred)


def test_per_channel_beats_per_token_on_outlier_channels():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 64, 64, generator=g)
    x[..., 3] *= 30
    assert kv_quant.roundtrip_error(x, "int4-token") > 1.5 * kv_quant.roundtrip_error(x, "int4-channel")


def test_engine_path_fp32_equals_dense_logits_and_int8_is_close(tiny):
    ids = tiny.encode(["def fibonacci(n):\n    if n < 2:\n        return n\n    return fib"])[0]
    ref = kv_quant.QuantizedKVBackend.from_engine(tiny, "fp32", len(ids))
    ppl, top = kv_quant.cache_perplexity(tiny, ids, ref)
    with torch.inference_mode():
        dense = tiny.model.dense_logits(torch.tensor([ids]))[0].float()
    want = math.exp(float(torch.nn.functional.cross_entropy(dense[:-1], torch.tensor(ids[1:]))))
    assert ppl == pytest.approx(want, rel=1e-5)
    assert torch.equal(top, dense[:-1].argmax(-1))
    ppl8, _ = kv_quant.cache_perplexity(
        tiny, ids, kv_quant.QuantizedKVBackend.from_engine(tiny, "int8-token", len(ids))
    )
    assert ppl8 != ppl and abs(ppl8 / ppl - 1) < 0.05
    ppl4, _ = kv_quant.cache_perplexity(
        tiny, ids, kv_quant.QuantizedKVBackend.from_engine(tiny, "int4-token", len(ids))
    )
    assert abs(ppl4 / ppl - 1) > abs(ppl8 / ppl - 1)


def test_greedy_through_fp32_path_is_identical(tiny):
    p = SamplingParams(max_new_tokens=6, ignore_eos=True)
    assert kv_quant.greedy_agreement(tiny, ["def add(a, b):"], p, "fp32") == 1.0


def _rows(over=None):
    rows = {s: dict(scheme=s, ppl=10.0, k_error=0.1, v_error=0.1) for s in kv_quant.SCHEMES}
    rows["int4-token"]["k_error"], rows["int4-channel"]["v_error"] = 0.2, 0.13
    for (s, key), val in (over or {}).items():
        rows[s][key] = val
    return list(rows.values())


def test_kv_quant_verdicts_hold_and_fail():
    assert all(kv_quant.verdicts(_rows()))
    bad = kv_quant.verdicts(_rows({("int8-token", "ppl"): 10.5, ("int4-token", "k_error"): 0.11}))
    assert [bool(v) for v in bad] == [False, True, False, True]
    assert not kv_quant.verdicts(_rows({("int4-channel", "v_error"): 0.1}))[3]
    assert all(isinstance(v, Verdict) for v in bad)


def test_bad_input():
    with pytest.raises(ValueError, match="scheme must be one of"):
        kv_quant.quantize(torch.zeros(2, 4), "int3")
    with pytest.raises(ValueError, match="scheme must be one of"):
        kv_quant.QuantizedKVBackend(2, 1, 16, 8, 1, scheme="int4-channel")  # not writable token by token
    with pytest.raises(ValueError, match="scheme"):
        kv_quant.verdicts([{"scheme": "fp32"}])


# ---------------------------------------------------------------- radix tree
def test_radix_match_equals_brute_force():
    rng = random.Random(0)
    tree, cached = radix.RadixCache(), []
    for _ in range(300):
        base = rng.choice(cached) if cached and rng.random() < 0.7 else []
        seq = base[: rng.randint(0, len(base))] + [rng.randint(0, 5) for _ in range(rng.randint(1, 12))]
        probe = seq[: rng.randint(1, len(seq))] + [rng.randint(0, 5)]
        assert tree.match(probe) == radix.brute_force_match(cached, probe)
        tree.insert(seq)
        cached.append(seq)
        assert tree.match(seq) == len(seq)
    distinct = set()
    for c in cached:
        distinct |= {tuple(c[: i + 1]) for i in range(len(c))}
    assert tree.tokens == len(distinct)  # each distinct prefix token stored once


def test_radix_evicts_least_recently_used_leaf():
    tree = radix.RadixCache(capacity=12)
    tree.insert([1, 2, 3, 4, 5, 6])
    tree.insert([1, 2, 3, 7, 8, 9])
    tree.match([1, 2, 3, 4])  # touch the first branch
    tree.insert([1, 2, 3, 10, 11, 12, 13])  # 16 tokens > 12: the [7, 8, 9] leaf goes
    assert tree.match([1, 2, 3, 7, 8, 9]) == 3
    assert tree.match([1, 2, 3, 4, 5, 6]) == 6
    assert tree.tokens <= 12


def test_hit_rates_unbounded_radix_wins_by_at_most_partial_blocks():
    stream = radix.multi_turn_stream(num_convs=8, system_len=50, seed=1)
    h = radix.hit_rates(stream, 1 << 20, 16)
    assert h.block_hits == h.radix_hits - h.tail_bound  # a fact of the two structures, with room for all
    assert 0 < h.block < h.radix < 1
    tight = radix.hit_rates(stream, 1024, 16)
    assert tight.radix < h.radix and tight.block < h.block


def test_stream_shapes():
    s = radix.multi_turn_stream(num_convs=5, system_len=20, seed=2)
    assert all(served[: len(p)] == p and len(served) > len(p) for p, served in s)
    assert all(p[:20] == s[0][0][:20] for p, _ in s)  # one system prompt
    with pytest.raises(ValueError, match="capacity must be"):
        radix.hit_rates(s, 16)
    with pytest.raises(ValueError, match="num_convs"):
        radix.multi_turn_stream(num_convs=0)


# ---------------------------------------------------------------- cache operations and offload
def test_op_times_fork_copies_in_the_slab_only():
    c, p = cache_ops.smollm2_backends(40)
    oc, op = cache_ops.op_times(c, 40, 3), cache_ops.op_times(p, 40, 3)
    assert oc.fork_bytes == 40 * c.bytes_per_token and op.fork_bytes == 0
    assert c.num_free_rows() == 2 and p.blocks.num_free == p.num_blocks  # everything given back


def test_offload_model_and_break_even():
    m = offload.OffloadModel(1000.0, 1e6, 2, 4, 8, 1e9, 0.0, 1e12)  # copy 1 µs/token, weights 2 ns/token
    be = offload.break_even_tokens(m)
    assert m.transfer_s(int(be)) == pytest.approx(m.recompute_s(int(be)), rel=0.01)
    assert offload.break_even_tokens(offload.OffloadModel(1.0, 1e9, 2, 4, 8, 1e9, 0.0, 1e12)) == 0.0
    with pytest.raises(ValueError, match="link must be"):
        offload.link("carrier-pigeon")


def test_measure_swap_round_trips():
    from course_lib.engine.attention.paged import PagedBackend

    pool = PagedBackend(2, 1, 16, num_blocks=8, block_size=4)
    t_out, t_in, nbytes = offload.measure_swap(pool, 10, repeats=2)
    assert t_out > 0 and t_in > 0 and nbytes == 3 * pool.bytes_per_block
    assert pool.blocks.num_free == 8


def test_notebook_verdicts_hold_and_fail():
    fast = cache_ops.OpTimes("contiguous", 64, 1e-6, 1e-3, 1e-6, 100, 0.05)
    table = cache_ops.OpTimes("paged", 64, 1e-6, 1e-5, 1e-6, 0, 0.05)
    assert cache_ops.fork_verdict(fast, table)
    assert not cache_ops.fork_verdict(fast, cache_ops.OpTimes("paged", 64, 1e-6, 5e-4, 1e-6, 0, 0.05))
    with pytest.raises(ValueError, match="one length"):
        cache_ops.fork_verdict(fast, cache_ops.OpTimes("paged", 65, 1e-6, 1e-5, 1e-6, 0, 0.05))
    assert offload.copy_verdict([1.0, 1.1], 0.01)
    assert not offload.copy_verdict([1.0, 1.1], 0.5)
    win = radix.HitRates(100, 60, 50, 16, 2048, 5)
    assert radix.eviction_verdict(win) and not radix.eviction_verdict(radix.HitRates(100, 50, 60, 16, 2048, 5))
