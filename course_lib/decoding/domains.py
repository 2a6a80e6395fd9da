"""Acceptance by kind of text: how often the draft's argmax equals the target's, per code domain.

Each character of Python source is labelled code, comment, docstring or string (``tokenize``); each
token takes the label of what it predicts. Teacher-forced on real held-out text (one dense forward
of each model per window, not the model's own output), the agreement rate is greedy speculative
decoding's α per domain: a draft is accepted exactly when the two argmaxes agree. Introduced in
04_decoding.ipynb.
"""

from __future__ import annotations

import io
import math
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from course_lib.decoding.assisted import quiet

DOMAINS = ("code", "comment", "docstring", "string")


def char_domains(source: str) -> list[str]:
    """A label per character of Python source: comment, docstring (a string that is a whole statement),
    string (any other literal) or code. Uses the standard ``tokenize`` module; unparsable text is code."""
    if not isinstance(source, str):
        raise ValueError(f"source must be a str, got {type(source).__name__}")
    labels = ["code"] * len(source)
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))

    def offset(rc):
        return line_starts[rc[0] - 1] + rc[1]

    prev = tokenize.NEWLINE
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            kind = None
            if tok.type == tokenize.COMMENT:
                kind = "comment"
            elif tok.type == tokenize.STRING:
                kind = (
                    "docstring"
                    if prev in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL)
                    else "string"
                )
            if kind:
                for i in range(offset(tok.start), min(offset(tok.end), len(source))):
                    labels[i] = kind
            if tok.type not in (tokenize.COMMENT,):
                prev = tok.type
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a truncated file: what was labelled stays labelled
    return labels


@dataclass
class DomainAgreement:
    """Teacher-forced top-1 agreement of draft and target, per kind of text (greedy α per domain)."""

    agree: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DOMAINS, 0))
    total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DOMAINS, 0))

    def rate(self, domain: str) -> float:
        return self.agree[domain] / self.total[domain] if self.total[domain] else math.nan

    def __str__(self) -> str:
        return "\n".join(f"{d:<10}{self.rate(d):>7.3f}   ({self.total[d]:,} tokens)" for d in DOMAINS)


@torch.inference_mode()
def acceptance_by_domain(target, draft, sources: Sequence[str], window: int = 256) -> DomainAgreement:
    """For each token of each source text, whether the draft's argmax equals the target's, given the same
    true prefix; bucketed by the domain of the token being predicted. Greedy speculative decoding accepts
    a draft exactly when they agree, so this is α by domain (on real text, not the model's own output)."""
    if isinstance(sources, str) or not sources:
        raise ValueError("sources must be a non-empty list of Python source strings")
    if target.model.vocab_size != draft.model.vocab_size:
        raise ValueError("draft and target must share one vocabulary")
    out = DomainAgreement()
    for src in sources:
        labels = char_domains(src)
        enc = quiet(target.tokenizer, src, return_offsets_mapping=True, add_special_tokens=False)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        tok_dom = []
        for a, b in offsets:
            span = [labels[i] for i in range(a, min(b, len(labels))) if not src[i].isspace()]
            tok_dom.append(span[0] if span else (labels[a] if a < len(labels) else "code"))
        for s in range(0, max(len(ids) - 1, 0), window):
            chunk = ids[s : s + window + 1]
            if len(chunk) < 2:
                break
            x = torch.tensor([chunk[:-1]], device=target.device)
            t = target.model.dense_logits(x)[0].argmax(-1)
            d = draft.model.dense_logits(x.to(draft.device))[0].argmax(-1).to(t.device)
            same = (t == d).tolist()
            for j, ok in enumerate(same):
                dom = tok_dom[s + j + 1]
                out.total[dom] += 1
                out.agree[dom] += int(ok)
    return out


def validation_sources(max_files: int = 4, max_chars: int = 6000) -> list[str]:
    """Held-out Python files (the validation split of the embedded models' corpus), each cut to ``max_chars``."""
    from course_lib.models.corpus import iter_files

    files = [f.text[:max_chars] for f in iter_files() if f.split == "val" and len(f.text) > 2000]
    return files[:max_files]
