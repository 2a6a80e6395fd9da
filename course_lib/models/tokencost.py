"""What a request costs depends on the tokenizer: APIs charge per token, not per character.

The same text is a different number of tokens under different tokenizers (Huyen, *AI Engineering*,
ch. 9), so the price of a request — and the length of its prefill and its KV cache — depends on the
vocabulary. Here we build a few tokenizers in about a second: raw UTF-8 bytes, byte-level BPE at
several vocabulary sizes (one training run on a slice of the course corpus, cut down to each size:
a smaller BPE is a prefix of a larger one's merges), and the course's shipped tokenizer. Then we
measure tokens per 1,000 characters, bytes per token and the cost of a request on held-out code,
English prose, Korean and digits. Bigger vocabularies pay off on the text they were trained on;
on a language they never saw, every tokenizer falls back to about one token per byte.
Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

import ast
import math
import random
import re
from dataclasses import dataclass
from functools import lru_cache

from course_lib.core.paths import data_dir
from course_lib.models.corpus import EOS, corpus_text

#: Characters of the train split the BPEs learn from (about 0.4 s on 2 cores for 8,192 tokens).
TRAIN_CHARS = 1_000_000
#: Largest vocabulary that slice supports (it runs out of pairs seen twice at about 8,700 tokens).
MAX_VOCAB = 8192
#: Characters of held-out code measured (from the validation split, which no tokenizer here saw).
CODE_CHARS = 100_000
#: A typical API price for input tokens, USD per million; the lesson is in the ratios, not the figure.
PRICE_PER_MTOK = 3.0
#: A request of this many characters (a few pages of prompt).
REQUEST_CHARS = 10_000

#: A SAMPLE of Korean text written for this lesson (about what this lesson says), not a corpus.
KOREAN_SAMPLE = (
    "언어 모델 API는 글자 수가 아니라 토큰 수로 요금을 매긴다. "
    "같은 문장이라도 토크나이저가 다르면 토큰 수가 달라지고, 그만큼 비용도 달라진다. "
    "영어와 코드로 학습한 토크나이저는 한글 한 글자를 여러 개의 바이트 토큰으로 쪼개기 때문에, "
    "같은 내용을 한국어로 보내면 더 많은 돈을 내게 된다. "
    "프롬프트가 길어지면 프리필 시간과 KV 캐시도 토큰 수에 비례해서 늘어난다. "
    "그러니 추론 비용을 예측하려면 먼저 내 데이터가 몇 개의 토큰이 되는지 재어 보아야 한다."
)


@dataclass(frozen=True)
class Row:
    """One tokenizer on one text. ``request_usd`` prices a request of ``request_chars`` such characters."""

    tokenizer: str
    vocab_size: int
    text: str
    chars: int
    bytes: int
    tokens: int
    price_per_mtok: float = PRICE_PER_MTOK
    request_chars: int = REQUEST_CHARS

    @property
    def tokens_per_1k_chars(self) -> float:
        return 1000 * self.tokens / self.chars

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens

    @property
    def request_tokens(self) -> float:
        return self.request_chars * self.tokens / self.chars

    @property
    def request_usd(self) -> float:
        return request_cost(self.request_tokens, self.price_per_mtok)


def request_cost(n_tokens: float, price_per_mtok: float = PRICE_PER_MTOK) -> float:
    """USD for ``n_tokens`` at ``price_per_mtok`` USD per million tokens."""
    _check_number("n_tokens", n_tokens, allow_zero=True)
    _check_number("price_per_mtok", price_per_mtok, allow_zero=True)
    return n_tokens * price_per_mtok / 1e6


def _check_number(name: str, value, *, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be a {kind} finite number, got {value!r}")
    return float(value)


# ----------------------------------------------------------------------------- tokenizers
def _byte_level(merges: list[tuple[str, str]]):
    """A byte-level BPE from its merge list: 256 byte tokens, then one token per merge, in order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


