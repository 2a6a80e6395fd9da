"""Model accounting vs the real models and hand-computed values."""

import pytest

from course_lib.core.paths import data_dir
from course_lib.models.accounting import (
    ModelShape,
    decode_flops,
    decode_intensity,
    decode_step_bytes,
    kv_bytes_per_token,
    param_count,
    prefill_flops,
    prefill_step_bytes,
    weight_bytes,
    weights_read_per_step,
)
from tests.conftest import random_llama


def test_llama2_presets_match_published_sizes():
    s7 = ModelShape.from_name("llama-2-7b")
    assert param_count(s7) == 6_738_415_616  # the HF checkpoint's numel
    assert kv_bytes_per_token(s7, "fp16") == 512 * 1024  # references: llama2_kv_bytes_per_token, 512 KiB/token
    assert kv_bytes_per_token(s7, "fp16") * 4096 == 2 * 1024**3  # 2 GiB at 4k
    s70 = ModelShape.from_name("llama-2-70b")
    assert kv_bytes_per_token(s70, "fp16") == 320 * 1024
    assert abs(param_count(s70) / 1e9 - 68.98) < 0.01
    assert abs(param_count(ModelShape.from_name("llama-3-8b")) / 1e9 - 8.03) < 0.01


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_param_count_matches_numel(kind):
    model = random_llama(kind=kind)
    shape = ModelShape.from_config(model.config)
    extra = sum(p.numel() for n, p in model.named_parameters() if n.endswith("bias"))  # Qwen2 q/k/v bias
    assert param_count(shape) + extra == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["tiny-target", "tiny-draft"])
def test_shipped_models_numel_and_file_size(name):
    from course_lib.models.load import load_model

    model, _ = load_model(name)
    shape = ModelShape.from_config(model.config)
    assert param_count(shape) == sum(p.numel() for p in model.parameters())
    size = (data_dir() / "models" / name / "model.safetensors").stat().st_size
    assert 0 <= size - weight_bytes(shape, "fp32") < 64 * 1024  # only the JSON header on top


def test_flops_by_hand():
    s = ModelShape(
        "toy", vocab_size=10, hidden_size=4, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=2
    )
    # layer: q 4*4 + k 4*2 + v 4*2 + o 4*4 = 48, mlp 3*4*8 = 96, norms 8 -> 152; + final norm 4 + emb 40 + head 40
    assert param_count(s) == 152 + 4 + 40 + 40
    matmul = 48 + 96 + 40  # lm_head takes part, embeddings/norms do not
    # decode at context 3: 2*matmul + attention 4 * layers * heads * hd * 1 * 3
    assert decode_flops(s, 3) == 2 * matmul + 4 * 1 * 2 * 2 * 3
    # prefill of 3 tokens: 3 * 2 * matmul + 4*L*H*hd * 3 queries * (1+2+3)/3 keys on average
    assert prefill_flops(s, 3) == 3 * 2 * matmul + 4 * 1 * 2 * 2 * 6
    # a step streams everything but the embedding table, of which it reads one row per token (2 rows here)
    assert decode_step_bytes(s, 3, batch=2, dtype="fp16") == (236 - 40 + 2 * 4) * 2 + 2 * 1 * 1 * 2 * 2 * 3 * 2
    # a 5-token prefill of batch 3: 15 rows but only 10 exist; it writes 15 tokens of KV
    assert prefill_step_bytes(s, 5, batch=3, dtype="fp16") == 236 * 2 + 2 * 1 * 1 * 2 * 2 * 15


def test_a_step_reads_batch_rows_of_the_embedding_table():
    s = ModelShape.from_name("llama-2-7b")  # untied: embed_tokens and lm_head are separate tables
    assert not s.tie_embeddings
    assert weight_bytes(s, "bf16") - weights_read_per_step(s, 1, "bf16") == (32000 - 1) * 4096 * 2
    assert weight_bytes(s, "bf16") - weights_read_per_step(s, 256, "bf16") == (32000 - 256) * 4096 * 2
    assert weights_read_per_step(s, 10**6, "bf16") == weight_bytes(s, "bf16")  # rows bounded by the vocabulary
    kv = kv_bytes_per_token(s, "bf16") * 512
    assert decode_step_bytes(s, 512, 1, "bf16") == weights_read_per_step(s, 1, "bf16") + kv
    assert decode_step_bytes(s, 512, 256, "bf16") == weights_read_per_step(s, 256, "bf16") + 256 * kv
    assert decode_step_bytes(s, 512, 1, "bf16", kv_dtype="fp8") == weights_read_per_step(s, 1, "bf16") + kv / 2
    assert prefill_step_bytes(s, 512, 2, "bf16") == weights_read_per_step(s, 1024, "bf16") + 2 * kv


def test_tied_embeddings_are_read_once_as_the_lm_head():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    tied = ModelShape.from_config(config, name="tied")
    assert tied.tie_embeddings
    assert param_count(tied) == sum(p.numel() for p in LlamaForCausalLM(config).parameters())  # table once
    for tokens in (1, 7, 101, 5000):  # the LM head reads the whole table; lookups add nothing
        assert weights_read_per_step(tied, tokens, "fp16") == weight_bytes(tied, "fp16")
    untied = ModelShape.from_config(LlamaConfig(**{**config.to_dict(), "tie_word_embeddings": False}))
    assert weight_bytes(untied, "fp16") - weight_bytes(tied, "fp16") == 101 * 32 * 2
    assert weights_read_per_step(untied, 1, "fp16") == weight_bytes(tied, "fp16") + 32 * 2  # + one row


def test_decode_intensity_grows_with_batch():
    s = ModelShape.from_name("llama-2-7b")
    i1, i64 = decode_intensity(s, 128, 1, "fp16"), decode_intensity(s, 128, 64, "fp16")
    assert 0.9 < i1 < 1.1  # ~2 FLOPs per 2-byte weight
    assert i64 > 30 * i1


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown model preset"):
        ModelShape.from_name("gpt-5")
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelShape("x", 10, 8, 8, 1, 3, 2, 4)
    with pytest.raises(ValueError, match="hidden_size"):
        ModelShape("x", 10, 0, 8, 1, 2, 1, 4)
    s = ModelShape.from_name("llama-2-7b")
    with pytest.raises(ValueError, match="context_len"):
        decode_flops(s, 0)
    with pytest.raises(ValueError, match="n_tokens"):
        prefill_flops(s, -3)
    with pytest.raises(ValueError, match="dtype"):
        weight_bytes(s, "fp13")
    with pytest.raises(ValueError, match="tokens"):
        weights_read_per_step(s, 0)
    with pytest.raises(ValueError, match="n_tokens"):
        prefill_step_bytes(s, 0)
