"""A model router: which backend answers a request, decided before any model runs (Huyen, *AI Engineering*,
ch. 10: "route" before "generate").

Two routers over the same two routes, ``"code"`` (a code prefix to continue: the cheap code model) and
``"chat"`` (a request in natural language: the chat model). ``rule_route`` is a rule a developer writes in a
minute (code keywords, brackets, an indented line); ``LogisticRouter`` is a small classifier, logistic
regression over hashed word and character-trigram counts, fitted by full-batch gradient descent in numpy
(scikit-learn is not in the course's environment; the gradient is tested against torch's autograd and the fit
against ``torch.optim.LBFGS`` on the same loss). Both are measured on a labelled request mix
(``data/system/router_requests.json``) split into train and test by ``split``. A router costs microseconds; what
it changes is which model's price each request pays, and which requests get a model that cannot serve them.
Introduced in 08_system_1_context_guardrails_gateway.ipynb.
"""

from __future__ import annotations

import json
import re
import zlib

import numpy as np

from course_lib.core.paths import data_dir

ROUTES = ("code", "chat")

_CODE = re.compile(
    r"^\s*(def|class|import|from|for|while|if|elif|else|try|except|with|return|async|@)\b|"  # a statement
    r"[=(\[{:]\s*$|"  # a line ending in an opener: the model is asked to continue it
    r"^ {4}|\t",  # an indented line
    re.MULTILINE,
)


