"""Benchmark: what grammar-constrained decoding (``SamplingParams.structured``, xgrammar on the sampler seam)
costs per token, and what it buys: the share of answers that parse, with and without the constraint.

    python benchmarks/structured_output.py [--model tiny-target] [--requests 16] [--max-tokens 96]

Each request asks for JSON (a JSON object, or one that fits a small schema); the same seeded requests run
unconstrained, with ``structured="json"`` and with the schema. Prints, per mode: answers that parse (and fit
the schema), how they ended, tokens per answer, the mask's mean cost per token (bitmask fill + masked write)
and the engine's mean step time, so the mask's share of a decode step. On tiny-target (a code model, no
instruction tuning) the unconstrained answers are rarely JSON; the course's chat model
(``--model smollm2-135m-instruct``) gets chat prompts that ask for the record (``chat_prompts``).
Not a test: timings are noisy (tests/test_structured_output.py checks the behaviour).
"""

import argparse

from course_lib.engine import Engine, SchedulerConfig
from course_lib.serving.structured_output import PROMPTS, chat_prompts, compare_modes, format_runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-target")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    engine = Engine(args.model, config=SchedulerConfig(max_model_len=512, max_num_seqs=min(args.requests, 16)))
    prompts = chat_prompts(engine.tokenizer) if getattr(engine.tokenizer, "chat_template", None) else PROMPTS
    print(format_runs(compare_modes(engine, args.requests, args.max_tokens, prompts=prompts)))


if __name__ == "__main__":
    main()
