"""Context for the model: the same questions answered with and without retrieved documents, and what the
longer prompt costs in time to first token.

A 135M-parameter chat model knows little about ``difflib``'s defaults; the document that states them fits in
its prompt. ``answer_all`` asks every question of the labelled set (``data/system/stdlib_questions.json``)
greedily, once bare and once with the retriever's top-k documents pasted before the question, and scores each
answer by a stated rule (``is_correct``: one of the question's keywords appears as a whole word). Context is
not free: every retrieved token is prefilled before the first answer token, and chapter 02 measured TTFT
growing with prompt length. ``ttft`` times single requests; ``prefix_cache_ttft`` shows what reusing the KV
blocks of the fixed system prompt (paged KV cache with prefix caching, chapter 06) takes off it. Introduced
in 08_system_1_context_guardrails_gateway.ipynb.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass

from course_lib.core.paths import data_dir
from course_lib.engine import SamplingParams
from course_lib.system.retrieval import BM25Retriever

#: The fixed system prompt every request starts with: the prefix a prefix cache can share.
SYSTEM_PROMPT = (
    "You are a careful assistant for Python programmers. You answer questions about the Python standard "
    "library. Answer in one or two short sentences. When documentation is given with the question, base the "
    "answer on that documentation and quote the exact words that answer the question: argument names, "
    "default values and return values. Do not invent functions, arguments or defaults that the "
    "documentation does not mention. If the documentation does not answer the question, say that it does "
    "not. Do not write code unless the question asks for code. Do not repeat the question. Be concise."
)


def load_questions(path=None) -> list[dict]:
    """The labelled question set: dicts with ``id``, ``source`` (a corpus name), ``question``, ``keywords``."""
    path = path or data_dir() / "system" / "stdlib_questions.json"
    questions = json.loads(open(path, encoding="utf-8").read())["questions"]
    for q in questions:
        if not {"id", "source", "question", "keywords"} <= set(q) or not q["keywords"]:
            raise ValueError(f"{path}: question {q!r} needs id, source, question and a non-empty keywords list")
    return questions


def _kw_pattern(word: str) -> str:
    left = r"(?<!\w)" if word[0].isalnum() or word[0] == "_" else ""
    right = r"(?!\w)" if word[-1].isalnum() or word[-1] == "_" else ""
    return left + re.escape(word.lower()) + right


def is_correct(answer: str, keywords) -> bool:
    """The scoring rule: one of ``keywords`` appears in ``answer`` as a whole word or phrase, any case."""
    if not isinstance(answer, str):
        raise ValueError(f"answer must be a str, got {type(answer).__name__}")
    if isinstance(keywords, str) or not keywords or not all(isinstance(k, str) and k.strip() for k in keywords):
        raise ValueError(f"keywords must be a non-empty list of non-empty strings, got {keywords!r}")
    text = answer.lower()
    return any(re.search(_kw_pattern(k.strip()), text) for k in keywords)


def build_prompt(tokenizer, question: str, docs=(), system: str = SYSTEM_PROMPT, nonce: str = "") -> str:
    """The chat-templated prompt: system prompt, then (if any) the documents, then the question.
    ``nonce`` goes before the system prompt: a unique one makes a prompt share no prefix with any other."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty str, got {question!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("tokenizer must have a chat template (use the chat model, smollm2-135m-instruct)")
    user = question
    if docs:
        user = "Documentation:\n" + "\n".join(d.render() for d in docs) + f"\n\nQuestion: {question}"
    messages = [{"role": "system", "content": f"{nonce}{system}"}, {"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@dataclass(frozen=True)
class Answer:
    id: int
    with_context: bool
    retrieved: bool  # the source document was among the retrieved ones (False without context)
    prompt_tokens: int
    text: str
    correct: bool


def answer_all(engine, questions, retriever: BM25Retriever | None = None, k: int = 2, max_new_tokens: int = 24):
    """Greedy answers to every question, batched; with ``retriever``, its top ``k`` documents as context."""
    if not questions:
        raise ValueError("questions must be a non-empty list (from load_questions)")
    if retriever is not None and not isinstance(retriever, BM25Retriever):
        raise ValueError(f"retriever must be a BM25Retriever or None, got {type(retriever).__name__}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    hits = [retriever.retrieve(q["question"], k) if retriever else [] for q in questions]
    prompts = [build_prompt(engine.tokenizer, q["question"], [h.doc for h in hs]) for q, hs in zip(questions, hits)]
    results = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens))
    return [
        Answer(
            q["id"],
            retriever is not None,
            any(h.doc.name == q["source"] for h in hs),
            len(r.prompt_ids),
            r.text.strip(),
            is_correct(r.text, q["keywords"]),
        )
        for q, hs, r in zip(questions, hits, results)
    ]


def accuracy(answers: list[Answer]) -> float:
    if not answers:
        raise ValueError("answers must be a non-empty list of Answer")
    return sum(a.correct for a in answers) / len(answers)


def ttft(engine, prompt: str, nonce: str = "") -> float:
    """Seconds from adding one request to its first token, the engine otherwise idle."""
    if engine.has_unfinished():
        raise ValueError("engine must be idle (no unfinished requests) before a timed request")
    [r] = engine.generate([prompt], SamplingParams(max_new_tokens=1))
    return r.trace.token_times[0] - r.trace.arrival


def context_ttft(engine, questions, retriever: BM25Retriever, k: int = 2) -> dict:
    """Median TTFT and prompt tokens bare vs with ``k`` documents; every prompt unique (no prefix reuse)."""
    if not questions:
        raise ValueError("questions must be a non-empty list (from load_questions)")
    tok = engine.tokenizer
    ttft(engine, build_prompt(tok, "warm-up", nonce="[warm-up] "))  # first shapes: not timed
    out = {}
    for label, use in (("bare", False), ("context", True)):
        times, tokens = [], []
        for i, q in enumerate(questions):
            docs = [h.doc for h in retriever.retrieve(q["question"], k)] if use else []
            prompt = build_prompt(tok, q["question"], docs, nonce=f"[{label} {i}] ")
            tokens.append(len(engine.encode([prompt])[0]))
            times.append(ttft(engine, prompt))
        out[label] = {"ttft_s": statistics.median(times), "prompt_tokens": statistics.median(tokens), "all": times}
    return out


def prefix_cache_ttft(engine, questions, k: int = 2, retriever: BM25Retriever | None = None) -> dict:
    """Median TTFT of the same requests with a cold prefix (a unique tag before the system prompt) and with
    the system prompt's blocks already cached (one untimed request put them there; the tag then follows the
    system prompt, so nothing after it matches). Needs prefix caching."""
    backend = engine.backend
    if not getattr(backend, "prefix_caching", False):
        raise ValueError("engine must be built with kv_cache='paged', prefix_caching=True")
    if not questions:
        raise ValueError("questions must be a non-empty list (from load_questions)")
    tok = engine.tokenizer

    def docs(q):
        return [h.doc for h in retriever.retrieve(q["question"], k)] if retriever else []

    ttft(engine, build_prompt(tok, "warm-up"))  # caches the shared system prompt's blocks
    out = {}
    for label in ("cold", "warm"):
        times, hits0, queries0 = [], backend.prefix_hits, backend.prefix_queries
        for i, q in enumerate(questions):
            # cold: a tag before the system prompt (nothing matches); warm: the same tag after it, in the user
            # turn, so only the system prompt is shared (not a whole prompt an earlier run already cached)
            tag = f"[{label} {i}] "
            question = q["question"] if label == "cold" else tag + q["question"]
            prompt = build_prompt(tok, question, docs(q), nonce=tag if label == "cold" else "")
            times.append(ttft(engine, prompt))
        out[label] = {
            "ttft_s": statistics.median(times),
            "hit_share": (backend.prefix_hits - hits0) / max(1, backend.prefix_queries - queries0),
            "all": times,
        }
    system_only = tok.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT}], tokenize=False)
    out["system_tokens"] = len(engine.encode([system_only])[0])
    out["block_size"] = backend.block_size
    return out


__all__ = [
    "SYSTEM_PROMPT", "Answer", "accuracy", "answer_all", "build_prompt", "context_ttft", "is_correct",
    "load_questions", "prefix_cache_ttft", "ttft",
]  # fmt: skip
