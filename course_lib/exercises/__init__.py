"""Auto-checked exercises: ``check`` compares an answer with a value computed by ``course_lib``.

Expected values are never typed in by hand: each chapter module (``ch00``, ``ch01``, ...) computes
them from the spec table and the accounting formulas, so they cannot drift from the library.
An unanswered exercise (``None``) prints a reminder and returns a falsy verdict; a wrong answer raises
``AssertionError`` with a ❌ message (a notebook must not print "wrong" and carry on); a right one
prints ✅ and returns a truthy verdict. The verdict (:class:`course_lib.measure.claims.Verdict`) shows nothing
as a cell's value, so an unanswered check leaves no stray ``False`` in the notebook. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import math
from numbers import Real

from course_lib.measure.claims import Verdict


def _matches(answer, expected, rtol: float, atol: float) -> bool:
    if isinstance(expected, bool) or isinstance(expected, str):
        if isinstance(expected, str) and isinstance(answer, str):
            return answer.strip().lower() == expected.strip().lower()
        return answer == expected
    if isinstance(answer, bool) or not isinstance(answer, Real):
        return False
    return math.isfinite(float(answer)) and math.isclose(float(answer), float(expected), rel_tol=rtol, abs_tol=atol)


def check(
    name: str, answer, expected, *, rtol: float = 0.02, atol: float = 0.0, hint: str = "", unit: str = ""
) -> Verdict:
    """✅ and a truthy verdict if ``answer`` matches ``expected`` (numbers within ``rtol``/``atol``, strings
    case-insensitively); ⏳ and a falsy one if ``answer`` is None; otherwise raise AssertionError (❌)."""
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    unit = f" {unit}" if unit else ""
    if answer is None:
        print(f"⏳ {name}: not answered yet — replace None with your answer and re-run this cell")
        return Verdict(False, name)
    if _matches(answer, expected, rtol, atol):
        shown = f"{expected:.4g}" if isinstance(expected, float) else repr(expected)
        print(f"✅ {name}: {shown}{unit} is right")
        return Verdict(True, name)
    tolerance = f" (within {rtol:.0%})" if isinstance(expected, Real) and not isinstance(expected, bool) else ""
    raise AssertionError(
        f"❌ {name}: your answer {answer!r}{unit} is not the expected value{tolerance}. {hint}".strip()
    )


def check_measurement(name: str, answer, measure, *, rtol: float = 0.35, hint: str = "", unit: str = "") -> Verdict:
    """A re-measuring exercise: the learner measured something with their own code; ``measure()``
    measures it again here and the two must agree within ``rtol`` (wide: timings are noisy).
    ⏳ without measuring if ``answer`` is None."""
    if not callable(measure):
        raise ValueError(f"measure must be a callable returning a number, got {type(measure).__name__}")
    if answer is None:
        return check(name, None, 0.0)
    measured = float(measure())
    unit_s = f" {unit}" if unit else ""
    print(f"   re-measured here: {measured:.4g}{unit_s}; yours: {answer!r}{unit_s}")
    return check(
        name,
        answer,
        measured,
        rtol=rtol,
        unit=unit,
        hint=f"timings vary from run to run: re-run both cells once; if it still misses, {hint}".strip(),
    )


__all__ = ["check", "check_measurement"]
