"""Chapter 08, router: the rule routes what it names, the split is stratified and seeded, the hashed features
are stable and unit-length, the logistic loss's gradient equals torch autograd's, gradient descent reaches the
minimum torch's LBFGS finds on the same loss, and a router that sends everything one way fails the claim."""

import numpy as np
import pytest
import torch

from course_lib.measure.claims import claim
from course_lib.system import router as R


def test_rule_routes_code_and_questions():
    assert R.rule_route("def f(x):") == "code"
    assert R.rule_route("import os\nx = 1") == "code"
    assert R.rule_route("    total += 1") == "code"  # indented
    assert R.rule_route("What does def mean?") == "chat"  # a question mark wins
    assert R.rule_route("Write a poem about the sea.") == "chat"
    with pytest.raises(ValueError, match="text"):
        R.rule_route("  ")


def test_mix_and_split():
    reqs = R.load_requests()
    assert len(reqs) >= 60 and {r["label"] for r in reqs} == set(R.ROUTES)
    train, test = R.split(reqs, 0.5, seed=1)
    assert len(train) + len(test) == len(reqs) and not {r["id"] for r in train} & {r["id"] for r in test}
    for label in R.ROUTES:  # stratified
        assert abs(sum(r["label"] == label for r in test) - sum(r["label"] == label for r in reqs) / 2) <= 0.5
    assert R.split(reqs, 0.5, seed=1) == (train, test)
    with pytest.raises(ValueError, match="test_share"):
        R.split(reqs, 1.0)


def test_features_are_stable_and_unit_length():
    x = R.features(["def f(x):", "hello world"], dim=64)
    assert x.shape == (2, 64) and np.allclose(np.linalg.norm(x, axis=1), 1.0)
    assert np.array_equal(x, R.features(["def f(x):", "hello world"], dim=64))  # CRC-32, not hash()
    with pytest.raises(ValueError, match="texts"):
        R.features("one string")
    with pytest.raises(ValueError, match="dim"):
        R.features(["a"], dim=1)


def test_gradient_matches_torch_autograd():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 8)), (rng.random(20) > 0.5).astype(float)
    w, b = rng.normal(size=8), 0.3
    loss, dw, db = R.loss_and_grad(w, b, x, y, l2=0.1)
    wt = torch.tensor(w, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True)
    z = torch.tensor(x) @ wt + bt
    lt = torch.nn.functional.binary_cross_entropy_with_logits(z, torch.tensor(y)) + 0.05 * wt @ wt
    lt.backward()
    assert np.isclose(loss, lt.item()) and np.allclose(dw, wt.grad.numpy()) and np.isclose(db, bt.grad.item())


def test_fit_reaches_the_lbfgs_minimum_and_routes():
    reqs = R.load_requests()
    texts, labels = [r["text"] for r in reqs], [r["label"] for r in reqs]
    m = R.LogisticRouter(dim=256, l2=1e-2, steps=3000).fit(texts, labels)
    assert m.losses[-1] < m.losses[0]
    x = torch.tensor(R.features(texts, 256), dtype=torch.float64)
    y = torch.tensor([lab == "chat" for lab in labels], dtype=torch.float64)
    w = torch.zeros(256, dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, tolerance_grad=1e-10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + 0.5e-2 * w @ w
        loss.backward()
        return loss

    best = opt.step(closure).item()
    best = closure().item()
    assert m.losses[-1] == pytest.approx(best, rel=1e-3)
    assert R.accuracy([m.route(t) for t in texts], labels) >= 0.9  # on its own training set
    with pytest.raises(ValueError, match="both routes"):
        R.LogisticRouter().fit(["a", "b"], ["chat", "chat"])
    with pytest.raises(ValueError, match="fit the router"):
        R.LogisticRouter().route("x")


def test_accuracy_and_an_everything_to_one_route_router_fails_the_claim():
    reqs = R.load_requests()
    labels = [r["label"] for r in reqs]
    assert R.accuracy(labels, labels) == 1.0
    all_chat = R.accuracy(["chat"] * len(labels), labels)
    assert not claim("routes at least 80 % right", all_chat, at_least=0.8)
    with pytest.raises(ValueError, match="as long"):
        R.accuracy(["chat"], labels)


def test_the_chapters_router_verdicts_fail_on_counter_examples():
    reqs = R.load_requests()
    train, test = R.split(reqs, 0.5, seed=0)
    labels = [r["label"] for r in test]
    rule_acc = R.accuracy([R.rule_route(r["text"]) for r in test], labels)
    flipped = R.LogisticRouter().fit(
        [r["text"] for r in train], ["chat" if r["label"] == "code" else "code" for r in train]
    )
    bad_acc = R.accuracy([flipped.route(r["text"]) for r in test], labels)
    assert not claim("the classifier routes at least as accurately as the rule", bad_acc, at_least=rule_acc)
    usd = [{"code": 1.0, "chat": 10.0}] * len(test)
    rows = {r["policy"]: r for r in R.evaluate_policies({"all": ["chat"] * len(test), "oracle": labels}, labels, usd)}
    assert rows["oracle"]["usd"] == sum(1.0 if lab == "code" else 10.0 for lab in labels)
    assert rows["all"]["code_to_chat"] == labels.count("code") and rows["all"]["chat_to_code"] == 0
    assert not claim("pays at most 1.2x the oracle", rows["all"]["usd"] / rows["oracle"]["usd"], at_most=1.2)
    with pytest.raises(ValueError, match="usd"):
        R.evaluate_policies({"all": ["chat"]}, ["chat"], [{"chat": 1.0}])
