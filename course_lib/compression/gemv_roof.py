"""GEMV at the roof: how close the decode-shaped products of each weight format come to STREAM.

A decode step is 1-4 rows times every weight, so each product's speed is the weight's bytes ÷ the time,
and the ceiling is the bandwidth a STREAM triad measures on the same machine (``measure.microbench``).
``gemv_roof`` times the engine's fp32 layers (``F.linear``, oneDNN-packed ``PackedLinear`` and the course's
hand-written ``kernels.cpu_gemv``) and the weight-only int8 (per channel) and int4 (asymmetric groups of
32, llama.cpp's Q4_1) layers on the course's kernels (fp32 activations) and on torch's packed CPU kernels
(``int8 bf16``/``int4 bf16``: activations rounded to bf16), ``int4-q8`` (the course's int4 kernel with
activations rounded to int8 per block of 32 and multiplied four bytes at a time: llama.cpp's trade, opt-in
``path="gemv-q8"``) and ``int8-dyn`` (the opt-in ``path="dynamic"``, int8 activations too), each cycling through enough copies of its weight to read
``working_set`` bytes (2-4× the LLC, ``microbench.working_set_bytes``, so no format is served from the cache), and reports GB/s of weight
bytes and the fraction of STREAM.
``cache_roof`` times the same kernels on one small weight read over and over, so it stays in the caches:
the rate each kernel reaches when DRAM is not the limit, its arithmetic's own roof; ``bound_verdicts`` sets
the two roofs side by side (a kernel whose in-cache rate is not above STREAM cannot read DRAM at STREAM's
rate, whatever its loads do). ``bf16_activation_error`` measures what the int8/int4 CPU kernels' bf16 rounding of the activations
costs against the fp32 reference; ``bandwidth_bars`` plots achieved GB/s against the roof (the recorded
engine and llama.cpp rows on it: ``compression.peer_roof``).
Introduced in 03_compression.ipynb (section 2) (issue 21).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from course_lib.compression.linear import (
    WeightOnlyLinear,
    cpu_supports,
    dynamic_supports,
    gemv_q8_supports,
    gemv_supports,
    layer_bytes,
    timing_copy,
)
from course_lib.compression.quantize import QuantConfig, quantize
from course_lib.core.memory import trim_heap
from course_lib.engine.layers import Linear, PackedLinear, SkinnyLinear
from course_lib.kernels import cpu_gemv
from course_lib.measure.claims import claim, relative_spread

GOAL = 0.75  # issue 21: decode-shaped products read their weight at >= 75% of STREAM
CONFIGS = {
    "int8": QuantConfig(bits=8, granularity="channel", symmetric=True),
    "int4": QuantConfig(bits=4, granularity="group", group_size=32, symmetric=False),
}
FORMATS = ("fp32", "fp32 packed", "fp32 gemv", "int8", "int8 bf16", "int4", "int4 bf16", "int4-q8", "int8-dyn")
# the format each kernel reads, and the path that runs it ("gemv": kernels.cpu_gemv, "cpu": torch's bf16 kernels)
PATH_OF = {
    "int8": "gemv",
    "int8 bf16": "cpu",
    "int4": "gemv",
    "int4 bf16": "cpu",
    "int4-q8": "gemv-q8",  # the course's int4 kernel with activations rounded to int8 per 32 (llama.cpp's trade)
    "int8-dyn": "dynamic",
}


def available_formats(formats=FORMATS) -> tuple:
    """The formats of ``formats`` that can run here: the course's kernels need a C compiler
    (``kernels.cpu_gemv``), torch's packed ones and fbgemm a torch built with them."""
    w = torch.zeros(16, 128)
    ok = []
    for fmt in formats:
        if fmt == "fp32 gemv":
            good = cpu_gemv.available()
        elif fmt == "fp32 packed":
            good = PackedLinear.available(w)
        elif fmt in PATH_OF:
            qw = quantize(w, CONFIGS[fmt.split()[0].split("-")[0]])
            good = {
                "gemv": gemv_supports,
                "gemv-q8": gemv_q8_supports,
                "cpu": cpu_supports,
                "dynamic": dynamic_supports,
            }[PATH_OF[fmt]](qw)
        else:
            good = True
        if good:
            ok.append(fmt)
    return tuple(ok)


