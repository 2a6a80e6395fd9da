"""Verdicts and predictions: prose about a measurement is either a prediction or a computed verdict.

A sentence such as "prefill reaches the compute roof" is true on one machine and false on another. A
notebook therefore states the claim, measures, and lets :func:`claim` print whether it held *here* and,
if it did not, the likely reason. :func:`compare_prediction` puts the number the learner wrote down
before measuring beside the theory and the measurement. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real


@dataclass(frozen=True)
class Verdict:
    """Whether a claim held on this machine; truthy when it held. Shows nothing as a cell's value."""

    held: bool
    statement: str = ""
    margin: float = math.nan  # how far past (>1) or short of (<1) the threshold the measurement fell
    inside_noise: bool = False  # the threshold lies within the run-to-run spread: this run cannot decide it

    def __bool__(self) -> bool:
        return bool(self.held)

    def __eq__(self, other) -> bool:
        if isinstance(other, Verdict):
            return self.held == other.held
        if isinstance(other, bool):
            return self.held == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.held)

    def _ipython_display_(self) -> None:  # the printed line is the output; no stray True/False below it
        return None


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _fmt(x: float, unit: str) -> str:
    return f"{x:.4g}{unit}"


def claim(
    statement: str,
    measured,
    *,
    at_least=None,
    at_most=None,
    unit: str = "",
    why_not: str = "",
    spread=None,
    where: str = "on this machine",
) -> Verdict:
    """Print whether ``statement`` held: ``measured`` >= ``at_least`` and/or <= ``at_most``.

    ``why_not`` is the likely reason, printed only when the claim failed. The returned
    :class:`Verdict` carries ``margin`` (measured/threshold for ``at_least``, threshold/measured for
    ``at_most``; the smaller of the two if both): mark a verdict cell ``NBVAL_CHECK_OUTPUT`` only when
    the margin is 2 or more on every machine you can think of.

    ``spread`` is the measurement's relative run-to-run spread on this machine (0.1 = ±10%; see
    :func:`relative_spread`). When the threshold lies inside ``measured × (1 ± spread)``, this run cannot
    decide the claim: the line says "inside the noise on this machine" (and which way this run fell), and
    the verdict's ``inside_noise`` is set. ``held`` still reports this run.

    ``where`` says whose measurement it is: "on this machine" (a number this run measured) or, for a number
    read from a stored record, e.g. "in the recorded run (2026-12-06, <machine>)".
    """
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError(f"statement must be a non-empty string, got {statement!r}")
    if not isinstance(where, str) or not where.strip():
        raise ValueError(f"where must be a non-empty string (e.g. 'on this machine'), got {where!r}")
    if at_least is None and at_most is None:
        raise ValueError("give at_least=, at_most= or both: a claim needs a threshold")
    value = _number("measured", measured)
    if spread is not None:
        spread = _number("spread", spread)
        if spread < 0:
            raise ValueError(f"spread must be >= 0 (a relative run-to-run spread, 0.1 = ±10%), got {spread!r}")
    margins, bounds = [], []
    if at_least is not None:
        low = _number("at_least", at_least)
        margins.append(value / low if low > 0 else (math.inf if value >= low else 0.0))
        bounds.append(f">= {_fmt(low, unit)}")
    if at_most is not None:
        high = _number("at_most", at_most)
        margins.append(high / value if value > 0 else (math.inf if value <= high else 0.0))
        bounds.append(f"<= {_fmt(high, unit)}")
    held = (at_least is None or value >= float(at_least)) and (at_most is None or value <= float(at_most))
    margin = min(margins)
    head = f"measured {_fmt(value, unit)}, claim needs {' and '.join(bounds)}"
    thresholds = [float(t) for t in (at_least, at_most) if t is not None]
    noisy = bool(spread) and any(value * (1 - spread) <= t <= value * (1 + spread) for t in thresholds)
    if noisy:
        way = "held" if held else "missed"
        print(
            f"≈ inside the noise {where}: {statement} ({head}; run-to-run spread ±{spread:.0%}, "
            f"so the threshold is within it; this run {way})"
        )
        return Verdict(held, statement, margin, inside_noise=True)
    if held:
        print(f"✅ holds {where}: {statement} ({head})")
    else:
        reason = f"\n   likely reason: {why_not}" if why_not else ""
        print(f"✗ does not hold {where}: {statement} ({head}){reason}")
    return Verdict(held, statement, margin)


def relative_spread(samples) -> float:
    """Half the range of repeated measurements over their median: 0.1 means ±10% (for ``claim(spread=)``)."""
    try:
        values = [_number("samples", v) for v in samples]
    except TypeError:
        raise ValueError(f"samples must be an iterable of numbers, got {samples!r}") from None
    if len(values) < 2:
        raise ValueError(f"samples needs at least 2 repeats to have a spread, got {len(values)}")
    values.sort()
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    if median == 0:
        raise ValueError("samples have a median of 0: a relative spread is undefined")
    return (values[-1] - values[0]) / (2 * abs(median))


def _ratio(r: float) -> str:
    """A ratio a reader can compare: 0.37×, 1.8×, 3,000× — and 1/3,000× rather than a rounded 0.00×."""
    if r == 0:
        return "0×"
    if abs(r) < 0.01:
        return f"1/{1 / abs(r):,.0f}×" if r > 0 else f"−1/{1 / abs(r):,.0f}×"
    return f"{r:,.0f}×" if abs(r) >= 100 else f"{r:.2f}×"


def compare_prediction(name: str, prediction, *, theory=None, measured=None, unit: str = "") -> None:
    """Print the learner's ``prediction`` beside ``theory`` and ``measured`` (any may be None)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    rows = []
    for label, value in (("your prediction", prediction), ("theory", theory), ("measured", measured)):
        if value is None:
            continue
        rows.append((label, _number(label, value)))
    print(name)
    for label, value in rows:
        extra = ""
        if measured is not None and label != "measured" and float(measured) != 0:
            extra = f"   ({_ratio(value / float(measured))} the measurement)"
        print(f"  {label:<16}{_fmt(value, unit):>12}{extra}")
    if prediction is None:
        print("  (no prediction written: set your prediction variable to a number before measuring, then re-run)")


__all__ = ["Verdict", "claim", "compare_prediction", "relative_spread"]
