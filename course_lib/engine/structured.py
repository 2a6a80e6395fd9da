"""Structured output: grammar-constrained decoding on the sampler seam, with xgrammar (the default backend
of vLLM and SGLang).

``SamplingParams.structured`` names a grammar: ``"json"`` (any JSON object, OpenAI's ``json_object``) or a
JSON schema as a JSON string (``json_schema``). The engine compiles each distinct one once (``Grammars``)
and gives the request a ``Grammar``: a matcher whose state follows the tokens generated so far. Each step,
before anything else touches a sampled row's logits, the matcher fills a bitmask of the tokens that keep
the text a valid prefix of some document of the grammar, and every other logit becomes −inf; after the
draw the engine feeds the token to the matcher. Once the document is complete only EOS is allowed, so the
answer ends there. Whitespace between JSON tokens takes its compact form (xgrammar's ``any_whitespace=False``,
vLLM's ``disable_any_whitespace``): left free, a code model indents forever (on tiny-target, schema answers
that end within 96 tokens: 38% with free whitespace, 88% compact). What it costs is CPU work per row and token, a bitmask fill (xgrammar walks its
pushdown automaton, with most of the vocabulary's verdicts precomputed at compile time) and one masked
write over V logits, next to a forward that does not change: ``Grammars.mask_seconds`` over
``Grammars.masked_tokens`` is the mean cost per token (``benchmarks/structured_output.py`` sets it beside a
step). Several structured rows in one step are masked together: xgrammar's ``BatchGrammarMatcher`` fills one
(B, ⌈V/32⌉) bitmask, each matcher at its row, and one ``apply_token_bitmask_inplace`` call writes them all
(``Grammars.mask_batch``; equal to masking row by row, tested). What it buys: every finished answer parses.
Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import json
import time

OBJECT_SCHEMA = '{"type": "object"}'  # "json": OpenAI's json_object asks for an object, not any JSON value


def check_spec(spec) -> None:
    """``spec`` is ``"json"`` or a JSON schema (an object) written as a JSON string; raises ``ValueError``."""
    if spec == "json":
        return
    try:
        ok = isinstance(spec, str) and isinstance(json.loads(spec), dict)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f'SamplingParams.structured must be None, "json" or a JSON schema object as a JSON string, got {spec!r}'
        )


class Grammar:
    """One request's matcher: ``mask(logits)`` before its draw, ``accept(token)`` after it."""

    def __init__(self, grammars: Grammars, compiled) -> None:
        import xgrammar as xgr

        self.grammars, self.compiled = grammars, compiled
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, grammars.vocab_size)  # (1, ⌈V/32⌉) int32

    def fresh(self) -> Grammar:
        """A new matcher of the same grammar, at its start (a forked sample's, before its first token)."""
        return Grammar(self.grammars, self.compiled)

    def mask(self, logits) -> None:
        """Set the logits (1, V) of every token the grammar forbids now to −inf, in place."""
        import xgrammar as xgr

        t0 = time.perf_counter()
        self.matcher.fill_next_token_bitmask(self.bitmask)
        xgr.apply_token_bitmask_inplace(logits, self.bitmask.to(logits.device))
        self.grammars.mask_seconds += time.perf_counter() - t0
        self.grammars.masked_tokens += 1

    def accept(self, token_id: int) -> None:
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token_id):
            raise RuntimeError(f"token {token_id} was drawn against the grammar's mask")  # a bug, never input

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()


class Grammars:
    """One engine's grammar compiler (tokenizer vocabulary, compiled grammars cached by spec) and the mask's
    running cost. Built on the first structured request, so xgrammar is needed only then."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids) -> None:
        try:
            import xgrammar as xgr
        except ImportError as exc:
            raise ValueError("structured output needs xgrammar (pip install xgrammar)") from exc
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids))
        self.compiler = xgr.GrammarCompiler(info)
        self.vocab_size = vocab_size
        self.mask_seconds = 0.0
        self.masked_tokens = 0
        self._batch = None  # xgr.BatchGrammarMatcher, built on the first step with two structured rows
        self._bitmask = None  # (rows, ⌈V/32⌉) int32, grown to the largest batch seen

    def grammar(self, spec: str) -> Grammar:
        """A matcher for ``spec`` at its start; ``ValueError`` if xgrammar cannot compile it."""
        check_spec(spec)
        schema = OBJECT_SCHEMA if spec == "json" else spec
        try:
            compiled = self.compiler.compile_json_schema(schema, any_whitespace=False)  # cached by the compiler
        except Exception as exc:  # noqa: BLE001 - xgrammar raises its own types; bad input, said as such
            raise ValueError(f"SamplingParams.structured: the JSON schema does not compile: {exc}") from None
        return Grammar(self, compiled)

    def mask_batch(self, logits, rows: list[tuple[int, Grammar]]) -> None:
        """Mask the rows ``b`` of ``logits`` (B, V) for their grammars in place, ``rows`` = [(b, grammar)]:
        one bitmask fill over all matchers and one masked write."""
        import xgrammar as xgr

        t0 = time.perf_counter()
        B = logits.shape[0]
        if self._bitmask is None or self._bitmask.shape[0] < B:
            self._bitmask = xgr.allocate_token_bitmask(B, self.vocab_size)
        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher(max_threads=1)  # the engine's step already uses the cores
        bitmask = self._bitmask[:B]
        index = [b for b, _ in rows]
        self._batch.batch_fill_next_token_bitmask([g.matcher for _, g in rows], bitmask, indices=index)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=index)
        self.mask_seconds += time.perf_counter() - t0
        self.masked_tokens += len(rows)

    @property
    def seconds_per_token(self) -> float:
        return self.mask_seconds / self.masked_tokens if self.masked_tokens else 0.0


def mask_rows(logits, seqs: list, batched: bool = True):
    """(B, V) fp32 logits with each structured row's forbidden tokens at −inf (a copy if any row is).
    Two or more structured rows are masked in one batch (``batched=False``: row by row, the reference)."""
    rows = [(b, s.grammar) for b, s in enumerate(seqs) if getattr(s, "grammar", None) is not None]
    if not rows:
        return logits
    out = logits.clone()
    if batched and len(rows) > 1:
        rows[0][1].grammars.mask_batch(out, rows)
    else:
        for b, grammar in rows:
            grammar.mask(out[b : b + 1])
    return out