# bytes per weight of each format as its kernel stores it (llama.cpp: Q8_0 = 34 B and Q4_1 = 20 B per 32)
BYTES_PER_WEIGHT = {"fp32": 4.0, "int8": 1.0, "int4": 0.5 + 4 / 32, "q8_0": 34 / 32, "q4_1": 20 / 32}


@dataclass(frozen=True)
class RoofRow:
    """One format's decode-shaped product: ``rows`` × an (out, in) weight, ``samples`` seconds per call
    (each sample one pass over ``copies`` copies), against ``stream_gbps``."""

    format: str
    path: str
    rows: int
    weight_bytes: int
    samples: tuple
    copies: int
    stream_gbps: float
    stream_samples: tuple = ()  # GB/s of one STREAM triad pass timed right before each sample (paired), or ()

    @property
    def seconds(self) -> float:
        s = sorted(self.samples)
        return s[len(s) // 2]

    @property
    def gbps(self) -> float:
        return self.weight_bytes / self.seconds / 1e9

    def _pair_ratios(self) -> list[float]:
        return [self.weight_bytes / t / 1e9 / b for t, b in zip(self.samples, self.stream_samples)]

    @property
    def fraction(self) -> float:
        """GB/s of weight read ÷ STREAM GB/s: with paired STREAM samples, the median of each sample's ratio to
        the triad timed just before it (a machine whose speed drifts moves both sides of a pair alike)."""
        if self.stream_samples:
            r = sorted(self._pair_ratios())
            return r[len(r) // 2]
        return self.gbps / self.stream_gbps

    @property
    def best_gbps(self) -> float:
        """GB/s of the fastest sample: a roof is the best a kernel does, not its typical call."""
        return self.weight_bytes / min(self.samples) / 1e9

    @property
    def best_fraction(self) -> float:
        """The best sample ÷ STREAM (paired: the best of the pairs' ratios)."""
        if self.stream_samples:
            return max(self._pair_ratios())
        return self.best_gbps / self.stream_gbps

    @property
    def spread(self) -> float:
        return relative_spread(self.samples) if len(self.samples) > 1 else 0.0


def _check_int(name, v, low=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{name} must be an int >= {low}, got {v!r}")


def _check_stream(stream_gbps) -> None:
    if not (isinstance(stream_gbps, (int, float)) and stream_gbps > 0):
        raise ValueError(f"stream_gbps must be a positive number (GB/s), got {stream_gbps!r}")


def triad_sampler(n_bytes: int, passes: int = 3):
    """A callable that times ``passes`` STREAM triad passes (a = b + 3·c, three fp32 arrays of ``n_bytes``
    each, made once) and returns the best one's GB/s (STREAM's convention: a peak is the best pass; one pass
    alone read 3-12% lower on the course's VM): the roof sampled right before each GEMV sample (``stream_sample=``), so that a
    ratio's two sides share the same moment of a machine whose speed drifts (a shared VM's can move by 1.5x
    within minutes)."""
    from course_lib.measure.costs import triad_cost

    _check_int("n_bytes", n_bytes, 4)
    _check_int("passes", passes)
    n = n_bytes // 4
    a, b, c = torch.zeros(n), torch.full((n,), 1.0), torch.full((n,), 2.0)
    nbytes = triad_cost(n, "fp32").bytes

    def sample() -> float:
        best = float("inf")
        for _ in range(passes):
            t0 = time.perf_counter()
            torch.add(b, c, alpha=3.0, out=a)
            best = min(best, time.perf_counter() - t0)
        return nbytes / best / 1e9

    sample()  # pages touched, threads warm
    return sample


def _timed(pass_fn, repeats: int, stream_sample):
    """``repeats`` seconds of ``pass_fn()``, each preceded by one STREAM sample when ``stream_sample`` is given."""
    samples, stream = [], []
    for _ in range(repeats):
        if stream_sample is not None:
            stream.append(float(stream_sample()))
        samples.append(pass_fn())
    return tuple(samples), tuple(stream)


def _checked_formats(formats, default) -> tuple:
    """``formats`` (None: those of ``default`` that can run here), each checked to be known and runnable."""
    formats = available_formats(default) if formats is None else tuple(formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ValueError(f"formats must be among {FORMATS}, got {bad}")
    missing = [f for f in formats if f not in available_formats(formats)]
    if missing:
        raise ValueError(f"formats {missing} cannot run here (see available_formats); drop them")
    return formats


def _make(fmt: str, w: torch.Tensor):
    if fmt == "fp32":
        return Linear(w)
    if fmt == "fp32 packed":
        return PackedLinear(w, rows_hint=4)
    if fmt == "fp32 gemv":
        return SkinnyLinear(w)  # its 1..4-row products: kernels.cpu_gemv on the plain weight
    # int8-dyn is opt-in: int8 activations too (fbgemm), never chosen by path="auto"
    return WeightOnlyLinear.from_linear(Linear(w), CONFIGS[fmt.split()[0].split("-")[0]], path=PATH_OF[fmt])


def _clone(layer):
    """A copy with its own storage for exactly what its forward reads (so copies cost what they read)."""
    return timing_copy(layer)


def _nbytes(layer) -> int:
    if isinstance(layer, WeightOnlyLinear) and layer.path == "dynamic":
        return layer.out_features * layer.in_features + 8 * layer.out_features  # int8 + a double scale per row
    return layer.out_features * layer.in_features * 4 if isinstance(layer, PackedLinear) else layer_bytes(layer)


@torch.inference_mode()
def gemv_roof(
    out_features: int,
    in_features: int,
    *,
    stream_gbps: float,
    rows=(1,),
    formats=None,
    working_set: int = 128 * 2**20,
    repeats: int = 5,
    seed: int = 0,
    stream_sample=None,
) -> list[RoofRow]:
    """Time ``rows`` × (out, in) through each format of ``formats`` (see ``FORMATS``) with the current
    torch threads; each sample is one pass over enough copies to read ``working_set`` bytes. ``formats``
    None: every format that can run here (``available_formats``). ``stream_sample`` (``triad_sampler``):
    one STREAM pass before each sample, and each row's fraction is the median of the paired ratios."""
    _check_int("out_features", out_features)
    _check_int("in_features", in_features)
    _check_int("working_set", working_set)
    _check_int("repeats", repeats, 2)
    _check_stream(stream_gbps)
    rows = tuple(rows)
    for r in rows:
        _check_int("rows", r)
    formats = _checked_formats(formats, FORMATS)
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen) * 0.02
    out = []
    for fmt in formats:
        layer = _make(fmt, w)
        layer(torch.zeros(1, in_features))  # the CPU kernels pack on first use
        layer(torch.zeros(max(rows), in_features))  # (a quantized layer's larger batches: torch's layout)
        nbytes = _nbytes(layer)
        layers = [layer] + [_clone(layer) for _ in range(max(1, -(-working_set // nbytes)) - 1)]
        for r in rows:
            x = torch.randn(r, in_features, generator=gen)
            for lay in layers[: min(3, len(layers))]:
                lay(x)

            def one_pass(layers=layers, x=x) -> float:
                t0 = time.perf_counter()
                for lay in layers:
                    lay(x)
                return (time.perf_counter() - t0) / len(layers)

            samples, stream = _timed(one_pass, repeats, stream_sample)
            out.append(
                RoofRow(fmt, _path(layer, fmt), r, nbytes, samples, len(layers), _roof(stream, stream_gbps), stream)
            )
        del layers, layer
        trim_heap()  # the copies go back to the OS before the next format's come
    return out


def _path(layer, fmt: str) -> str:
    return getattr(layer, "path", {"fp32 packed": "oneDNN packed", "fp32 gemv": "gemv"}.get(fmt, "F.linear"))


CACHE_FORMATS = ("fp32 gemv", "int8", "int4", "int4-q8")


@torch.inference_mode()
def cache_roof(
    in_features: int,
    *,
    stream_gbps: float,
    out_features: int = 512,
    formats=None,
    calls: int = 50,
    repeats: int = 5,
    seed: int = 0,
    stream_sample=None,
) -> list[RoofRow]:
    """One row × an (out_features, in_features) weight small enough to stay in the caches, ``calls`` times per
    sample, through each of ``formats`` (default: the course's GEMV kernels that can run here,
    ``CACHE_FORMATS``): GB/s of weight bytes with memory out of the way, against ``stream_gbps``. The default
    512 × 4,096 is 1.2 MB in int4 and 8 MB in fp32: within L2 or the LLC of a current CPU."""
    _check_int("in_features", in_features)
    _check_int("out_features", out_features)
    _check_int("calls", calls)
    _check_int("repeats", repeats, 2)
    _check_stream(stream_gbps)
    formats = _checked_formats(formats, CACHE_FORMATS)
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen) * 0.02
    x = torch.randn(1, in_features, generator=gen)
    out = []
    for fmt in formats:
        layer = _make(fmt, w)
        for _ in range(3):
            layer(x)  # packs on first use, then warm in the caches

        def calls_pass(layer=layer) -> float:
            t0 = time.perf_counter()
            for _ in range(calls):
                layer(x)
            return (time.perf_counter() - t0) / calls

        samples, stream = _timed(calls_pass, repeats, stream_sample)
        out.append(RoofRow(fmt, _path(layer, fmt), 1, _nbytes(layer), samples, 1, _roof(stream, stream_gbps), stream))
    return out


def _roof(stream: tuple, stream_gbps: float) -> float:
    """A row's STREAM: the median of its paired samples, else the one figure given."""
    return sorted(stream)[len(stream) // 2] if stream else float(stream_gbps)


def bound_verdicts(dram: list[RoofRow], cache: list[RoofRow], goal: float = GOAL) -> list[dict]:
    """Per format timed both ways (one row): its DRAM rate (the median sample), its in-cache rate (the best
    sample: a roof), each ÷ STREAM, and which roof is the lower: "arithmetic" where the kernel's in-cache
    rate is below STREAM (it cannot reach the memory roof however it loads), else "memory";
    ``reachable``: the goal is within the lower roof."""
    by_fmt = {(r.format, r.path): r for r in dram if r.rows == 1}
    rows = []
    for c in cache:
        d = by_fmt.get((c.format, c.path))
        if d is None:
            continue
        roof = c.best_fraction  # the in-cache rate as a fraction of STREAM
        rows.append(
            {
                "format": c.format,
                "path": c.path,
                "dram_fraction": d.fraction,
                "cache_fraction": roof,
                "lower_roof": "arithmetic" if roof < 1 else "memory",
                "of_lower_roof": d.fraction / min(roof, 1.0),
                "reachable": min(roof, 1.0) >= goal,
            }
        )
    return rows


def bound_table(rows: list[dict]) -> str:
    lines = [f"{'format':<12}{'path':<10}{'DRAM ÷ STREAM':>15}{'in cache ÷ STREAM':>19}  lower roof   of it"]
    for r in rows:
        lines.append(
            f"{r['format']:<12}{r['path']:<10}{r['dram_fraction']:>15.0%}{r['cache_fraction']:>19.0%}  "
            f"{r['lower_roof']:<12}{r['of_lower_roof']:>5.0%}"
        )
    return "\n".join(lines)


def best_by_format(rows: list[RoofRow], n_rows: int = 1) -> dict[str, RoofRow]:
    """Per format family (fp32 / int8 / int4), the fastest path at ``n_rows`` rows."""
    best: dict[str, RoofRow] = {}
    for r in rows:
        fam = r.format.split()[0]
        if r.rows == n_rows and (fam not in best or r.fraction > best[fam].fraction):
            best[fam] = r
    return best


def roof_verdicts(rows: list[RoofRow], goal: float = GOAL, n_rows: int = 1) -> dict:
    """One ``claim`` per format family: its fastest path reads its weight at >= ``goal`` of STREAM."""
    return {
        fam: claim(
            f"{fam} GEMV ({r.rows} row, {r.path}) reads its weight at >= {goal:.0%} of STREAM",
            r.fraction,
            at_least=goal,
            why_not="the kernel does not keep enough loads in flight, or other jobs share the memory bus",
            spread=r.spread,
        )
        for fam, r in best_by_format(rows, n_rows).items()
    }


def table(rows: list[RoofRow]) -> str:
    """One line per row: its median GB/s, the STREAM it was read against (the median of its paired triad
    passes, or the one figure given), the fraction (paired: the median of the pairs' ratios) and the spread."""
    head = (
        f"{'format':<12}{'path':<22}{'rows':>5}{'MB':>8}{'copies':>7}{'GB/s':>8}{'STREAM':>8}{'of STREAM':>11}{'±':>6}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.format:<12}{r.path:<22}{r.rows:>5}{r.weight_bytes / 1e6:>8.1f}{r.copies:>7}{r.gbps:>8.1f}"
            f"{r.stream_gbps:>8.1f}{r.fraction:>11.0%}{r.spread:>6.0%}"
        )
    return "\n".join(lines)


@torch.inference_mode()
def bf16_activation_error(out_features: int = 1024, in_features: int = 1024, rows: int = 1, seed: int = 0) -> dict:
    """Relative max error of each quantized layer's CPU path against its fp32 reference (the same
    dequantized weight, fp32 activations): what rounding the activations costs (none in the course's
    kernels, ``int8``/``int4``, but their fp16 scales for int4; bf16 in torch's, ``int8 bf16``/``int4
    bf16``; int8 per block of 32 in ``int4-q8``, per row in ``int8-dyn``). Random Gaussian activations: real ones have outliers, which
    cost int8 rounding more."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen) * 0.02
    x = torch.randn(rows, in_features, generator=gen)
    errs = {}
    layers = {fmt: _make(fmt, w) for fmt in available_formats(tuple(PATH_OF))}
    for fmt, lay in layers.items():
        ref = lay.reference(x)
        errs[fmt] = ((lay(x) - ref).abs().max() / ref.abs().max()).item()
    return errs


def bandwidth_bars(items, stream_gbps: float, goal: float = GOAL, ax=None):
    """Horizontal bars of achieved GB/s (``items``: (label, GB/s) pairs) against the STREAM roof and
    ``goal`` × STREAM: the decode roofline's bandwidth axis, one bar per kernel or engine."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.35 * len(items) + 1.2))
    labels = [lab for lab, _ in items]
    ax.barh(range(len(items)), [v for _, v in items], color="tab:blue")
    ax.set_yticks(range(len(items)), labels)
    ax.invert_yaxis()
    ax.axvline(stream_gbps, color="k", label=f"STREAM triad {stream_gbps:.1f} GB/s")
    ax.axvline(goal * stream_gbps, color="tab:red", ls="--", label=f"goal: {goal:.0%} of STREAM")
    ax.set_xlabel("weight bytes read per second (GB/s)")
    ax.legend(loc="lower right", fontsize=8)
    return ax


__all__ = [
    "BYTES_PER_WEIGHT",
    "CONFIGS",
    "FORMATS",
    "GOAL",
    "RoofRow",
    "bandwidth_bars",
    "best_by_format",
    "bf16_activation_error",
    "gemv_roof",
    "roof_verdicts",
    "table",
    "triad_sampler",
]
