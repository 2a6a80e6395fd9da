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
costs against the fp32 reference. ``achieved_bandwidth`` turns recorded tokens/s (the engine and
llama.cpp, ``data/measurements/smollm2-vs-llamacpp-cpu.json``) into bytes/s on the same roof.
Introduced in 02_metrics_2_throughput_utilization.ipynb (issue 21).
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

    @property
    def seconds(self) -> float:
        s = sorted(self.samples)
        return s[len(s) // 2]

    @property
    def gbps(self) -> float:
        return self.weight_bytes / self.seconds / 1e9

    @property
    def fraction(self) -> float:
        """GB/s of weight read ÷ STREAM GB/s."""
        return self.gbps / self.stream_gbps

    @property
    def best_gbps(self) -> float:
        """GB/s of the fastest sample: a roof is the best a kernel does, not its typical call."""
        return self.weight_bytes / min(self.samples) / 1e9

    @property
    def spread(self) -> float:
        return relative_spread(self.samples) if len(self.samples) > 1 else 0.0


def _check_int(name, v, low=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{name} must be an int >= {low}, got {v!r}")


def _check_stream(stream_gbps) -> None:
    if not (isinstance(stream_gbps, (int, float)) and stream_gbps > 0):
        raise ValueError(f"stream_gbps must be a positive number (GB/s), got {stream_gbps!r}")


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
) -> list[RoofRow]:
    """Time ``rows`` × (out, in) through each format of ``formats`` (see ``FORMATS``) with the current
    torch threads; each sample is one pass over enough copies to read ``working_set`` bytes. ``formats``
    None: every format that can run here (``available_formats``)."""
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
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for lay in layers:
                    lay(x)
                samples.append((time.perf_counter() - t0) / len(layers))
            out.append(RoofRow(fmt, _path(layer, fmt), r, nbytes, tuple(samples), len(layers), float(stream_gbps)))
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
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                layer(x)
            samples.append((time.perf_counter() - t0) / calls)
        out.append(RoofRow(fmt, _path(layer, fmt), 1, _nbytes(layer), tuple(samples), 1, float(stream_gbps)))
    return out


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
        roof = c.best_gbps
        lower = "arithmetic" if roof < c.stream_gbps else "memory"
        rows.append(
            {
                "format": c.format,
                "path": c.path,
                "dram_fraction": d.fraction,
                "cache_fraction": roof / c.stream_gbps,
                "lower_roof": lower,
                "of_lower_roof": d.gbps / min(roof, d.stream_gbps),
                "reachable": min(roof / c.stream_gbps, 1.0) >= goal,
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
    lines = [f"{'format':<12}{'path':<22}{'rows':>5}{'MB':>8}{'copies':>7}{'GB/s':>8}{'of STREAM':>11}{'±':>6}"]
    for r in rows:
        lines.append(
            f"{r.format:<12}{r.path:<22}{r.rows:>5}{r.weight_bytes / 1e6:>8.1f}{r.copies:>7}{r.gbps:>8.1f}"
            f"{r.fraction:>11.0%}{r.spread:>6.0%}"
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


def decode_bytes_per_token(shape, fmt: str, head: str | None = None) -> float:
    """Weight bytes a batch-1 decode step reads in ``fmt`` (``BYTES_PER_WEIGHT``): every matmul weight in
    that format, the LM head in ``head`` (default: the same), norms and embedding rows ignored."""
    from course_lib.models.accounting import matmul_params

    if fmt not in BYTES_PER_WEIGHT or (head is not None and head not in BYTES_PER_WEIGHT):
        raise ValueError(f"fmt and head must be among {tuple(BYTES_PER_WEIGHT)}, got {fmt!r}, {head!r}")
    head_params = shape.vocab_size * shape.hidden_size
    body = matmul_params(shape) - head_params
    return body * BYTES_PER_WEIGHT[fmt] + head_params * BYTES_PER_WEIGHT[head or fmt]


# the recorded comparison's formats: (engine layers, engine head, llama.cpp file's layers)
RECORDED_FORMATS = {
    "fp32": ("fp32", "fp32", "fp32"),
    "int8": ("int8", "int8", "q8_0"),
    "int8-dyn": ("int8", "int8", "q8_0"),  # the same bytes: int8 weights, activations rounded to int8 per call
    "int4": ("int4", "int8", "q4_1"),
    "int4-q8": ("int4", "int8", "q4_1"),  # the same bytes: activations rounded to int8 per 32 (gemv-q8)
}


def achieved_bandwidth(record: dict, shape, stream_gbps: float | None = None) -> list[dict]:
    """Per row of a ``benchmarks/vs_llamacpp.py`` record: decode tok/s × bytes per token = GB/s for the
    engine and llama.cpp, and each as a fraction of the STREAM triad the record measured in its run
    (``meta["stream_gbps"]``), or of ``stream_gbps`` for a record without one (then say whose roof it is).
    llama.cpp's head is counted in the file's layer format (an approximation: its output tensor type may
    differ). Each row carries the roof it was divided by (``stream_gbps``)."""
    if not isinstance(record, dict) or "rows" not in record:
        raise ValueError("record must be the JSON of benchmarks/vs_llamacpp.py (a dict with 'rows')")
    stream_gbps = record.get("meta", {}).get("stream_gbps") or stream_gbps
    if stream_gbps is None:
        raise ValueError("the record has no meta['stream_gbps']: pass stream_gbps (GB/s), and say whose roof it is")
    _check_stream(stream_gbps)
    out = []
    for row in record["rows"]:
        fmt = row["format"]
        if fmt not in RECORDED_FORMATS:
            raise ValueError(f"unknown format {fmt!r} in the record; expected one of {tuple(RECORDED_FORMATS)}")
        layers, head, peer = RECORDED_FORMATS[fmt]
        e_bytes, l_bytes = decode_bytes_per_token(shape, layers, head), decode_bytes_per_token(shape, peer)
        e_gbps, l_gbps = row["engine_tok_s"] * e_bytes / 1e9, row["llama_tok_s"] * l_bytes / 1e9
        out.append(
            dict(
                format=fmt,
                engine_gbps=e_gbps,
                llama_gbps=l_gbps,
                engine_fraction=e_gbps / stream_gbps,
                llama_fraction=l_gbps / stream_gbps,
                # the record's own ratio: the median of its rounds' paired ratios (the ledger's number), which
                # a ratio of the two sides' median tok/s can differ from when the machine's speed drifted
                ratio=row.get("ratio", row["engine_tok_s"] / row["llama_tok_s"]),
                ratio_range=row.get("ratio_range"),
                goal=row.get("goal"),
                stream_gbps=stream_gbps,
            )
        )
    return out


def recorded_llamacpp(path=None) -> dict:
    """The recorded engine-vs-llama.cpp run (``benchmarks/vs_llamacpp.py --json``), ``meta`` and ``rows``."""
    import json
    from pathlib import Path

    from course_lib.core.paths import data_dir

    p = Path(path) if path is not None else data_dir() / "measurements" / "smollm2-vs-llamacpp-cpu.json"
    if not p.is_file():
        raise FileNotFoundError(
            f"no recorded llama.cpp comparison at {p}; make it with python benchmarks/vs_llamacpp.py --json {p}"
        )
    return json.loads(p.read_text())


def peer_verdicts(rows: list[dict]) -> dict:
    """One ``claim`` per format of ``achieved_bandwidth``'s rows: engine ÷ llama.cpp >= the issue's goal."""
    return {
        r["format"]: claim(
            f"{r['format']} decode: engine ÷ llama.cpp >= {r['goal']:g}x",
            r["ratio"],
            at_least=r["goal"],
            why_not="the engine's per-op dispatch and its GEMVs below the roof (the table above) cost the difference",
            where="in the recorded run",
        )
        for r in rows
        if r.get("goal") is not None
    }


__all__ = [
    "BYTES_PER_WEIGHT",
    "CONFIGS",
    "FORMATS",
    "GOAL",
    "RoofRow",
    "achieved_bandwidth",
    "bandwidth_bars",
    "best_by_format",
    "bf16_activation_error",
    "decode_bytes_per_token",
    "gemv_roof",
    "peer_table",
    "peer_verdicts",
    "recorded_llamacpp",
    "roof_verdicts",
    "table",
]


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


def peer_table(rows: list[dict]) -> str:
    """``achieved_bandwidth``'s rows as a table: GB/s and fraction of STREAM for both sides, the ratio."""
    head = (
        f"{'format':<8}{'engine GB/s':>12}{'of STREAM':>10}{'llama.cpp GB/s':>16}{'of STREAM':>10}{'ratio':>7}"
        f"{'(rounds)':>13}{'goal':>6}"
    )
    lines = [head]
    for r in rows:
        rng = r.get("ratio_range")
        rounds = f"{rng[0]:.2f}-{rng[1]:.2f}" if rng else "-"
        lines.append(
            f"{r['format']:<8}{r['engine_gbps']:>12.1f}{r['engine_fraction']:>10.0%}{r['llama_gbps']:>16.1f}"
            f"{r['llama_fraction']:>10.0%}{r['ratio']:>7.2f}{rounds:>13}{r['goal'] if r['goal'] is not None else '-':>6}"
        )
    return "\n".join(lines)
