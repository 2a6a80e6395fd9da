"""Tokenizer cost comparison: exact byte counts, monotone vocabularies, round trips, cost arithmetic."""

import pytest

from course_lib.models import tokencost as tc

TRICKY = [
    "def f(x):\n    return x  # comment\n",
    "  leading spaces, trailing spaces  ",
    "tabs\tand\r\nwindows line ends\n\n\n",
    "한국어 문장과 English, mixed.",
    "emoji 🙂 and accents: café, naïve",
    "0123456789, 3.14159, -42",
]


@pytest.fixture(scope="module")
def toks():
    return tc.build_tokenizers()


@pytest.fixture(scope="module")
def rows():
    return tc.compare_tokenizers()


def test_names_and_texts(toks):
    assert list(toks) == ["bytes-256", "bpe-512", "bpe-2048", "bpe-8192", "course-4096"]
    assert [t.get_vocab_size() for t in toks.values()] == [256, 512, 2048, 8192, 4096]
    assert set(tc.held_out_texts()) == {"code", "english", "korean", "digits"}
    assert all(len(t) > 200 for t in tc.held_out_texts().values())


@pytest.mark.parametrize("text", TRICKY + [tc.KOREAN_SAMPLE])
def test_byte_tokenizer_counts_utf8_bytes(toks, text):
    assert len(tc.encode(toks["bytes-256"], text)) == len(text.encode("utf-8"))


def test_bigger_vocab_fewer_tokens_on_code(rows):
    code = {r.tokenizer: r.tokens for r in rows if r.text == "code"}
    counts = [code[n] for n in ("bytes-256", "bpe-512", "bpe-2048", "bpe-8192")]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == 4
    assert counts[-1] < 0.4 * counts[0]  # > 2.5 bytes per token on in-domain code


def test_korean_is_about_one_token_per_byte(rows):
    # No tokenizer here saw Korean: every one pays about 3 tokens per Hangul syllable.
    korean = [r for r in rows if r.text == "korean"]
    assert all(r.bytes_per_token < 1.1 for r in korean)
    assert all(r.tokens_per_1k_chars > 2000 for r in korean)


def test_round_trip(toks):
    texts = list(tc.held_out_texts().values()) + TRICKY
    for name, tok in toks.items():
        for text in texts:
            assert tc.decode(tok, tc.encode(tok, text)) == text, (name, text[:40])


def test_truncated_bpe_equals_training_at_that_size():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from course_lib.models.corpus import EOS, corpus_text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=512, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus_text("train")[: tc.TRAIN_CHARS].split(f"\n{EOS}\n"), trainer=trainer)
    text = tc.held_out_texts()["code"][:20_000]
    assert len(tok.encode(text).ids) == len(tc.encode(tc.build_tokenizers([512])["bpe-512"], text))


def test_cost_arithmetic():
    assert tc.request_cost(1_000_000, 3.0) == pytest.approx(3.0)
    assert tc.request_cost(2_500, 2.0) == pytest.approx(0.005)
    assert tc.request_cost(0, 3.0) == 0.0
    row = tc.Row("t", 256, "x", chars=1000, bytes=1500, tokens=500, price_per_mtok=2.0, request_chars=10_000)
    assert row.tokens_per_1k_chars == 500
    assert row.bytes_per_token == 3.0
    assert row.request_tokens == 5000
    assert row.request_usd == pytest.approx(0.01)


def test_custom_texts_and_table():
    rows = tc.compare_tokenizers({"mine": "hello world"}, vocab_sizes=[1024], course=False, price_per_mtok=10.0)
    assert [r.tokenizer for r in rows] == ["bytes-256", "bpe-1024"]
    assert rows[0].tokens == 11 and rows[0].request_usd == pytest.approx(0.1)
    table = tc.format_table(rows)
    assert "bpe-1024" in table and "mine" in table and "$10 per million" in table


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"texts": {"code": ""}}, "texts"),
        ({"texts": {}}, "texts"),
        ({"texts": ["abc"]}, "texts"),
        ({"texts": {"x": 3}}, "texts"),
        ({"vocab_sizes": [256]}, "vocab_sizes"),
        ({"vocab_sizes": [100_000]}, "vocab_sizes"),
        ({"vocab_sizes": ["512"]}, "vocab_sizes"),
        ({"vocab_sizes": []}, "vocab_sizes"),
        ({"vocab_sizes": 512}, "vocab_sizes"),
        ({"price_per_mtok": -1.0}, "price_per_mtok"),
        ({"request_chars": 0}, "request_chars"),
    ],
)
def test_bad_input_names_the_argument(kwargs, name):
    kwargs = {"texts": {"ok": "text"}, **kwargs}
    with pytest.raises(ValueError, match=name):
        tc.compare_tokenizers(**kwargs)


def test_bad_input_elsewhere():
    with pytest.raises(ValueError, match="rows"):
        tc.format_table([])
    with pytest.raises(ValueError, match="n_tokens"):
        tc.request_cost(-1)
    with pytest.raises(ValueError, match="price_per_mtok"):
        tc.request_cost(10, float("nan"))
