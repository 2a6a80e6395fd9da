"""The performance ledger: issue 21's speed goals, each with its latest ratio, the machine and the date.

    python benchmarks/ledger.py [--data data/measurements] [--out data/measurements/performance-ledger.json]

Reads the JSON the benchmarks wrote under ``--data`` (``course_lib.bottlenecks.ledger.GOALS`` names each
goal's file and the command that makes it: the llama.cpp comparison, the GEMV roof, the engine vs HF,
the server, the GPU record), prints one line per goal (met / missed / not measured) and writes
``--out`` plus its row in ``--data``/README.md. Run the slow benchmarks first when they are due; this
script only reads, so a regression shows as a number the next time it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT / "data" / "measurements"))
    p.add_argument("--out", default=None, help="default: <data>/performance-ledger.json")
    p.add_argument("--no-readme", action="store_true", help="do not touch <data>/README.md")
    a = p.parse_args(argv)

    from course_lib.bottlenecks.ledger import build_ledger, summary, write_ledger
    from course_lib.measure.hardware.device import detect_device

    data = Path(a.data)
    if not data.is_dir():
        p.error(f"--data must be a folder, got {a.data!r}")
    ledger = build_ledger(data, machine=detect_device("cpu").describe())
    print(summary(ledger))
    out = Path(a.out) if a.out else data / "performance-ledger.json"
    write_ledger(ledger, out, None if a.no_readme else data / "README.md")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
