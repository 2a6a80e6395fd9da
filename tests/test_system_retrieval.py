"""Chapter 08, context: the stdlib corpus holds every labelled question's answer, BM25 ranks by its scores,
recall@k counts what it should, the scoring rule matches whole words, and the TTFT / prefix-cache helpers
measure what they say (on tiny-target with a plain chat template: fast, no chat model needed)."""

import pytest

pytest.importorskip("rank_bm25")

from course_lib.engine import Engine, SchedulerConfig  # noqa: E402
from course_lib.measure.claims import claim  # noqa: E402
from course_lib.system import rag  # noqa: E402
from course_lib.system.retrieval import BM25Retriever, recall_at_k, tokenize  # noqa: E402
from course_lib.system.stdlib_corpus import QUICK_MODULES, build_corpus  # noqa: E402


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(QUICK_MODULES)


@pytest.fixture(scope="module")
def retriever(corpus):
    return BM25Retriever(corpus)


def test_every_question_is_answered_by_its_source_document(corpus):
    by_name = {d.name: d for d in corpus}
    questions = rag.load_questions()
    assert 20 <= len(questions) <= 30
    for q in questions:
        assert q["source"] in by_name, q
        assert rag.is_correct(by_name[q["source"]].text, q["keywords"]), q  # the answer is in the docstring


def test_corpus_names_and_bad_input():
    docs = build_corpus(["itertools", "os.path"])
    names = {d.name for d in docs}
    assert {"itertools.accumulate", "os.path.splitext"} <= names
    assert all(len(d.text) <= 600 for d in docs)
    with pytest.raises(ValueError, match="modules"):
        build_corpus("itertools")
    with pytest.raises(ValueError, match="modules"):
        build_corpus(["no_such_module_xyz"])
    with pytest.raises(ValueError, match="max_chars"):
        build_corpus(["itertools"], max_chars=5)


def test_tokenize_splits_names():
    assert tokenize("bisect.bisect_left(x)") == ["bisect", "bisect_left", "bisect", "left", "x"]
    with pytest.raises(ValueError, match="text"):
        tokenize(3)


def test_bm25_ranks_by_score_and_finds_a_named_document(retriever):
    hits = retriever.retrieve("difflib get_close_matches cutoff", 5)
    assert hits[0].doc.name == "difflib.get_close_matches"
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    with pytest.raises(ValueError, match="k must"):
        retriever.retrieve("x", 0)
    with pytest.raises(ValueError, match="query"):
        retriever.retrieve("  ")
    with pytest.raises(ValueError, match="docs"):
        BM25Retriever([])


def test_recall_is_monotone_and_fails_on_wrong_labels(retriever):
    qs = rag.load_questions()
    r = recall_at_k(retriever, qs, ks=(1, 2, 5))
    assert r[1] <= r[2] <= r[5] <= 1.0
    assert r[5] >= 0.8
    wrong = [dict(q, source="copy.deepcopy") for q in qs]  # a counter-example: labels that point elsewhere
    r_wrong = recall_at_k(retriever, wrong, ks=(2,))
    assert r_wrong[2] < 0.2
    assert not claim("recall@2 >= 80 %", r_wrong[2], at_least=0.8)
    with pytest.raises(ValueError, match="questions"):
        recall_at_k(retriever, [{"question": "x"}])


def test_scoring_rule_matches_whole_words_only():
    assert rag.is_correct("It uses HMAC.", ["HMAC"])
    assert not rag.is_correct("it is pbkdf2_hmac", ["HMAC"])  # the function's name is not the answer
    assert rag.is_correct("g(r) returns (r[2], r[5], r[3]).", ["(r[2], r[5], r[3])"])
    assert rag.is_correct("default 3", ["3"]) and not rag.is_correct("default 30", ["3"])
    with pytest.raises(ValueError, match="keywords"):
        rag.is_correct("x", "HMAC")
    with pytest.raises(ValueError, match="answer"):
        rag.is_correct(None, ["x"])


@pytest.fixture(scope="module")
def chat_engine():
    """tiny-target with a plain chat template: the helpers' logic, without the 1 GB chat model."""
    e = Engine("tiny-target", config=SchedulerConfig(max_model_len=512, max_num_seqs=4), kv_cache="paged",
               prefix_caching=True)  # fmt: skip
    e.tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    return e


def test_prompt_has_system_docs_and_question(chat_engine, corpus):
    p = rag.build_prompt(chat_engine.tokenizer, "what?", corpus[:2], nonce="[7] ")
    assert p.startswith("system: [7] " + rag.SYSTEM_PROMPT[:20])
    assert corpus[1].name in p and p.rstrip().endswith("Question: what?")
    with pytest.raises(ValueError, match="question"):
        rag.build_prompt(chat_engine.tokenizer, "")

    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="chat template"):
        rag.build_prompt(NoTemplate(), "what?")


def test_answers_context_ttft_and_prefix_cache(chat_engine, retriever):
    qs = rag.load_questions()[:3]
    bare = rag.answer_all(chat_engine, qs, None, max_new_tokens=2)
    ctx = rag.answer_all(chat_engine, qs, retriever, k=2, max_new_tokens=2)
    assert all(not a.retrieved for a in bare) and all(b.prompt_tokens > a.prompt_tokens for a, b in zip(bare, ctx))
    assert 0.0 <= rag.accuracy(ctx) <= 1.0
    cost = rag.context_ttft(chat_engine, qs, retriever, k=2)
    assert cost["context"]["prompt_tokens"] > cost["bare"]["prompt_tokens"] and cost["bare"]["ttft_s"] > 0
    pc = rag.prefix_cache_ttft(chat_engine, qs)
    assert pc["cold"]["hit_share"] == 0.0  # the unique tag breaks the first block
    assert pc["warm"]["hit_share"] > 0.3
    with pytest.raises(ValueError, match="max_new_tokens"):
        rag.answer_all(chat_engine, qs, None, max_new_tokens=0)
    with pytest.raises(ValueError, match="retriever"):
        rag.answer_all(chat_engine, qs, "bm25")


def test_prefix_cache_needs_prefix_caching():
    e = Engine("tiny-target", config=SchedulerConfig(max_model_len=256, max_num_seqs=2))
    with pytest.raises(ValueError, match="prefix_caching"):
        rag.prefix_cache_ttft(e, rag.load_questions()[:1])
