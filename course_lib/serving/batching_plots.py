"""Figures for chapter 06's batching sections: measured continuous ÷ static gains beside the trace's step
bound (``step_bound``), so a reader sees how much of the possible gain a machine's step cost let through;
``plot_bars``, labelled bars for the results that were tables only. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import matplotlib.pyplot as plt


def plot_gain_vs_bound(rows, ax=None, title: str | None = None):
    """Bars of measured gains with each trace's bound as a dashed line above its bars. ``rows``: dicts with
    ``group`` (the trace and machine), ``label`` (real, simulated, stored), ``gain`` and ``bound``."""
    rows = list(rows)
    if not rows or any({"group", "label", "gain", "bound"} - set(r) for r in rows):
        raise ValueError("rows must be a non-empty list of dicts with group, label, gain and bound")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.4), dpi=80)
    groups = list(dict.fromkeys(r["group"] for r in rows))
    x = 0.0
    for gi, g in enumerate(groups):
        mine = [r for r in rows if r["group"] == g]
        xs = [x + i for i in range(len(mine))]
        for xi, r in zip(xs, mine):
            ax.bar(
                xi,
                r["gain"],
                color=f"C{['real', 'simulated', 'stored'].index(r['label']) if r['label'] in ('real', 'simulated', 'stored') else 3}",
            )
            ax.text(xi, r["gain"], f"{r['gain']:.2f}×", ha="center", va="bottom", fontsize=8)
        bound = mine[0]["bound"]
        ax.hlines(bound, xs[0] - 0.45, xs[-1] + 0.45, colors="k", linestyles="--")
        ax.text(xs[-1] + 0.5, bound, f"step bound {bound:.2f}×", va="center", fontsize=8)
        x = xs[-1] + 2.5
    ticks = [r for g in groups for r in rows if r["group"] == g]
    pos, cur = [], 0.0
    for g in groups:
        n = sum(r["group"] == g for r in rows)
        pos += [cur + i for i in range(n)]
        cur += n - 1 + 2.5
    ax.set_xticks(pos, [f"{r['label']}\n{r['group']}" for r in ticks], fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("continuous ÷ static throughput (×)")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=f"C{i}", label=lab) for i, lab in enumerate(("real", "simulated", "stored"))]
    handles.append(Line2D([], [], color="k", ls="--", label="the trace's bound: static ÷ continuous decode steps"))
    ax.legend(handles=handles, fontsize=7, loc="upper left")
    ax.set_title(title or "Continuous batching's gain against the most its trace allows")
    ax.set_xlim(-0.7, cur - 1.0)
    return ax


def plot_bars(values: dict, ylabel: str, title: str, ax=None, fmt: str = "{:.3g}", spread: dict | None = None):
    """One labelled bar per entry of ``values`` ({name: number}), its value written on top; ``spread``
    ({name: relative spread}) draws each bar's run-to-run spread as an error bar. For the chapter's results
    that were tables only (prefix caching, preemption, server overhead, padding)."""
    if not values or not all(isinstance(v, (int, float)) for v in values.values()):
        raise ValueError("values must be a non-empty {name: number} dict")
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.0), dpi=80)
    names = list(values)
    ys = [float(values[n]) for n in names]
    err = [ys[i] * spread.get(n, 0.0) for i, n in enumerate(names)] if spread else None
    ax.bar(range(len(names)), ys, color=[f"C{i}" for i in range(len(names))], yerr=err, capsize=4 if err else 0)
    for i, y in enumerate(ys):
        ax.text(i, y, fmt.format(y), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.title.set_fontsize(9)
    return ax
