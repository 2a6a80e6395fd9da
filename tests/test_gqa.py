"""MHA / GQA / MQA (course_lib.kv: heads_timing, heads_pooling, uptraining): K/V head pooling, the engine on a
converted model, cache bytes, uptraining."""

import json

import pytest
import torch

from course_lib.kv.heads_pooling import convert_kv_heads, pool_kv_weight
from course_lib.kv.heads_timing import attention_kind, kv_heads_rows
from course_lib.kv.plots import format_kv_rows, plot_kv_heads, plot_uptrain
from course_lib.kv.uptraining import UPTRAINED_NAME, load_uptrained, uptrain, uptrained_dir
from course_lib.models.load import load_model


@pytest.fixture(scope="module")
def target():
    return load_model("tiny-target")


def small_llama(kv_heads: int, heads: int = 4, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


def test_same_number_of_heads_is_the_identity(target):
    model, _ = target
    same = convert_kv_heads(model, model.config.num_key_value_heads)
    assert same is not model
    x = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(same(input_ids=x).logits, model(input_ids=x).logits)


def test_converted_shapes_and_untouched_weights(target):
    model, _ = target
    mqa = convert_kv_heads(model, 1)
    cfg = mqa.config
    assert cfg.num_key_value_heads == 1 and model.config.num_key_value_heads == 2  # the source is not modified
    assert cfg.num_attention_heads == 8 and cfg.head_dim == 32
    a = mqa.model.layers[0].self_attn
    assert a.k_proj.weight.shape == (32, 256) and a.v_proj.weight.shape == (32, 256)
    assert a.q_proj.weight.shape == (256, 256)
    old = model.state_dict()
    for name, w in mqa.state_dict().items():
        if "k_proj" not in name and "v_proj" not in name:
            assert torch.equal(w, old[name]), name
    saved = 2 * 6 * 32 * 256  # one K and one V head of 32 rows x 256 fewer per layer
    assert sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in mqa.parameters()) == saved
    assert not mqa.training and next(mqa.parameters()).dtype == torch.float32


@pytest.mark.parametrize("old,new", [(2, 1), (4, 2), (4, 1)])
def test_pooling_is_the_mean_of_the_grouped_heads(old, new):
    model = small_llama(old)
    out = convert_kv_heads(model, new)
    hd, r = 16, old // new
    for layer_old, layer_new in zip(model.model.layers, out.model.layers):
        for proj in ("k_proj", "v_proj"):
            w_old = getattr(layer_old.self_attn, proj).weight  # (old·hd, D)
            w_new = getattr(layer_new.self_attn, proj).weight  # (new·hd, D)
            for j in range(new):
                expect = torch.stack([w_old[(j * r + i) * hd : (j * r + i + 1) * hd] for i in range(r)]).mean(0)
                torch.testing.assert_close(w_new[j * hd : (j + 1) * hd], expect, atol=1e-7, rtol=0)
    # the bias path (Qwen2-style projections) pools the same way
    b = torch.arange(old * 3, dtype=torch.float32)  # (old·hd,) with hd = 3
    assert torch.equal(pool_kv_weight(b, old, new), b.reshape(new, r, 3).mean(1).flatten())


def test_mha_to_mqa_of_identical_heads_changes_nothing():
    """If every KV head of a group is the same, pooling them loses nothing: logits are unchanged."""
    model = small_llama(4)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.weight.copy_(proj.weight[:16].repeat(4, 1))
    x = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(convert_kv_heads(model, 1)(input_ids=x).logits, model(input_ids=x).logits)


