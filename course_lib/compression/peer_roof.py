"""The recorded engine-vs-llama.cpp run on the bandwidth roof: decode tokens/s turned into bytes/s.

``benchmarks/vs_llamacpp.py`` records both sides' decode tokens/s on the same SmolLM2 weights, the paired
ratio and the STREAM triad of that run (``data/measurements/smollm2-vs-llamacpp-cpu.json``).
``achieved_bandwidth`` multiplies each side's tokens/s by the bytes one step reads in its format
(``decode_bytes_per_token``: Q8_0 stores 34 bytes per 32 weights, Q4_1 20) and divides by the record's own
STREAM, so a stored rate is read against the machine it ran on; ``peer_verdicts`` judges each format's
ratio against issue 21's goals. The GEMV kernels' own roof is ``compression.gemv_roof``. Introduced in
03_compression.ipynb (section 2).
"""

from __future__ import annotations

from course_lib.compression.gemv_roof import BYTES_PER_WEIGHT, _check_stream
from course_lib.measure.claims import claim


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


__all__ = [
    "RECORDED_FORMATS",
    "achieved_bandwidth",
    "decode_bytes_per_token",
    "peer_table",
    "peer_verdicts",
    "recorded_llamacpp",
]
