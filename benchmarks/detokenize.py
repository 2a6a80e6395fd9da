"""Benchmark: the server's per-token detokenization, incremental (``TextStream``) against decoding the whole
output again every token (``FullDecodeTextStream``, what the server did before issue 26).

    python benchmarks/detokenize.py [--lengths 32 128 512 1024] [--repeats 5]

Real token ids (held-out text through the course tokenizer), one stop string held back; prints the best of
``--repeats`` runs in µs per token. The incremental cost should stay flat as the answer grows; the full
decode's grows linearly (quadratic per answer). Not a test: timings are noisy (tests/test_text_stream.py
checks the shape with a wide margin).
"""

import argparse

from course_lib.core.paths import data_dir
from course_lib.engine.text_stream import FullDecodeTextStream, TextStream, cost_per_token_us
from course_lib.models.tokenizer import load_tokenizer
from course_lib.serving import prompt_pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512, 1024])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tok = load_tokenizer(data_dir() / "models" / "tokenizer")
    pool = prompt_pool(tok, max(args.lengths) + 1)
    print(f"{'tokens':>7} {'incremental µs/tok':>19} {'full decode µs/tok':>19} {'ratio':>6}")
    for n in args.lengths:
        inc = cost_per_token_us(TextStream, tok, pool[:n], args.repeats)
        full = cost_per_token_us(FullDecodeTextStream, tok, pool[:n], args.repeats)
        print(f"{n:>7} {inc:>19.1f} {full:>19.1f} {full / inc:>6.1f}")


if __name__ == "__main__":
    main()
