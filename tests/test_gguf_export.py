"""models.gguf_export: a course checkpoint written as an F32 GGUF that llama.cpp runs."""

import json

import numpy as np
import pytest

from course_lib.models.gguf_export import export_llama, gguf_tensors, permute
from course_lib.models.load import embedded_dir


def test_permute_moves_each_heads_halves_to_adjacent_pairs():
    head_dim, n_head = 4, 2
    w = np.arange(n_head * head_dim)[:, None].repeat(3, axis=1).astype(np.float32)  # row r holds r
    rows = permute(w, n_head)[:, 0].tolist()
    assert rows == [0, 2, 1, 3, 4, 6, 5, 7]  # (x0, x2) and (x1, x3) rotate together in llama.cpp's order


def test_permute_refuses_an_odd_head_dim():
    with pytest.raises(ValueError, match="even head_dim"):
        permute(np.zeros((6, 2), np.float32), 2)


def test_smollm2_tensors_equal_the_shipped_gguf_dequantized(smollm2_cache):
    """The cached safetensors came from transformers' GGUF loader, which undoes llama.cpp's q/k permutation:
    permuting back must give the shipped file's dequantized values bit for bit."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import load_file

    from course_lib.models.gguf import gguf_file

    folder = smollm2_cache / "models" / "smollm2-135m-instruct"
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"] = 2  # the first two layers are enough to check every kind of tensor
    ours = dict(gguf_tensors(cfg, load_file(str(folder / "model.safetensors"))))
    shipped = {t.name: t for t in GGUFReader(gguf_file("smollm2-135m-instruct")).tensors}
    assert set(ours) <= set(shipped)
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.1.attn_v.weight", "blk.1.ffn_down.weight",
                 "blk.0.attn_norm.weight", "token_embd.weight"):  # fmt: skip
        t = shipped[name]
        ref = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(ours[name].shape)
        assert np.array_equal(ours[name], ref), name


def test_tiny_target_greedy_on_llamacpp_equals_the_engine(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp (the llamacpp extra) is not installed")
    from course_lib.engine import Engine, SamplingParams

    path = export_llama(embedded_dir("tiny-target"), tmp_path / "tiny.gguf")
    llm = llama_cpp.Llama(str(path), n_ctx=128, n_threads=1, verbose=False)
    engine = Engine("tiny-target", linear="reference")
    for prompt in ("def add(a, b):", "import os\nclass Stack:"):
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
        assert ids == engine.tokenizer.encode(prompt, add_special_tokens=False)
        llm.reset()
        llm.eval(ids)
        out = []
        for _ in range(12):
            tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
            out.append(tok)
            llm.eval([tok])
        assert out == engine.generate([prompt], SamplingParams(max_new_tokens=12, ignore_eos=True))[0].output_ids


def test_a_folder_without_a_checkpoint_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="lacks"):
        export_llama(tmp_path, tmp_path / "x.gguf")


def test_a_non_llama_checkpoint_is_refused(tmp_path):
    for f in ("model.safetensors", "tokenizer.json"):
        (tmp_path / f).write_text("{}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        export_llama(tmp_path, tmp_path / "x.gguf")