@lru_cache(maxsize=1)
def _trained_merges() -> tuple[tuple[str, str], ...]:
    """Merges of one byte-level BPE of MAX_VOCAB tokens trained on the first TRAIN_CHARS of the train split."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MAX_VOCAB,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text("train")[:TRAIN_CHARS].split(f"\n{EOS}\n"), trainer=trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return tuple(tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges)


def _check_vocab_sizes(vocab_sizes) -> tuple[int, ...]:
    sizes = tuple(vocab_sizes) if isinstance(vocab_sizes, (list, tuple)) else None
    if not sizes or any(isinstance(v, bool) or not isinstance(v, int) or not 257 <= v <= MAX_VOCAB for v in sizes):
        raise ValueError(
            f"vocab_sizes must be a non-empty list of ints in [257, {MAX_VOCAB}] "
            f"(256 byte tokens + at least one merge), got {vocab_sizes!r}"
        )
    return tuple(sorted(set(sizes)))


@lru_cache(maxsize=8)
def _build(vocab_sizes: tuple[int, ...], course: bool) -> dict:
    from tokenizers import Tokenizer

    merges = list(_trained_merges())
    toks = {"bytes-256": _byte_level([])}
    for v in vocab_sizes:
        toks[f"bpe-{v}"] = _byte_level(merges[: v - 256])
    if course:
        shipped = Tokenizer.from_file(str(data_dir() / "models" / "tokenizer" / "tokenizer.json"))
        toks[f"course-{shipped.get_vocab_size()}"] = shipped
    return toks


def build_tokenizers(vocab_sizes=(512, 2048, 8192), *, course: bool = True) -> dict:
    """``{name: tokenizers.Tokenizer}``: raw bytes, byte-level BPE at each size, and (``course``) the
    shipped course tokenizer (4,096 tokens, trained on the whole train split). Cached in-process."""
    return dict(_build(_check_vocab_sizes(vocab_sizes), bool(course)))


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def decode(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


# ----------------------------------------------------------------------------- held-out text
def _english_from_docstrings(sources: list[str], limit: int) -> str:
    """Prose paragraphs of the docstrings in ``sources``: no doctests, almost only letters and punctuation."""
    paragraphs: list[str] = []
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for para in re.split(r"\n\s*\n", ast.get_docstring(node) or ""):
                para = " ".join(para.split())
                prose = sum(c.isalpha() or c in " ,.;:'-()" for c in para) / max(len(para), 1)
                if len(para) >= 80 and ">>>" not in para and prose > 0.95:
                    paragraphs.append(para)
        if sum(map(len, paragraphs)) >= limit:
            break
    return "\n\n".join(paragraphs)[:limit]


def _digits(n_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    while sum(map(len, out)) < n_chars:
        out.append(str(rng.randrange(10 ** rng.randint(1, 9))))
    return ", ".join(out)[:n_chars]


@lru_cache(maxsize=1)
def _held_out() -> tuple[tuple[str, str], ...]:
    files = corpus_text("val").split(f"\n{EOS}\n")
    code = "\n\n".join(files)[:CODE_CHARS]
    code = code[: code.rfind("\n") + 1]
    return (
        ("code", code),
        ("english", _english_from_docstrings(files, 30_000)),
        ("korean", KOREAN_SAMPLE),
        ("digits", _digits(5_000)),
    )


def held_out_texts() -> dict[str, str]:
    """Texts no tokenizer here was trained on: Python code and English docstring prose from the
    validation split of the corpus, the Korean SAMPLE above, and comma-separated random numbers."""
    return dict(_held_out())


# ----------------------------------------------------------------------------- the comparison
def _check_texts(texts) -> dict[str, str]:
    if not isinstance(texts, dict) or not texts:
        raise ValueError(f"texts must be a non-empty dict of name -> text, got {type(texts).__name__}")
    for name, text in texts.items():
        if not isinstance(name, str) or not isinstance(text, str) or not text:
            raise ValueError(f"texts must map str names to non-empty str; texts[{name!r}] is {text!r:.40}")
    return texts


def compare_tokenizers(
    texts: dict[str, str] | None = None,
    vocab_sizes=(512, 2048, 8192),
    *,
    price_per_mtok: float = PRICE_PER_MTOK,
    request_chars: int = REQUEST_CHARS,
    course: bool = True,
) -> list[Row]:
    """Encode each text (default: ``held_out_texts()``) with each tokenizer of ``build_tokenizers``;
    one Row per (text, tokenizer), grouped by text."""
    texts = held_out_texts() if texts is None else _check_texts(texts)
    _check_number("price_per_mtok", price_per_mtok, allow_zero=True)
    if isinstance(request_chars, bool) or not isinstance(request_chars, int) or request_chars <= 0:
        raise ValueError(f"request_chars must be a positive int, got {request_chars!r}")
    toks = build_tokenizers(vocab_sizes, course=course)
    rows = []
    for text_name, text in texts.items():
        n_bytes = len(text.encode("utf-8"))
        for tok_name, tok in toks.items():
            rows.append(
                Row(
                    tok_name,
                    tok.get_vocab_size(),
                    text_name,
                    len(text),
                    n_bytes,
                    len(encode(tok, text)),
                    price_per_mtok,
                    request_chars,
                )
            )
    return rows


def format_table(rows: list[Row]) -> str:
    """A plain-text table: one line per (text, tokenizer), a blank line between texts."""
    if not rows or not all(isinstance(r, Row) for r in rows):
        raise ValueError("rows must be a non-empty list of Row (from compare_tokenizers)")
    head = f"{'text':<8} {'tokenizer':<12} {'vocab':>6} {'chars':>7} {'tokens':>7} {'tok/1k chars':>12} {'bytes/tok':>9} {'USD/req':>8}"
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows):
        if i and r.text != rows[i - 1].text:
            lines.append("")
        lines.append(
            f"{r.text:<8} {r.tokenizer:<12} {r.vocab_size:>6} {r.chars:>7} {r.tokens:>7} "
            f"{r.tokens_per_1k_chars:>12.0f} {r.bytes_per_token:>9.2f} {r.request_usd:>8.4f}"
        )
    r0 = rows[0]
    lines.append(
        f"USD/req: one request of {r0.request_chars:,} characters of that text at ${r0.price_per_mtok:g} per million tokens"
    )
    return "\n".join(lines)
