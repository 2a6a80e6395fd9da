"""Incremental detokenization (``TextStream``) against the full decode (``FullDecodeTextStream``) on random
ids: the course's byte-level BPE tokenizer and a one-byte-per-token tokenizer, multi-byte characters split
at every byte, invalid bytes, stop strings; and its cost per token stays flat as the answer grows."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib.engine.text_stream import FullDecodeTextStream, TextStream, cost_per_token_us


class ByteTokenizer:
    """Token i is byte i: every multi-byte character is split across tokens; 256 = a special token."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def course_tokenizer(tokenizer):
    return tokenizer


def run(stream, ids, reason="length"):
    return [stream.push(t, reason if i == len(ids) - 1 else None) for i, t in enumerate(ids)]


def check(tok, ids, stop=(), reason="length"):
    inc, ref = TextStream(tok, stop), FullDecodeTextStream(tok, stop)
    got, want = run(inc, ids, reason), run(ref, ids, reason)
    assert got == want, (ids, got, want)  # the same delta at every token, not only the same total
    assert "".join(got) == inc.text == ref.text
    return inc


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(TEXT, st.lists(st.integers(0, 256), max_size=6))
def test_bytes_split_at_every_byte(text, junk):
    tok = ByteTokenizer()
    ids = list(text.encode()) + junk  # junk: stray continuation bytes, incomplete sequences, a special token
    inc = check(tok, ids)
    assert inc.text == tok.decode(ids)
    assert all(a <= b for a, b in zip(inc.offsets, inc.offsets[1:]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 4095), min_size=1, max_size=60))
def test_course_tokenizer_random_ids(course_tokenizer, ids):
    inc = check(course_tokenizer, ids)
    assert inc.text == course_tokenizer.decode(ids, skip_special_tokens=True)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TEXT)
def test_course_tokenizer_multibyte_text(course_tokenizer, text):
    ids = course_tokenizer(text)["input_ids"]  # byte-level BPE: a CJK or emoji character spans tokens
    assert check(course_tokenizer, ids).text == course_tokenizer.decode(ids, skip_special_tokens=True)


def first_stop(tok, ids, stop):
    """Where a perfect engine stops: the first token after which the text holds a stop string."""
    for n in range(1, len(ids) + 1):
        if any(s in tok.decode(ids[:n]) for s in stop):
            return n
    return None


@settings(max_examples=300, deadline=None)
@given(TEXT, st.data())
def test_stop_strings_are_cut_and_never_sent(text, data):
    tok = ByteTokenizer()
    ids = list(text.encode())
    full = tok.decode(ids)
    i = data.draw(st.integers(0, len(full) - 1))
    stop = (full[i : i + data.draw(st.integers(1, 4))], data.draw(TEXT))
    n = first_stop(tok, ids, stop)
    ids = ids[:n]
    inc = check(tok, ids, stop, "stop")
    cut = min(full.find(s) for s in stop if s in tok.decode(ids))
    assert inc.text == full[:cut]


def test_cost_per_token_is_flat(course_tokenizer):
    from course_lib.serving import prompt_pool

    ids = prompt_pool(course_tokenizer, 2048)[:512]
    short, long = (
        cost_per_token_us(TextStream, course_tokenizer, ids[:32]),
        cost_per_token_us(TextStream, course_tokenizer, ids),
    )
    full_long = cost_per_token_us(FullDecodeTextStream, course_tokenizer, ids)
    print(f"incremental: {short:.1f} µs/token at 32, {long:.1f} at 512; full decode: {full_long:.1f} at 512")
    assert long < 2.5 * short  # O(1) amortised: 16× the tokens, about the same cost each
    assert long < full_long / 3  # and far below decoding everything again
