"""Retrieval: BM25 (Robertson & Zaragoza's Okapi BM25, as ``rank_bm25`` implements it) over a list of documents.

BM25 scores a document by the query terms it contains, each weighted by how rare the term is in the corpus
(IDF) and saturated in how often it repeats (k1), with long documents discounted (b). It is lexical: a
question that names ``bisect_left`` finds the document that names it; a question in other words than the
document's may not. ``recall_at_k`` measures that on a labelled question set before any model sees a
retrieved word: the generator cannot use a document the retriever did not return. Introduced in
08_system_1_context_guardrails_gateway.ipynb.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rank_bm25 import BM25Okapi

from course_lib.system.stdlib_corpus import Doc

_WORD = re.compile(r"[a-z0-9_]+")


def tokenize(text: str) -> list[str]:
    """Lower-case words; a name with underscores counts whole and by its parts (``bisect_left`` → 3 terms)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    out = []
    for w in _WORD.findall(text.lower()):
        out.append(w)
        if "_" in w.strip("_"):
            out += [p for p in w.split("_") if p]
    return out


@dataclass(frozen=True)
class Hit:
    doc: Doc
    score: float


class BM25Retriever:
    """``retrieve(query, k)``: the ``k`` best documents by BM25 score (ties keep corpus order)."""

    def __init__(self, docs: list[Doc], k1: float = 1.5, b: float = 0.75) -> None:
        if not isinstance(docs, list) or not docs or not all(isinstance(d, Doc) for d in docs):
            raise ValueError("docs must be a non-empty list of Doc (from stdlib_corpus.build_corpus)")
        for name, v in (("k1", k1), ("b", b)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{name} must be a number >= 0, got {v!r}")
        self.docs = docs
        # the document's name counts as its words too: "itertools.accumulate" → itertools, accumulate
        self.index = BM25Okapi([tokenize(d.render()) for d in docs], k1=k1, b=b)

    def retrieve(self, query: str, k: int = 2) -> list[Hit]:
        if not isinstance(query, str) or not query.strip():
            raise ValueError(f"query must be a non-empty str, got {query!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        scores = self.index.get_scores(tokenize(query))
        order = sorted(range(len(self.docs)), key=lambda i: -scores[i])[:k]
        return [Hit(self.docs[i], float(scores[i])) for i in order]


def recall_at_k(retriever: BM25Retriever, questions: list[dict], ks=(1, 2, 5)) -> dict[int, float]:
    """Share of ``questions`` whose ``source`` document is among the top k, for each k in ``ks``."""
    if not isinstance(retriever, BM25Retriever):
        raise ValueError(f"retriever must be a BM25Retriever, got {type(retriever).__name__}")
    if not questions or not all(isinstance(q, dict) and "question" in q and "source" in q for q in questions):
        raise ValueError("questions must be a non-empty list of dicts with 'question' and 'source'")
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks must be ints >= 1, got {ks!r}")
    top = max(ks)
    ranks = []
    for q in questions:
        names = [h.doc.name for h in retriever.retrieve(q["question"], top)]
        ranks.append(names.index(q["source"]) + 1 if q["source"] in names else None)
    return {k: sum(r is not None and r <= k for r in ranks) / len(questions) for k in ks}


__all__ = ["BM25Retriever", "Hit", "recall_at_k", "tokenize"]