def _text(name: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty str, got {value!r}")
    return value


def rule_route(text: str) -> str:
    """``"code"`` when the text looks like code (a statement keyword at a line start, a line ending in ``=``,
    ``(``, ``[``, ``{`` or ``:``, an indented line) and has no question mark; else ``"chat"``."""
    _text("text", text)
    return "code" if _CODE.search(text) and "?" not in text else "chat"


def load_requests(path=None) -> list[dict]:
    """The labelled mix: dicts with ``id``, ``text`` and ``label`` (one of ``ROUTES``)."""
    path = path or data_dir() / "system" / "router_requests.json"
    reqs = json.loads(open(path, encoding="utf-8").read())["requests"]
    for r in reqs:
        if not isinstance(r.get("text"), str) or r.get("label") not in ROUTES:
            raise ValueError(f"{path}: request {r!r} needs a text and a label in {ROUTES}")
    return reqs


def split(requests: list[dict], test_share: float = 0.5, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """A stratified random split (each label split in the same proportion): (train, test)."""
    if not requests:
        raise ValueError("requests must be a non-empty list (from load_requests)")
    if not isinstance(test_share, (int, float)) or not 0 < test_share < 1:
        raise ValueError(f"test_share must be a number in (0, 1), got {test_share!r}")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in ROUTES:
        group = [r for r in requests if r["label"] == label]
        order = rng.permutation(len(group))
        n_test = round(len(group) * test_share)
        test += [group[i] for i in order[:n_test]]
        train += [group[i] for i in order[n_test:]]
    return train, test


def features(texts, dim: int = 1024) -> np.ndarray:
    """(n, dim) float32: counts of lower-cased words, symbols and character trigrams, hashed with CRC-32 (stable
    across runs, unlike ``hash``) into ``dim`` buckets, each row scaled to unit length."""
    if isinstance(texts, str) or not texts:
        raise ValueError("texts must be a non-empty list of strings")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2:
        raise ValueError(f"dim must be an int >= 2, got {dim!r}")
    x = np.zeros((len(texts), dim), np.float32)
    for i, t in enumerate(texts):
        t = _text(f"texts[{i}]", t)
        grams = ["w:" + w for w in re.findall(r"\w+|[^\w\s]", t.lower())]
        grams += ["c:" + t[j : j + 3] for j in range(len(t) - 2)]  # case and whitespace kept: indentation counts
        for g in grams:
            x[i, zlib.crc32(g.encode()) % dim] += 1.0
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def loss_and_grad(w: np.ndarray, b: float, x: np.ndarray, y: np.ndarray, l2: float):
    """Mean logistic loss + ``l2``/2·|w|² and its gradient (dw, db); ``y`` in {0, 1}."""
    z = x @ w + b  # (n,)
    p = 1.0 / (1.0 + np.exp(-z))
    loss = float(np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * l2 * w @ w)
    err = (p - y) / len(y)  # (n,)
    return loss, x.T @ err + l2 * w, float(err.sum())


class LogisticRouter:
    """P(route = "chat" | text) = σ(w·φ(text) + b), φ = ``features``; fitted by gradient descent."""

    def __init__(self, dim: int = 1024, l2: float = 1e-3, lr: float = 2.0, steps: int = 500) -> None:
        if not isinstance(l2, (int, float)) or l2 < 0:
            raise ValueError(f"l2 must be a number >= 0, got {l2!r}")
        if not isinstance(lr, (int, float)) or lr <= 0:
            raise ValueError(f"lr must be a number > 0, got {lr!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        self.dim, self.l2, self.lr, self.steps = dim, float(l2), float(lr), steps
        self.w: np.ndarray | None = None
        self.b = 0.0
        self.losses: list[float] = []

    def fit(self, texts, labels) -> LogisticRouter:
        if len(texts) != len(labels) or any(lab not in ROUTES for lab in labels):
            raise ValueError(f"labels must be one of {ROUTES} per text, got {len(labels)} for {len(texts)} texts")
        if len(set(labels)) < 2:
            raise ValueError("labels must contain both routes to fit a classifier")
        x = features(list(texts), self.dim).astype(np.float64)
        y = np.array([lab == "chat" for lab in labels], np.float64)
        w, b = np.zeros(self.dim), 0.0
        self.losses = []
        for _ in range(self.steps):
            loss, dw, db = loss_and_grad(w, b, x, y, self.l2)
            w, b = w - self.lr * dw, b - self.lr * db
            self.losses.append(loss)
        self.w, self.b = w, b
        return self

    def chat_probability(self, texts) -> np.ndarray:
        if self.w is None:
            raise ValueError("fit the router first: LogisticRouter().fit(texts, labels)")
        z = features(list(texts), self.dim).astype(np.float64) @ self.w + self.b
        return 1.0 / (1.0 + np.exp(-z))

    def route(self, text: str) -> str:
        return "chat" if self.chat_probability([_text("text", text)])[0] >= 0.5 else "code"


def accuracy(routes, labels) -> float:
    """Share of requests routed to their labelled route."""
    if not labels or len(routes) != len(labels):
        raise ValueError(f"routes and labels must be non-empty and as long, got {len(routes)} and {len(labels)}")
    return sum(r == lab for r, lab in zip(routes, labels)) / len(labels)


def evaluate_policies(policies: dict, labels, usd: list[dict]) -> list[dict]:
    """One row per routing policy (name → one route per request): accuracy, chat requests sent to the code
    model (answers that model cannot give), code requests sent to the chat model (paid for, not needed), and
    dollars for the mix, ``usd[i][route]`` being request i's price on that route."""
    if len(usd) != len(labels) or not all(set(ROUTES) <= set(u) for u in usd):
        raise ValueError(f"usd must hold one {{route: dollars}} dict per request, for every route in {ROUTES}")
    rows = []
    for name, routes in policies.items():
        rows.append({
            "policy": name, "accuracy": accuracy(routes, labels),
            "chat_to_code": sum(r == "code" and lab == "chat" for r, lab in zip(routes, labels)),
            "code_to_chat": sum(r == "chat" and lab == "code" for r, lab in zip(routes, labels)),
            "usd": sum(u[r] for u, r in zip(usd, routes)),
        })  # fmt: skip
    return rows


__all__ = [
    "ROUTES",
    "LogisticRouter",
    "accuracy",
    "evaluate_policies",
    "features",
    "load_requests",
    "loss_and_grad",
    "rule_route",
    "split",
]
