"""llama.cpp's Q4_1 imported as the course's int4 (compression.gguf_int4): bit-exact, no second rounding.

The reference is the ``gguf`` package's own dequantization, which is what ``transformers`` loads.
"""

import numpy as np
import pytest
import torch

from course_lib.compression.gguf_int4 import (
    HF_NAMES,
    Q4_1_CONFIG,
    Q8_0_CONFIG,
    concat_rows,
    engine_qweights,
    fuse_for_engine,
    gguf_qweights,
    q4_1_to_int4,
    q8_0_to_int8,
    quantize_engine_gguf,
    reverse_permute_rows,
)
from course_lib.compression.quantize import dequantize, quantize

NAME = "smollm2-135m-instruct"


def bits(x):
    """fp32 tensor → its bit patterns, so equality means bit for bit (not -0.0 == 0.0)."""
    return torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32)).view(torch.int32)


# ----------------------------------------------------------------------------- synthetic blocks, no model
@pytest.mark.parametrize("seed", [0, 1])
def test_q4_1_blocks_dequantize_bit_exactly_like_gguf(seed):
    from gguf import GGMLQuantizationType as T
    from gguf import dequantize as gguf_dequantize
    from gguf import quantize as gguf_quantize

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((48, 96)) * rng.uniform(1e-3, 1.0, (48, 1))).astype(np.float32)
    w[0, :32] = 0.25  # a constant block: d = 0
    raw = gguf_quantize(w, T.Q4_1)  # (48, 3 blocks · 20 bytes)
    qw = q4_1_to_int4(raw, 96)
    assert qw.config == Q4_1_CONFIG and qw.shape == (48, 96) and qw.group_size == 32
    assert torch.equal(bits(dequantize(qw)), bits(gguf_dequantize(raw, T.Q4_1)))
    # and the format the kernels read gives the same floats
    from course_lib.kernels.quant_matmul.int4 import dequantize_int4

    assert torch.equal(bits(dequantize_int4(qw.data, qw.scale, qw.zero, 32)), bits(gguf_dequantize(raw, T.Q4_1)))


def test_q8_0_blocks_dequantize_bit_exactly_like_gguf():
    from gguf import GGMLQuantizationType as T
    from gguf import dequantize as gguf_dequantize
    from gguf import quantize as gguf_quantize

    w = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)
    raw = gguf_quantize(w, T.Q8_0)
    qw = q8_0_to_int8(raw, 64)
    assert qw.config == Q8_0_CONFIG
    assert torch.equal(bits(dequantize(qw)), bits(gguf_dequantize(raw, T.Q8_0)))


def test_reverse_permute_rows_is_transformers_own():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    x = np.arange(12 * 5).reshape(12, 5)
    for heads in (1, 3):
        ours = reverse_permute_rows(x, heads)
        theirs = LlamaTensorProcessor()._reverse_permute_weights(x, heads, heads)
        assert np.array_equal(ours, theirs)
        assert sorted(ours[:, 0].tolist()) == x[:, 0].tolist()  # whole rows move, nothing else


