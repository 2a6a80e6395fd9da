"""Chapter 05's figures and text tables: cache on vs off, decode time per KV-head count, uptraining.

Each function takes what a measurement returned (``on_off.KvOnOff``, ``heads_timing.KVHeadsRow`` rows,
``uptraining.uptrain``'s log) and draws it on the given axes or new ones; nothing here measures.
``finish_log_axes`` is the look the log-scaled plots share (the explorer's too). Introduced in
05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from course_lib.kv.on_off import KvOnOff

if TYPE_CHECKING:
    from course_lib.kv.heads_timing import KVHeadsRow


def finish_log_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    """A log y axis, labels, a light grid and a small legend top left, then ``tight_layout``."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left")
    ax.figure.tight_layout()


def plot_kv_on_off(result: KvOnOff, *, ax=None):
    """Total time to reach each length, with and without the cache: measured points and the predicted curves
    (``fixed_s + FLOPs / flop_rate`` per step, constants from separate no-cache steps), on log-log axes where
    the no-cache line's slope of ~2 against the cached one's ~1 is the L² vs L of the FLOP model."""
    from course_lib.measure.plots import new_axes

    if not isinstance(result, KvOnOff):
        raise ValueError(f"result must be the KvOnOff that kv_on_off returns, got {type(result).__name__}")
    fig, ax = new_axes(ax)
    p, last = result.prompt_len, result.rows[-1].length
    xs = np.unique(np.geomspace(p + 1, last, 60).round().astype(int))
    curves = np.array([result.predicted_totals(int(x)) for x in xs])  # (len(xs), 2)
    lengths = [r.length for r in result.rows]
    for col, kv, marker, label in ((0, True, "o", "KV cache"), (1, False, "s", "no cache (recompute)")):
        (line,) = ax.plot(xs, curves[:, col], "--", lw=1.2, label=f"{label}: predicted")
        measured = [r.cached_total_s if kv else r.nocache_total_s for r in result.rows]
        ax.plot(lengths, measured, marker, ms=7, color=line.get_color(), label=f"{label}: measured", zorder=6)
    ax.set_xscale("log")
    finish_log_axes(
        ax,
        "sequence length L (tokens, prompt included)",
        "time to generate up to L (s)",
        f"{result.engine}: KV cache on vs off (batch 1, {result.device})",
    )
    return fig, ax


def format_kv_rows(rows: list[KVHeadsRow]) -> str:
    """A text table: prediction before measurement, as every chapter prints them."""
    head = (
        f"{'attention':>9} {'kv heads':>8} {'context':>7} {'KV/token':>9} {'KV MiB':>8} {'weights MiB':>11} "
        f"{'predicted ms':>12} {'compute ms':>10} {'measured ms':>11} {'of bw':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.attention:>9} {r.num_kv_heads:>8} {r.context:>7} {r.kv_bytes_per_token / 1024:>7.1f}Ki "
            f"{r.kv_bytes_used / 2**20:>8.1f} {r.weight_bytes / 2**20:>11.1f} {r.predicted_ms:>12.2f} "
            f"{r.compute_ms:>10.2f} "
            f"{r.measured_ms:>11.2f} {r.efficiency:>6.0%}"
        )
    return "\n".join(lines)


def plot_kv_heads(rows: list[KVHeadsRow], ax=None):
    """Decode step time vs context, one colour per attention kind: measured (solid, IQR band) beside the
    bandwidth prediction (dashed). With a single context, grouped bars instead. Returns the axes."""
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("rows must be a non-empty list of KVHeadsRow (from kv_heads_rows)")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    kinds = list(dict.fromkeys(r.attention for r in rows))
    contexts = sorted({r.context for r in rows})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(contexts) == 1:
        width = 0.38
        for i, kind in enumerate(kinds):
            r = next(r for r in rows if r.attention == kind)
            ax.bar(i - width / 2, r.predicted_ms, width, color=colours[i % len(colours)], alpha=0.35, hatch="//")
            ax.bar(i + width / 2, r.measured_ms, width, color=colours[i % len(colours)], yerr=r.iqr_ms / 2)
        ax.set_xticks(
            range(len(kinds)), [f"{k}\n({next(r for r in rows if r.attention == k).num_kv_heads} KV)" for k in kinds]
        )
        ax.bar(0, 0, color="grey", alpha=0.35, hatch="//", label="predicted (bytes / bandwidth)")
        ax.bar(0, 0, color="grey", label="measured (median)")
        ax.set_title(f"decode step, batch {rows[0].batch}, context {contexts[0]}")
    else:
        for i, kind in enumerate(kinds):
            mine = sorted((r for r in rows if r.attention == kind), key=lambda r: r.context)
            x = [r.context for r in mine]
            c = colours[i % len(colours)]
            ax.plot(x, [r.measured_ms for r in mine], "o-", color=c, label=f"{kind} measured")
            ax.fill_between(
                x,
                [r.measured_ms - r.iqr_ms / 2 for r in mine],
                [r.measured_ms + r.iqr_ms / 2 for r in mine],
                color=c,
                alpha=0.15,
            )
            ax.plot(x, [r.predicted_ms for r in mine], "--", color=c, label=f"{kind} predicted")
        ax.set_xlabel("context (tokens per sequence)")
        ax.set_title(f"decode step time vs context, batch {rows[0].batch}")
    ax.set_ylabel("ms per decode step")
    ax.legend(fontsize=8)
    return ax


def plot_uptrain(log: dict, ax=None, original_ppl: float | None = None):
    """Training loss per step (left axis) and validation perplexity at the evaluations (right axis), with the
    original model's perplexity as a dotted line when given. ``log``: ``uptrain``'s result or a train_log.json."""
    import matplotlib.pyplot as plt

    if not isinstance(log, dict) or "train_loss" not in log or "log" not in log:
        raise ValueError("log must be uptrain()'s result (or a train_log.json) with 'train_loss' and 'log'")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    loss = log["train_loss"]
    ax.plot(range(1, len(loss) + 1), loss, color="C0", alpha=0.6, label="train loss (per step)")
    ax.set_xlabel("uptraining step")
    ax.set_ylabel("train loss", color="C0")
    right = ax.twinx()
    steps = [r["step"] for r in log["log"]]
    ppl = [r["val"]["perplexity"] for r in log["log"]]
    right.plot(steps, ppl, "o-", color="C3", label="val perplexity")
    if original_ppl is not None:
        right.axhline(
            original_ppl, color="k", ls="--", lw=1.5, label=f"original model, 2 KV heads ({original_ppl:.2f})"
        )
        lo, hi = min([*ppl, original_ppl]), max([*ppl, original_ppl])
        pad = 0.08 * (hi - lo or 1.0)
        right.set_ylim(lo - pad, hi + pad)  # the reference line inside the frame, not on it
    right.set_ylabel("validation perplexity", color="C3")
    ax.set_title("Uptraining the pooled MQA model moves its perplexity back toward the original's")
    lines = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + right.get_legend_handles_labels()[1]
    ax.legend(lines, labels, fontsize=8, loc="upper right")
    return ax
