"""Input guardrails: secrets, personal data and prompt injection, caught before a prompt reaches the model.

Huyen (*AI Engineering*, ch. 10) puts guardrails on both sides of the model. On the way in, three checks:
``find_secrets`` runs detect-secrets' plugins (Yelp's scanner: regexes for AWS, GitHub, Slack, Stripe,
OpenAI… keys, private-key headers, ``password = "…"`` assignments, and high-entropy strings in quotes) over
each line; ``find_pii`` matches e-mail addresses and phone numbers with regexes; ``find_injection`` matches
phrases that prompt-injection attempts use ("ignore all previous instructions", "reveal your system
prompt"). Each returns the spans it found, so ``scrub`` can replace them with a placeholder and forward the
rest. All three are pattern matchers: they miss what their patterns do not name (false negatives) and flag
innocent text that looks like a pattern (false positives); ``guard_eval`` counts both. Introduced in
08_system_1_context_guardrails_gateway.ipynb.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

CHECKS = ("secrets", "pii", "injection")

_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
# +CC and 7-15 digits in groups, or a North-American (NNN) NNN-NNNN; not a date, a version or a bare number
# (a sentence's full stop may follow; another digit group may not)
_PHONE = re.compile(
    r"(?<!\w)(?<!\d\.)(?:\+\d{1,3}[\s.-]?(?:\(\d{1,4}\)[\s.-]?)?\d{1,4}(?:[\s.-]?\d{2,4}){2,4}"
    r"|\(\d{3}\)\s?\d{3}[\s.-]\d{4}|\d{3}[.-]\d{3}[.-]\d{4})(?!\w|[.-]\d)"
)
_INJECTION = re.compile(
    r"|".join(
        [
            r"\b(?:ignore|disregard|forget|override)\b.{0,40}\b(?:previous|prior|above|earlier|all|your|the)\b.{0,20}"
            r"\b(?:instructions?|rules|prompts?|guidelines|directions)\b",
            r"\b(?:reveal|print|show|repeat|output|leak)\b.{0,30}\b(?:system prompt|hidden prompt|initial instructions"
            r"|your instructions|your prompt)\b",
            r"\byou are now\b.{0,40}\b(?:dan|unrestricted|unfiltered|jailbroken|no longer)\b",
            r"\b(?:developer|god|jailbreak|dan) mode\b",
            r"\bpretend (?:that )?you (?:have no|are not bound|are free)\b",
            r"\bnew instructions?:",
        ]
    ),
    re.IGNORECASE | re.DOTALL,
)


@dataclass(frozen=True)
class Finding:
    check: str  # one of CHECKS
    kind: str  # e.g. "AWS Access Key", "email", "phone", "injection phrase"
    start: int
    end: int


def _text(text) -> str:
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    return text


@lru_cache(maxsize=1)
def _plugins():
    """detect-secrets' plugins with its default settings (entropy limits 4.5 base64, 3.0 hex)."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    out = []
    for cls in get_mapping_from_secret_type_to_class().values():
        name = cls.__name__
        if name == "IPPublicDetector":  # an IP address is not a credential; PII has its own check
            continue
        kwargs = {"limit": 4.5} if name == "Base64HighEntropyString" else {"limit": 3.0} if "Hex" in name else {}
        out.append(cls(**kwargs))
    return out


def find_secrets(text: str) -> list[Finding]:
    """Credentials found by detect-secrets, line by line (spans of the secret values it reports)."""
    text = _text(text)
    found, offset = [], 0
    for line in text.split("\n"):
        for plugin in _plugins():
            for secret in plugin.analyze_line(filename="prompt.txt", line=line, line_number=1):
                value = secret.secret_value or ""
                i = line.find(value) if value else -1
                start, end = (offset + i, offset + i + len(value)) if i >= 0 else (offset, offset + len(line))
                found.append(Finding("secrets", secret.type, start, end))
        offset += len(line) + 1
    return found


def find_pii(text: str) -> list[Finding]:
    """E-mail addresses and phone numbers, by regex."""
    text = _text(text)
    return [
        Finding("pii", kind, m.start(), m.end())
        for kind, rx in (("email", _EMAIL), ("phone", _PHONE))
        for m in rx.finditer(text)
    ]


def find_injection(text: str) -> list[Finding]:
    """Phrases of known prompt-injection patterns (a heuristic: rephrasing evades it)."""
    text = _text(text)
    return [Finding("injection", "injection phrase", m.start(), m.end()) for m in _INJECTION.finditer(text)]


FINDERS = {"secrets": find_secrets, "pii": find_pii, "injection": find_injection}


def check_input(text: str, checks=CHECKS) -> list[Finding]:
    """Every finding of the chosen ``checks`` (names from ``CHECKS``)."""
    bad = [c for c in checks if c not in FINDERS] if not isinstance(checks, str) else [checks]
    if bad or not checks:
        raise ValueError(f"checks must be a non-empty list of {CHECKS}, got {checks!r}")
    return [f for c in checks for f in FINDERS[c](text)]


def scrub(text: str, findings: list[Finding] | None = None) -> str:
    """``text`` with every secret and PII span replaced by ``[KIND]`` (injection is blocked, not scrubbed)."""
    text = _text(text)
    findings = check_input(text, ("secrets", "pii")) if findings is None else findings
    spans = sorted({(f.start, f.end, f.kind) for f in findings if f.check != "injection"})
    out, pos = [], 0
    for start, end, kind in spans:
        if start < pos:  # overlaps one already replaced (two plugins, one secret)
            continue
        out += [text[pos:start], f"[{kind.upper().replace(' ', '_')}]"]
        pos = end
    return "".join(out) + text[pos:]


__all__ = ["CHECKS", "FINDERS", "Finding", "check_input", "find_injection", "find_pii", "find_secrets", "scrub"]
