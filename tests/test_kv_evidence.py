"""Chapter 05's verdicts as measurements that can fail (issue 24): K/V bytes read off the real tensors, MQA's
gap classified from the rows, the paged engine's measured waste against the block arithmetic, every stored
GPU FlashAttention case summarised, and the figure fixes."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from course_lib import data_dir
from course_lib.kv import paged_memory
from course_lib.kv.heads_timing import gap_by_context, tensor_bytes_per_token
from course_lib.kv.stored_flash import flash_summary
from course_lib.measure.claims import claim


def test_tensor_bytes_per_token_reads_the_tensors():
    layers, rows, heads, max_len, hd = 3, 2, 2, 8, 4
    k = [torch.zeros(rows, heads, max_len, hd) for _ in range(layers)]
    honest = SimpleNamespace(k=k, v=[t.clone() for t in k])
    formula = 2 * layers * heads * hd * 4
    assert tensor_bytes_per_token(honest) == formula
    padded = SimpleNamespace(k=[torch.zeros(rows, heads, max_len, hd + 4) for _ in range(layers)], v=honest.v)
    bad = tensor_bytes_per_token(padded) / formula - 1
    assert not claim("the real K/V tensors hold exactly the formula's bytes", abs(bad), at_most=0.0)
    with pytest.raises(ValueError, match="no K/V tensors"):
        tensor_bytes_per_token(SimpleNamespace())


def _row(kv, ctx, measured, predicted):
    return SimpleNamespace(num_kv_heads=kv, context=ctx, measured_ms=measured, predicted_ms=predicted)


def test_gap_by_context_tells_fixed_from_growing():
    fixed_rows = [_row(1, 256, 5.0, 2.0), _row(1, 1024, 5.9, 2.8)]  # gap 3.0 → 3.1: fixed
    grow_rows = [_row(1, 256, 3.0, 2.0), _row(1, 1024, 9.0, 2.8)]  # gap 1.0 → 6.2: grows
    assert gap_by_context(fixed_rows)[1] is True
    assert gap_by_context(grow_rows)[1] is False
    with pytest.raises(ValueError, match="contexts"):
        gap_by_context([_row(1, 256, 1, 1)])


def test_engine_waste_matches_block_arithmetic():
    from course_lib.engine import Engine, SamplingParams

    eng = Engine("tiny-target", kv_cache="paged")
    prompts = ["def f(x):\n    return x" * k for k in (1, 3)] + ["import os"]
    w = paged_memory.engine_waste(eng, prompts, SamplingParams(max_new_tokens=20, ignore_eos=True))
    theory = paged_memory.fragmentation(w.request_mix, 2048, 16).waste("paged")
    assert 0 < w.waste < 1 and abs(w.waste - theory) <= 0.02
    assert not claim("matches within 2 points", abs(w.waste - (theory + 0.05)), at_most=0.02)  # a counter-example
    with pytest.raises(ValueError, match="paged"):
        paged_memory.engine_waste(Engine("tiny-target"), prompts, SamplingParams(max_new_tokens=2))


def test_flash_summary_shows_every_stored_case():
    stored = json.loads((data_dir() / "measurements" / "nvidia-h200.json").read_text())
    s = flash_summary(stored)
    assert s.cases == 32 and s.met == 0
    assert s.vs_sdpa[0] == pytest.approx(0.57, abs=0.01) and s.vs_sdpa[1] == pytest.approx(0.87, abs=0.01)
    assert s.vs_naive[0] > 2 and "0.57-0.87×" in s.describe()
    with pytest.raises(ValueError, match="flash_attention"):
        flash_summary({"gpu": "x"})


def test_uptrain_plot_keeps_the_reference_inside_the_frame():
    import matplotlib

    matplotlib.use("Agg")
    from course_lib.kv.plots import plot_uptrain

    log = {
        "train_loss": [3.0, 2.9],
        "log": [{"step": 0, "val": {"perplexity": 30.0}}, {"step": 2, "val": {"perplexity": 29.0}}],
    }
    ax = plot_uptrain(log, original_ppl=28.35)
    right = ax.figure.axes[-1]
    lo, hi = right.get_ylim()
    assert lo < 28.35 < hi and ax.get_title()


def test_explorer_says_weights_and_kv_share_the_dtype_and_uses_one_unit():
    from course_lib.kv.explorer import draw_kv

    _, text = draw_kv("llama-2-7b", "H100 SXM", "fp8", 4096, 1)
    assert "weights and KV cache both in fp8" in text and "85.9 GB" in text


def test_mla_accounting_for_deepseek_v2():
    from course_lib.kv.latent import (
        DEEPSEEK_V2,
        MLAConfig,
        cross_layer_bytes,
        gqa_equivalent_groups,
        mha_elements_per_token,
        mla_elements_per_token,
    )

    assert mla_elements_per_token(DEEPSEEK_V2) == 60 * 576  # 34,560 elements: 69,120 B in bf16
    assert mha_elements_per_token(DEEPSEEK_V2) == 60 * 128 * 320
    assert gqa_equivalent_groups(DEEPSEEK_V2) == 2.25  # the paper's "equal to GQA with only 2.25 groups"
    assert cross_layer_bytes(1000, 2) == 500
    with pytest.raises(ValueError, match="kv_lora_rank"):
        MLAConfig("x", 1, 1, 1, 1, 1, 0)


def test_window_mask_and_bytes():
    from course_lib.kv.sliding_window import kv_bytes, window_mask, window_perplexity

    m = window_mask(6, 2, sinks=1)
    assert m[5].tolist() == [True, False, False, False, True, True]  # the sink, then the last 2
    assert window_mask(4, None).equal(torch.ones(4, 4, dtype=torch.bool).tril())
    assert kv_bytes(100, 8192, 512, 4) == 100 * 516 and kv_bytes(100, 300, 512, 4) == 100 * 300
    with pytest.raises(ValueError, match="window"):
        window_mask(4, 0)
    from course_lib.models.load import load_model
    from course_lib.serving import prompt_pool

    model, tok = load_model("tiny-target")
    ids = torch.tensor(prompt_pool(tok, 96)[:96])
    full = window_perplexity(model, ids, None)
    with torch.inference_mode():  # the 4D mask with full attention is the model's own causal forward
        logits = model(input_ids=ids[None]).logits[0, :-1]
    ref = math.exp(float(torch.nn.functional.cross_entropy(logits, ids[1:])))
    assert full == pytest.approx(ref, rel=1e-5)
    assert window_perplexity(model, ids, 4) > full  # a 4-token window loses context: the mask took effect
