"""The embedded models: corpus, tokenizer, shipped checkpoints, loader, quality, smoke training."""

import json

import pytest
import torch

from course_lib.core.paths import data_dir
from course_lib.models import corpus
from course_lib.models.load import EMBEDDED, REQUIRED_FILES, load_model, resolve

MODELS = data_dir() / "models"


def test_corpus_is_deterministic_and_split_by_file():
    a, b = corpus.iter_files(), corpus.iter_files()
    assert [f.relpath for f in a] == [f.relpath for f in b]
    assert [f.relpath for f in a] == sorted(f.relpath for f in a)
    splits = {f.split for f in a}
    assert splits == {"train", "val"}
    assert all(corpus.split_of(f.relpath) == f.split for f in a)
    assert not any("/test/" in f.relpath or f.relpath.startswith("test/") for f in a)
    val = [f for f in a if f.split == "val"]
    assert 0.02 < len(val) / len(a) < 0.10  # about 1 in 20 files


def test_corpus_text_rejects_unknown_split():
    with pytest.raises(ValueError, match="split"):
        corpus.corpus_text("test")


def test_tokenizer_round_trips_code(tokenizer):
    code = "class A:\n    def f(self, x):\n        return self.x + x  # ünïcode ✓\n"
    ids = tokenizer(code)["input_ids"]
    assert tokenizer.decode(ids) == code
    assert len(ids) < len(code) / 2  # BPE merges: well under one token per character
    assert len(tokenizer) == 4096
    assert tokenizer.eos_token == corpus.EOS


def test_train_tokenizer_small_and_bad_vocab():
    from course_lib.models.tokenizer import train_tokenizer

    tok = train_tokenizer(["def f(x):\n    return x\n"] * 50, vocab_size=300)
    assert tok.decode(tok("def f(x):")["input_ids"]) == "def f(x):"
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["x"], vocab_size=10)


@pytest.mark.parametrize("name", EMBEDDED)
def test_shipped_checkpoint_loads_with_transformers(name):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = MODELS / name
    for f in REQUIRED_FILES:
        assert (path / f).is_file(), f"{path / f} missing"
    model = AutoModelForCausalLM.from_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    assert model.config.model_type == "llama"
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA
    assert len(tok) == model.config.vocab_size


def test_family_sizes_and_repo_weight_budget():
    from course_lib.models.accounting import ModelShape, param_count

    target, _ = load_model("tiny-target")
    draft, _ = load_model("tiny-draft")
    n_t = param_count(ModelShape.from_config(target.config))
    n_d = param_count(ModelShape.from_config(draft.config))
    assert 1e6 < n_t < 10e6, "target should have a few million parameters"
    assert 5 < n_t / n_d < 15, "draft should be about 10x smaller"
    # every shipped weight file together: tiny-target and its MQA uptraining (~20 MB each, fp32), two drafts
    # and the Medusa heads (a few MB each), and SmolLM2's 3-layer draft (31 MB in fp16: its layers and an
    # 8,192-token head; the embedding is the target's, shared at load time, not shipped). A clone for
    # Binder or CI must stay quick: raise this knowingly.
    total = sum(f.stat().st_size for f in MODELS.rglob("*.safetensors"))
    assert total < 90e6


def test_validation_perplexity_matches_model_card():
    from course_lib.models.evaluation import evaluate
    from course_lib.models.tokenizer import token_ids

    quality = json.loads((MODELS / "quality.json").read_text())
    target, tok = load_model("tiny-target")
    draft, _ = load_model("tiny-draft")
    val = token_ids(tok, "val")
    n = quality["check_tokens"]
    t = evaluate(target, val, max_tokens=n)
    d = evaluate(draft, val, max_tokens=n)
    recorded = quality["models"]["tiny-target"]["check_perplexity"]
    assert t["perplexity"] <= recorded * 1.10, (t, recorded)
    assert d["perplexity"] <= quality["models"]["tiny-draft"]["check_perplexity"] * 1.10
    assert t["perplexity"] < 0.8 * d["perplexity"], "the target must clearly beat the draft"
    assert t["top1"] > d["top1"]


def test_target_writes_python():
    from course_lib.models.quality import greedy_sample

    model, tok = load_model("tiny-target")
    text = greedy_sample(model, tok, "    def close(self):\n        if self.", max_new_tokens=40)
    assert "self." in text
    assert "\n            " in text  # indents the if-body one level deeper


def test_smoke_training_produces_a_loadable_checkpoint(tmp_path):
    from course_lib.models.train import main

    assert main(["train", "--smoke", "--out", str(tmp_path)]) == 0
    log = json.loads((tmp_path / "train_log.json").read_text())
    assert log["finished"] and log["steps"] == 5
    model, tok = load_model(str(tmp_path))
    assert model.config.hidden_size == 32
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 2, 3]])).logits).all()


def test_smoke_training_is_reproducible(tmp_path):
    from course_lib.models.train import main

    main(["train", "--smoke", "--out", str(tmp_path / "a")])
    main(["train", "--smoke", "--out", str(tmp_path / "b")])
    la = json.loads((tmp_path / "a" / "train_log.json").read_text())["log"][-1]["val"]["loss"]
    lb = json.loads((tmp_path / "b" / "train_log.json").read_text())["log"][-1]["val"]["loss"]
    assert la == lb


def test_loader_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="tiny-target"):
        load_model("tiny-targt")
    with pytest.raises(ValueError, match="fp16"):
        load_model("tiny-target", dtype="float12")
    with pytest.raises(ValueError, match="device"):
        load_model("tiny-target", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_model("tiny-target", device="cuda")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        resolve(str(tmp_path))
    with pytest.raises(ValueError, match="empty|model must"):
        resolve("")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="embedded model"):
        load_model("someone/not-a-model")


def test_loader_dtype_and_device():
    model, _ = load_model("tiny-draft", dtype="fp16")
    assert next(model.parameters()).dtype == torch.float16
    assert not model.training