def test_mqa_model_runs_in_the_engine_like_hf_generate(target):
    from course_lib.engine.engine import Engine
    from course_lib.engine.sampling import SamplingParams

    model, tok = target
    mqa = convert_kv_heads(model, 1)
    engine = Engine(mqa, tok)
    assert engine.backend.num_kv_heads == 1
    prompt = "def fibonacci(n):"
    ours = engine.generate([prompt], SamplingParams(max_new_tokens=6, ignore_eos=True))[0].output_ids
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        ref = mqa.generate(**ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    assert ours == ref[0, ids["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("bad", [0, -1, 3, 4, True, 1.0, "1", None])
def test_bad_new_kv_heads_is_a_value_error_naming_it(target, bad):
    model, _ = target
    with pytest.raises(ValueError, match="new_kv_heads"):
        convert_kv_heads(model, bad)


def test_bad_model_is_a_value_error():
    with pytest.raises(ValueError, match="hf_model"):
        convert_kv_heads(torch.nn.Linear(2, 2), 1)


def test_cache_bytes_halve_and_quarter_as_predicted(tokenizer):
    bw = 10e9
    rows = kv_heads_rows(
        (4, 2, 1),
        batch=2,
        contexts=(8, 16),
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=96,
        bandwidth=bw,
        peak_flops=1e11,
        threads=1,
        repeats=2,
        warmup=0,
        tokenizer=tokenizer,
    )
    assert [r.attention for r in rows] == ["MHA", "MHA", "GQA-2", "GQA-2", "MQA", "MQA"]
    by = {(r.num_kv_heads, r.context): r for r in rows}
    for r in rows:
        assert r.kv_bytes_per_token == 2 * 2 * r.num_kv_heads * 16 * 4
        assert r.kv_bytes_used == r.kv_bytes_formula == r.kv_bytes_per_token * 2 * r.context  # backend = formula
        assert r.predicted_ms == pytest.approx((r.weight_bytes + r.kv_bytes_formula) / bw * 1e3)
        assert r.measured_ms > 0 and r.best_ms <= r.measured_ms and r.threads == 1
        assert r.compute_ms == pytest.approx(r.flops_per_step / 1e11 * 1e3)
    for ctx in (8, 16):
        assert by[(4, ctx)].kv_bytes_used == 2 * by[(2, ctx)].kv_bytes_used == 4 * by[(1, ctx)].kv_bytes_used
    assert "MQA" in format_kv_rows(rows)
    plot_kv_heads(rows)
    plot_kv_heads([r for r in rows if r.context == 8])  # one context: bars


def test_kv_heads_rows_rejects_bad_inputs(tokenizer):
    with pytest.raises(ValueError, match="kv_heads"):
        kv_heads_rows((8, 3), tokenizer=tokenizer)
    with pytest.raises(ValueError, match="kv_heads"):
        kv_heads_rows((), tokenizer=tokenizer)
    with pytest.raises(ValueError, match="contexts"):
        kv_heads_rows((1,), contexts=(0,), tokenizer=tokenizer)
    with pytest.raises(ValueError, match="bandwidth"):
        kv_heads_rows((1,), bandwidth=-1, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="peak_flops"):
        kv_heads_rows((1,), bandwidth=1e10, peak_flops=0, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="threads"):
        kv_heads_rows((1,), bandwidth=1e10, peak_flops=1e11, threads=0, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="rows"):
        plot_kv_heads([])
    assert attention_kind(8, 8) == "MHA" and attention_kind(8, 2) == "GQA-4" and attention_kind(8, 1) == "MQA"


def test_uptrain_two_steps_returns_a_log(target):
    model, tok = target
    mqa = convert_kv_heads(model, 1)
    before = mqa.model.layers[0].self_attn.k_proj.weight.clone()
    log = uptrain(mqa, tok, 2, batch=2, seq_len=32, eval_tokens=64, lr=1e-4)
    assert len(log["train_loss"]) == 2 and len(log["lr_per_step"]) == 2
    assert all(isinstance(x, float) and x > 0 for x in log["train_loss"])
    assert [r["step"] for r in log["log"]] == [0, 2]
    for r in log["log"]:
        assert set(r["val"]) >= {"loss", "perplexity", "top1", "tokens"} and r["val"]["tokens"] == 64
    assert log["steps"] == 2 and log["tokens_seen"] == 2 * 2 * 32 and log["finished"]
    assert not torch.equal(before, mqa.model.layers[0].self_attn.k_proj.weight)  # it trained, in place
    assert not mqa.training
    plot_uptrain(log, original_ppl=30.0)


def test_uptrain_rejects_bad_inputs(target):
    model, tok = target
    for kwargs, name in (({"steps": 0}, "steps"), ({"steps": 1, "lr": 0}, "lr"), ({"steps": 1, "batch": 0}, "batch")):
        with pytest.raises(ValueError, match=name):
            uptrain(model, tok, **kwargs)
    with pytest.raises(ValueError, match="seq_len"):
        uptrain(model, tok, 1, seq_len=4096)


def test_shipped_uptrained_model(target):
    path = uptrained_dir()
    assert path.name == UPTRAINED_NAME
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{path} not shipped")
    model, tok, log = load_uptrained()
    cfg = model.config
    assert cfg.num_key_value_heads == 1 and cfg.num_attention_heads == 8 and cfg.num_hidden_layers == 6
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (32, 256)
    assert len(tok) == cfg.vocab_size == 4096
    ev = log["final_eval"]
    assert ev["uptrained"]["perplexity"] < ev["converted"]["perplexity"]
    assert ev["original"]["tokens"] == ev["uptrained"]["tokens"] > 100_000
    assert len(log["train_loss"]) == log["steps"] and log["command"].startswith("python -m course_lib.kv.cli uptrain")
    json.dumps(log)
    # it was trained after the conversion: not the plain mean-pooled tiny-target
    pooled = convert_kv_heads(target[0], 1).model.layers[0].self_attn.k_proj.weight
    assert not torch.equal(pooled, model.model.layers[0].self_attn.k_proj.weight)
