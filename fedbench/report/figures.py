"""Report pictures (matplotlib, imported lazily): accuracy-vs-round curves and metric vs a numeric key."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .runs import _number, canon
from .tables import DERIVED, Report, Table, _is_num, _slug


# ---- plots -------------------------------------------------------------------------------------------------------

def _plt():
    from .. import plots  # noqa: F401  (selects the Agg backend)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _curve_metric(t: Table, path: str) -> str:
    """The per-round metric behind a column: ``pers/acc`` for ``pers/acc.best``, ``global/acc`` for ``global/acc@10``."""
    if path in DERIVED:
        return t.target.get("metric", "global/acc")
    return path.split("@")[0] if "@" in path else path.rsplit(".", 1)[0] if "." in path else path


def curve_metrics(rep: Report) -> list[str]:
    """The per-round metrics behind the table's columns that the runs logged at two rounds or more."""
    names = []
    for path in rep.table.metrics.values():
        name = _curve_metric(rep.table, path)
        if name not in names and any(r.series(name)[1:2] for r, _ in rep.members if r.status == "complete"):
            names.append(name)
    return names


def plot_curves(rep: Report, out: Path, band: str = "minmax") -> list[Path]:
    """Per method, accuracy vs round: the mean over seeds and a band (min–max or ± std); one panel per column value
    (or per merged config's column), complete runs only."""
    plt, t, pngs = _plt(), rep.table, []
    for metric in curve_metrics(rep):
        panels = [c for c in rep.columns if t.cols or (t.merged and _curve_metric(t, t.metrics[c.metric]) == metric)]
        n = max(1, len(panels))
        scale = 100.0 if t.spec.get("percent") and "acc" in metric else 1.0
        fig, axes = plt.subplots(math.ceil(n / 3), min(n, 3), figsize=(5.2 * min(n, 3), 3.6 * math.ceil(n / 3)),
                                 squeeze=False)
        for ax, col in zip(axes.flat, panels or [None]):
            for i, row in enumerate(rep.row_keys):
                runs = [r for r, _ in rep._runs(row, col or rep.columns[0])    # a tuned row: its best grid value's runs
                        if r.status == "complete" and canon(r.key(t.rows)) == row]
                series = [dict(r.series(metric)) for r in runs]
                common = sorted(set.intersection(*(set(s) for s in series))) if series else []
                if len(common) < 2:
                    continue
                y = scale * np.array([[s[x] for x in common] for s in series])
                mean = y.mean(0)
                lo, hi = (y.min(0), y.max(0)) if band == "minmax" else (mean - y.std(0), mean + y.std(0))
                color = f"C{i % 10}"
                ax.plot(common, mean, color=color, label=f"{rep.row_names[row]} (n={len(runs)})")
                if len(runs) > 1:
                    ax.fill_between(common, lo, hi, color=color, alpha=0.2, linewidth=0)
            ax.set_title(col.header if col else metric, fontsize=9)
            ax.set_xlabel("round")
            ax.set_ylabel(metric + (" (%)" if scale == 100 else ""))
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.suptitle(f"{t.title}\nmean over seeds, band = {'min–max' if band == 'minmax' else '± std'}", fontsize=9)
        pngs.append(_save(fig, out / f"{t.stem}_curves_{_slug(metric)}.png"))
    return pngs


def plot_vs_keys(rep: Report, out: Path) -> list[Path]:
    """Metric vs a numeric row/column key, one line per other key, the paper's numbers dashed (δ, α, IF, ...)."""
    plt, t, pngs = _plt(), rep.table, []
    numeric_rows = len(rep.row_keys) > 1 and all(_is_num(k) for k in rep.row_keys)
    numeric_cols = len(rep.columns) > 1 and all(_is_num(c.key) for c in rep.columns)
    if numeric_cols:   # x = column value, one line per row (accuracy vs α per method, vs IF per expert count)
        xlabel = t.cols.split(":")[-1].split(".")[-1] if t.cols else "column"   # cols null: numeric metric names
        ylabel = rep.columns[0].metric if t.cols else "value"
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [float(c.key) for c in rep.columns]
        for i, row in enumerate(rep.row_keys):
            name = f"{rep.row_title()}={rep.row_names[row]}" if _is_num(row) and row not in t.labels else rep.row_names[row]
            _line(ax, xs, [rep.cells[(row, c.key)] for c in rep.columns], [rep.paper(row, c) for c in rep.columns],
                  f"C{i % 10}", name)
        _axes(ax, xs, xlabel, ylabel + (" (%)" if all(t.percent(c.metric) for c in rep.columns) else ""))
        ax.set_title(t.title, fontsize=9)
        pngs.append(_save(fig, out / f"{t.stem}_vs_{_slug(xlabel)}.png"))
    if numeric_rows:   # x = row value; one line per column (cols set) or one panel per kind of metric (δ table)
        xs = [float(k) for k in rep.row_keys]
        xlabel = rep.row_title()
        if t.cols:
            groups = [(rep.columns[0].metric, rep.columns)]
        else:
            acc = [c for c in rep.columns if t.percent(c.metric) or "acc" in t.metrics[c.metric]]
            groups = ([("accuracy", acc)] if acc else []) + [(c.metric, [c]) for c in rep.columns if c not in acc]
        fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.8), squeeze=False)
        for ax, (name, cols) in zip(axes.flat, groups):
            for i, c in enumerate(cols):
                _line(ax, xs, [rep.cells[(r, c.key)] for r in rep.row_keys], [rep.paper(r, c) for r in rep.row_keys],
                      f"C{i % 10}", c.header)
            _axes(ax, xs, xlabel, name + (" (%)" if any(t.percent(c.metric) for c in cols) else ""))
        fig.suptitle(t.title, fontsize=9)
        pngs.append(_save(fig, out / f"{t.stem}_vs_{_slug(xlabel)}.png"))
    return pngs


def _line(ax, xs, cells, papers, color, label):
    pts = [(x, c.mean, c.std) for x, c in zip(xs, cells) if c.mean is not None]
    if pts:
        x, m, s = zip(*pts)
        ax.errorbar(x, m, yerr=s, color=color, marker="o", capsize=3, label=f"{label} (ours)")
    ref = [(x, float(p)) for x, p in zip(xs, papers) if _number(p) is not None]
    if ref:
        x, p = zip(*ref)
        ax.plot(x, p, color=color, linestyle="--", marker="o", markerfacecolor="none", alpha=0.8, label=f"{label} (paper)")


def _axes(ax, xs, xlabel, ylabel):
    if min(xs) > 0 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([canon(x) for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
