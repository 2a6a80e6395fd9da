"""models.gguf_requant: a GGUF file re-encoded with llama.cpp's gguf package keeps its metadata and its
values (F32: exactly the dequantized source; Q8_0: within int8 block rounding), on a small synthetic file."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from course_lib.models.gguf_requant import requantize  # noqa: E402


def _source(path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 96)).astype(np.float32)  # numpy shape (rows, 96): 96 % 32 == 0
    norm = rng.standard_normal(96).astype(np.float32)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", 1)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.ffn_up.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.attn_norm.weight", norm)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return w


def _tensors(path):
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def test_f32_is_the_dequantized_source_and_q8_0_is_close(tmp_path):
    src = tmp_path / "src.gguf"
    w = _source(src)
    ref = _tensors(src)["blk.0.ffn_up.weight"]
    deq = gguf.quants.dequantize(ref.data, ref.tensor_type)
    f32 = _tensors(requantize(src, tmp_path / "f32.gguf", "F32"))
    assert f32["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert np.array_equal(np.asarray(f32["blk.0.ffn_up.weight"].data), deq)  # bit-exact: what the engine loads
    q8 = _tensors(requantize(src, tmp_path / "q8.gguf", "Q8_0"))
    t = q8["blk.0.ffn_up.weight"]
    assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
    back = gguf.quants.dequantize(t.data, t.tensor_type)
    assert np.abs(back - deq).max() <= np.abs(deq).max() / 127 + 1e-6  # half a step of the block's scale, at most
    assert q8["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32  # norms stay F32
    fields = gguf.GGUFReader(tmp_path / "q8.gguf").fields
    assert fields["llama.block_count"].contents() == 1 and fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "c"]
    assert np.abs(deq - w).max() > 0  # the source really was quantized (Q4_1), so "exact" above means something


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="target must be"):
        requantize(tmp_path / "x.gguf", tmp_path / "y.gguf", "Q4_K")
    with pytest.raises(ValueError, match="is not a file"):
        requantize(tmp_path / "missing.gguf", tmp_path / "y.gguf")
    src = tmp_path / "src.gguf"
    _source(src)
    with pytest.raises(ValueError, match="dst must differ"):
        requantize(src, src)
