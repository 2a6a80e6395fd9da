"""Benchmark: what grammar-constrained decoding (``SamplingParams.structured``, xgrammar on the sampler seam)
costs per token, and what it buys: the share of answers that parse, with and without the constraint.

    python benchmarks/structured_output.py [--model tiny-target] [--requests 16] [--max-tokens 96]

Each request asks for JSON (a JSON object, or one that fits a small schema); the same seeded requests run
unconstrained, with ``structured="json"`` and with the schema. Prints, per mode: answers that parse (and fit
the schema), how they ended, tokens per answer, the mask's mean cost per token (bitmask fill + masked write)
and the engine's mean step time, so the mask's share of a decode step. On tiny-target (a code model, no
instruction tuning) the unconstrained answers are rarely JSON; the course's chat model is the real test.
Not a test: timings are noisy (tests/test_structured_output.py checks the behaviour).
"""

import argparse
import json
import time

from course_lib.engine import Engine, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
PROMPTS = ['config = {"name": ', "# a user record as JSON\nuser = ", "data = json.loads('{\"", "person = "]


def fits(text: str, schema: bool) -> bool:
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    if not schema:
        return True
    return (
        set(doc) <= set(SCHEMA["properties"])
        and isinstance(doc.get("name"), str)
        and isinstance(doc.get("age"), int)
        and all(isinstance(t, str) for t in doc.get("tags", []))
    )


def run(engine: Engine, structured, n: int, max_tokens: int) -> dict:
    params = [
        SamplingParams(temperature=0.8, seed=i, max_new_tokens=max_tokens, structured=structured) for i in range(n)
    ]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    g = engine.grammars
    seconds0, tokens0 = g.mask_seconds, g.masked_tokens
    t0 = time.perf_counter()
    steps = 0
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(p, sp, request_id=i)
    out = {i: [] for i in range(n)}
    reasons = {}
    while engine.has_unfinished():
        steps += 1
        for ev in engine.step():
            out[ev.request].append(ev.token_id)
            if ev.finished:
                reasons[ev.request] = ev.finish_reason
    wall = time.perf_counter() - t0
    texts = [engine.tokenizer.decode(out[i], skip_special_tokens=True) for i in range(n)]
    tokens = sum(len(o) for o in out.values())
    masked = g.masked_tokens - tokens0
    return {
        "parse": sum(fits(t, False) for t in texts) / n,
        "schema": sum(fits(t, True) for t in texts) / n,
        "eos": sum(r == "eos" for r in reasons.values()) / n,
        "tokens": tokens / n,
        "mask_us": (g.mask_seconds - seconds0) / masked * 1e6 if masked else 0.0,
        "step_ms": wall / steps * 1e3,
        "example": texts[0][:70],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-target")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    engine = Engine(args.model)
    run(engine, "json", 2, 8)  # warm-up: compile, first batch shapes
    print(f"{'mode':<14} {'parse':>6} {'schema':>7} {'eos':>5} {'tok/ans':>8} {'mask µs/tok':>12} {'step ms':>8}")
    for name, structured in (("unconstrained", None), ("json_object", "json"), ("json_schema", json.dumps(SCHEMA))):
        r = run(engine, structured, args.requests, args.max_tokens)
        print(
            f"{name:<14} {r['parse']:>6.0%} {r['schema']:>7.0%} {r['eos']:>5.0%} {r['tokens']:>8.1f} "
            f"{r['mask_us']:>12.1f} {r['step_ms']:>8.2f}   {r['example']!r}"
        )


if __name__ == "__main__":
    main()
