"""Distillation (course_lib.compression.distill): the loss, the training loop, the shipped student."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.compression.distill import compare_to_teacher, distill_loss, distill_terms, main
from course_lib.core.paths import data_dir
from course_lib.models.load import EMBEDDED, load_model

MODELS = data_dir() / "models"
DISTILLED = "tiny-draft-distilled"


def logits(seed: int, shape=(2, 5, 11)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


def test_alpha_zero_is_cross_entropy():
    s, t = logits(0), logits(1)
    y = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(2))
    ce = F.cross_entropy(s.flatten(0, 1), y.flatten())
    assert torch.allclose(distill_loss(s, t, y, temperature=3.0, alpha=0.0), ce)


def test_soft_term_is_t_squared_kl_and_zero_for_the_teacher_itself():
    s, t = logits(0), logits(1)
    y = torch.zeros(2, 5, dtype=torch.long)
    T = 2.5
    p = torch.softmax(t / T, -1)
    q = torch.softmax(s / T, -1)
    manual = T**2 * (p * (p.log() - q.log())).sum(-1).mean()
    soft, ce = distill_terms(s, t, y, temperature=T)
    assert torch.allclose(soft, manual, atol=1e-5)
    assert torch.allclose(distill_loss(s, t, y, T, alpha=0.25), 0.25 * soft + 0.75 * ce)
    # student == teacher: the soft term vanishes, whatever T
    for T in (0.5, 1.0, 4.0):
        soft, ce = distill_terms(t, t.clone(), y, temperature=T)
        assert abs(soft.item()) < 1e-5
        assert torch.allclose(distill_loss(t, t, y, T, alpha=0.5), 0.5 * ce, atol=1e-5)
        assert abs(distill_loss(t, t, y, T, alpha=1.0).item()) < 1e-5


def test_t_squared_keeps_the_gradient_scale():
    """Hinton et al. 2015: d(KL at T)/ds ~ 1/T² for large T; the T² factor cancels it."""
    s, t = logits(0) * 0.1, logits(1) * 0.1
    y = torch.zeros(2, 5, dtype=torch.long)
    norms = []
    for T in (4.0, 8.0, 16.0):
        s_ = s.clone().requires_grad_(True)
        distill_terms(s_, t, y, temperature=T)[0].backward()
        norms.append(s_.grad.norm().item())  # ∇(T²·KL) → (s − t − mean)/V per position: T-independent
    assert max(norms) / min(norms) < 1.1  # without the T² factor it would shrink 16x from T=4 to T=16


def test_gradient_reaches_the_student_only():
    s = logits(0).requires_grad_(True)
    t = logits(1).requires_grad_(True)
    y = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(2))
    distill_loss(s, t, y, temperature=2.0, alpha=0.5).backward()
    assert s.grad is not None and s.grad.abs().sum() > 0 and torch.isfinite(s.grad).all()
    assert t.grad is None  # the teacher is detached


@pytest.mark.parametrize("temperature", [0, -1.0, float("nan"), float("inf"), "2"])
def test_bad_temperature(temperature):
    s = logits(0)
    with pytest.raises(ValueError, match="temperature"):
        distill_loss(s, s, torch.zeros(2, 5, dtype=torch.long), temperature=temperature)


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan"), None])
def test_bad_alpha(alpha):
    s = logits(0)
    with pytest.raises(ValueError, match="alpha"):
        distill_loss(s, s, torch.zeros(2, 5, dtype=torch.long), alpha=alpha)


def test_shape_mismatch_names_the_argument():
    s = logits(0)
    y = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="teacher_logits"):
        distill_loss(s, logits(1, (2, 5, 12)), y)
    with pytest.raises(ValueError, match="targets"):
        distill_loss(s, logits(1), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="student_logits"):
        distill_loss(torch.zeros(11), torch.zeros(11), torch.zeros((), dtype=torch.long))


def test_compare_to_teacher_matches_quality_top1_agreement():
    from course_lib.models.evaluation import top1_agreement
    from course_lib.models.tokenizer import token_ids

    target, tok = load_model("tiny-target")
    draft, _ = load_model("tiny-draft")
    val = token_ids(tok, "val")
    got = compare_to_teacher(draft, target, val, seq_len=128, max_tokens=1024)
    assert got["tokens"] == 1024
    assert got["agreement"] == pytest.approx(top1_agreement(target, draft, val, seq_len=128, max_tokens=1024))
    assert got["kl"] > 0 and 0 < got["accept"] < 1
    same = compare_to_teacher(target, target, val, seq_len=128, max_tokens=512)
    assert same["agreement"] == 1.0 and abs(same["kl"]) < 1e-4 and same["accept"] == pytest.approx(1.0, abs=1e-4)


def test_smoke_distillation_produces_a_loadable_checkpoint_and_log(tmp_path):
    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    log = json.loads((tmp_path / "train_log.json").read_text())
    assert log["finished"] and log["steps"] == 5 and log["method"] == "distillation"
    assert log["temperature"] == 2.0 and log["alpha"] == 0.5 and log["teacher"] == "tiny-target"
    last = log["log"][-1]
    assert last["step"] == 5 and math.isfinite(last["val"]["loss"])
    assert last["teacher"]["kl"] > 0 and 0 <= last["teacher"]["agreement"] <= 1
    model, _ = load_model(str(tmp_path))
    assert model.config.hidden_size == 32
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 2, 3]])).logits).all()


def test_alpha_zero_reproduces_the_scratch_training(tmp_path):
    """Same initial weights, batches and schedule as course_lib.models.train: only the loss differs."""
    from course_lib.models.train import main as train_main

    main(["--smoke", "--alpha", "0", "--out", str(tmp_path / "d")])
    train_main(["train", "--smoke", "--out", str(tmp_path / "s")])
    ld = json.loads((tmp_path / "d" / "train_log.json").read_text())["log"][-1]["val"]["loss"]
    ls = json.loads((tmp_path / "s" / "train_log.json").read_text())["log"][-1]["val"]["loss"]
    assert ld == pytest.approx(ls, rel=1e-5)


def test_train_student_rejects_bad_arguments(tmp_path):
    from course_lib.compression.distill import train_student

    with pytest.raises(ValueError, match="student"):
        train_student(tmp_path, student="tiny-drift")
    with pytest.raises(ValueError, match="steps"):
        train_student(tmp_path, student="smoke", steps=0)
    with pytest.raises(ValueError, match="temperature"):
        train_student(tmp_path, student="smoke", temperature=0)
    with pytest.raises(ValueError, match="alpha"):
        train_student(tmp_path, student="smoke", alpha=2)


@pytest.mark.skipif(DISTILLED not in EMBEDDED, reason="the distilled draft is not shipped")
def test_shipped_distilled_draft_loads_and_beats_the_scratch_draft():
    model, tok = load_model(DISTILLED)
    draft, _ = load_model("tiny-draft")
    assert model.config.to_dict()["hidden_size"] == draft.config.hidden_size  # same size as the scratch draft
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in draft.parameters())
    log = json.loads((MODELS / DISTILLED / "train_log.json").read_text())
    quality = json.loads((MODELS / "quality.json").read_text())
    assert log["finished"] and log["method"] == "distillation"
    final = log["log"][-1]["teacher"]
    assert final["tokens"] > 100_000  # the whole validation split
    scratch = quality["draft_target_top1_agreement"]
    assert scratch == pytest.approx(0.517, abs=0.01)
    assert final["agreement"] > scratch
    assert quality["top1_agreement_with_target"][DISTILLED] > scratch
    card = (MODELS / DISTILLED / "README.md").read_text()
    assert log["command"] in card
