"""Write data/measurements/<gpu>.json from a benchmarks/gpu_check.sh run.

    python benchmarks/gpu_collect.py OUT [--data data/measurements]

OUT is the folder gpu_check.sh wrote (env.log, summary.txt, tests.xml and each benchmark's JSON). Sections
the run produced replace the stored ones; the others keep their own date (``sections_from``). The notebooks'
full-mode results come from the run's summary, never from a hand edit (course_lib.measure.gpu_record).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from course_lib.measure.gpu_record import collect  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the OUT folder of benchmarks/gpu_check.sh")
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "data" / "measurements"))
    args = p.parse_args(argv)
    print(f"wrote {collect(args.out, args.data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