def test_bad_input_is_named():
    raw = np.zeros((4, 40), dtype=np.uint8)
    with pytest.raises(ValueError, match="in_features must be a multiple"):
        q4_1_to_int4(raw, 70)
    with pytest.raises(ValueError, match="bytes per row"):
        q4_1_to_int4(raw, 96)
    with pytest.raises(ValueError, match="uint8"):
        q4_1_to_int4(raw.astype(np.int16), 64)
    with pytest.raises(ValueError, match="n_head"):
        reverse_permute_rows(np.zeros((12, 2)), 0)
    with pytest.raises(ValueError, match="heads"):
        reverse_permute_rows(np.zeros((10, 2)), 3)
    with pytest.raises(ValueError, match="one format"):
        concat_rows(quantize(torch.randn(4, 64), Q4_1_CONFIG), quantize(torch.randn(4, 32), Q4_1_CONFIG))
    with pytest.raises(ValueError, match="QuantizedWeight"):
        concat_rows()
    with pytest.raises(ValueError, match="path"):
        gguf_qweights(123)
    with pytest.raises(ValueError, match="include_lm_head"):
        engine_qweights("x.gguf", include_lm_head="yes")
    with pytest.raises(ValueError, match="gguf_qweights"):
        fuse_for_engine({"model.layers.0.mlp.up_proj": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="lacks"):
        fuse_for_engine({"model.layers.0.mlp.up_proj": quantize(torch.randn(4, 64), Q4_1_CONFIG)})
    with pytest.raises(ValueError, match="engine"):
        quantize_engine_gguf(object(), "x.gguf")


def test_an_inexact_zero_point_refuses_rather_than_rounds():
    # m = 1024 and d = 2^-24 (the smallest fp16): m + 8·d spans 2^10 … 2^-21, more bits than fp32 has
    block = np.zeros(20, dtype=np.uint8)
    block[0:2] = np.array([2.0**-24], dtype="<f2").view(np.uint8)
    block[2:4] = np.array([1024.0], dtype="<f2").view(np.uint8)
    with pytest.raises(ValueError, match="not exact"):
        q4_1_to_int4(block[None, :], 32)


def _llama_gguf(path, arch="llama", heads=True, big_endian=False):
    """One Q4_1 projection in a GGUF file, with (or without) the metadata gguf_qweights reads."""
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFEndian, GGUFWriter
    from gguf import quantize as gguf_quantize

    w = GGUFWriter(str(path), arch, endianess=GGUFEndian.BIG if big_endian else GGUFEndian.LITTLE)
    if heads:
        w.add_head_count(2)
        w.add_head_count_kv(1)
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("blk.0.attn_v.weight", gguf_quantize(np.ones((8, 64), np.float32), T.Q4_1), raw_dtype=T.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_small_file_imports_through_the_fast_table_and_its_metadata_is_checked(tmp_path):
    qweights = gguf_qweights(_llama_gguf(tmp_path / "ok.gguf"))
    assert list(qweights) == ["model.layers.0.self_attn.v_proj"]
    assert torch.equal(dequantize(qweights["model.layers.0.self_attn.v_proj"]), torch.ones(8, 64))
    with pytest.raises(ValueError, match="architecture 'gpt2'"):
        gguf_qweights(_llama_gguf(tmp_path / "gpt2.gguf", arch="gpt2"))
    with pytest.raises(ValueError, match="metadata has no 'llama.attention.head_count'"):
        gguf_qweights(_llama_gguf(tmp_path / "noheads.gguf", heads=False))
    with pytest.raises(ValueError, match="byte-swapped"):
        gguf_qweights(_llama_gguf(tmp_path / "be.gguf", big_endian=True))
    data = (tmp_path / "ok.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.gguf.*truncated"):
        gguf_qweights(tmp_path / "cut.gguf")


# ----------------------------------------------------------------------------- the real file
@pytest.fixture(scope="module")
def real():
    """(the installed GGUF file, its weights imported as int4/int8 under the HF module names)."""
    from course_lib.models import gguf

    try:
        path = gguf.gguf_file(NAME)
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    return path, gguf_qweights(path)


def test_the_q4_1_and_q8_0_tensors_import_bit_exactly(real):
    """Against gguf's own dequantization on three layers and the embedding (every layer is compared with the
    model transformers loaded, in the next test)."""
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader
    from gguf import dequantize as gguf_dequantize

    path, qweights = real
    reader = GGUFReader(str(path))
    counts = {"Q4_1": 0, "Q8_0": 0}
    for t in reader.tensors:
        if t.tensor_type not in (T.Q4_1, T.Q8_0) or t.name.split(".")[1] not in ("0", "14", "29", "weight"):
            continue
        ref = gguf_dequantize(t.data, t.tensor_type)  # what transformers dequantizes, then permutes
        leaf = t.name.split(".")[-2]
        if leaf in ("attn_q", "attn_k"):
            ref = reverse_permute_rows(ref, 9 if leaf == "attn_q" else 3)
        layer = t.name.split(".")[1]
        module = "model.embed_tokens" if t.name == "token_embd.weight" else f"model.layers.{layer}.{HF_NAMES[leaf]}"
        assert torch.equal(bits(dequantize(qweights[module])), bits(ref)), t.name
        counts[t.tensor_type.name] += 1
    assert counts == {"Q4_1": 3 * 7, "Q8_0": 1}


@pytest.fixture(scope="module")
def hf(smollm2_cache):
    """(model, tokenizer) from the course's converted checkpoint (what load_model returns)."""
    from course_lib.models.gguf import from_folder

    return from_folder(smollm2_cache / "models" / NAME)


def test_the_imported_weights_are_the_loaded_models_weights(real, hf):
    _, qweights = real
    model, _ = hf
    params = dict(model.named_parameters())
    assert len(qweights) == 30 * 7 + 1  # every projection, and the (tied) embedding
    for module, qw in qweights.items():
        assert torch.equal(bits(dequantize(qw)), bits(params[f"{module}.weight"].detach())), module


def test_an_int4_engine_of_the_real_model_needs_no_second_rounding(real, hf):
    """The file's blocks through the engine's linear seam: on the reference path (dequantize, then F.linear)
    the int4 engine computes exactly the float engine's logits; the packed CPU kernel answers the same."""
    from course_lib.compression.apply import quantize_engine
    from course_lib.engine import Engine, SamplingParams

    path, hf_qweights = real
    model, tok = hf
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    x = torch.tensor([ids])  # (1, T)
    want = Engine(model, tok, linear="reference").model.dense_logits(x)  # (1, T, V)
    engine = Engine(model, tok, linear="reference")
    qweights = fuse_for_engine(hf_qweights)
    report = quantize_engine(engine, Q4_1_CONFIG, qweights=qweights, path="reference", include_lm_head=False)
    assert len(report.layers) == 30 * 4 and set(report.layers) == set(qweights)
    assert torch.equal(engine.model.dense_logits(x), want)
    # the function a chapter calls: reads the file, fuses, puts every projection on the fastest path
    fast = Engine(model, tok, linear="reference")
    report = quantize_engine_gguf(fast, path)
    assert len(report.layers) == 30 * 4 and report.ratio > 5  # 4 bits + fp32 scale and zero per 32 = 6 bits
    assert fast.generate([ids], SamplingParams(max_new_tokens=8))[0].text.strip() == "The capital of France is Paris."
    with pytest.raises(ValueError, match="already quantized"):
        quantize_engine_gguf(fast, path)
