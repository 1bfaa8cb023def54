"""Report pictures (matplotlib, imported lazily): accuracy-vs-round curves and metric vs a numeric key.

Legends name the swept key (``δ=0.1``), axes and titles use words (``personalized accuracy``), the paper's numbers are
points (never joined: the paper gives no values between them), rounds get integer ticks (fedbench/plots.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from textwrap import fill

import numpy as np

from .grouping import DERIVED, Table
from .runs import _number, canon
from .tables import Report, _is_num
from .words import _slug, metric_words

# how a config key or a metric is written on a picture (anything else: as it is, "/" and "_" as spaces)
SYMBOLS = {
    "delta": "δ",
    "alpha": "α",
    "beta": "β",
    "gamma": "γ",
    "mu": "μ",
    "lam": "λ",
    "lambda": "λ",
    "tau": "τ",
    "mix_lambda": "λ",
}


# ---- plots -------------------------------------------------------------------------------------------------------


def _plt():
    import matplotlib.pyplot as plt

    from .. import plots  # noqa: F401  (selects the Agg backend)

    return plt


def _save(fig, path: Path) -> Path:
    """fedbench.plots.save (dpi, tight layout), for the claims' pictures too."""
    from ..plots import save

    return save(fig, path)


def key_name(key: str) -> str:
    """``algorithm.delta`` -> ``δ``, ``choice:model`` -> ``model``, ``participation`` -> ``participation``."""
    short = str(key).split(":")[-1].split(".")[-1]
    return SYMBOLS.get(short, short)


KEY_WORDS = {  # swept keys an axis names in words
    "algorithm.delta": "CCP threshold δ",
    "algorithm.beta": "anchor weight β",
    "partition.alpha": "Dirichlet α",
    "partition.s": "IID share s",
    "partition.imbalance_factor": "imbalance factor",
    "participation": "participation ratio",
    "local_epochs": "local epochs E",
    "clients": "number of clients",
}


def key_words(key: str) -> str:
    """An axis's swept key: ``algorithm.delta`` -> ``CCP threshold δ``; else :func:`key_name`."""
    return KEY_WORDS.get(key, key_name(key))


def _row_label(rep: Report, row: str) -> str:
    """A row in a legend: its label, or ``<key>=<value>`` when the rows are the values of a swept number (``δ=0.1``)."""
    if _is_num(row) and row not in rep.table.labels:
        return f"{key_name(rep.table.rows)}={rep.row_names[row]}"
    return rep.row_names[row]


def _col_label(rep: Report, col) -> str:
    t = rep.table
    if t.cols and _is_num(col.key) and col.key not in t.labels:
        return f"{key_name(t.cols)}={col.key}"
    return col.header


def _curve_metric(t: Table, path: str) -> str:
    """The per-round metric behind a column: ``pers/acc`` for ``pers/acc.best``, ``global/acc`` for
    ``global/acc@10``."""
    if path in DERIVED:
        return t.target.get("metric", "global/acc")
    return path.split("@")[0] if "@" in path else path.rsplit(".", 1)[0] if "." in path else path


def curve_metrics(rep: Report) -> list[str]:
    """The per-round metrics behind the table's columns that the runs logged at two rounds or more."""
    names = []
    for path in rep.table.metrics.values():
        if "@reach:" in path:  # --comm's MB column: its picture is plot_comm's
            continue
        name = _curve_metric(rep.table, path)
        if name not in names and any(r.series(name)[1:2] for r, _ in rep.members if r.status == "complete"):
            names.append(name)
    return names


def plot_curves(rep: Report, out: Path, band: str = "minmax") -> list[Path]:
    """Per method, accuracy vs round: the mean over seeds and a band (min–max or ± std); one panel per column value
    (or per merged config's column), complete runs only."""
    from ..plots import save

    return [save(fig, out / f"{rep.table.stem}_curves_{_slug(metric)}.png") for metric, fig in curve_figures(rep, band)]


def curve_figures(rep: Report, band: str = "minmax") -> list:
    """(metric, figure) of :func:`plot_curves`, not saved."""
    from ..plots import figure, integer_ticks

    t, figs = rep.table, []
    for metric in curve_metrics(rep):
        panels = [c for c in rep.columns if t.cols or (t.merged and _curve_metric(t, t.metrics[c.metric]) == metric)]
        n = max(1, len(panels))
        scale = 100.0 if t.spec.get("percent") and "acc" in metric else 1.0
        fig, axes = figure(min(n, 3), math.ceil(n / 3), width=5.2, height=3.8, squeeze=False)
        for ax, col in zip(axes.flat, panels or [None]):
            for i, row in enumerate(rep.row_keys):
                runs = [
                    r
                    for r, _ in rep._runs(row, col or rep.columns[0])  # a tuned row: its best grid value's runs
                    if r.status == "complete" and canon(r.key(t.rows)) == row
                ]
                series = [dict(r.series(metric)) for r in runs]
                common = sorted(set.intersection(*(set(s) for s in series))) if series else []
                if len(common) < 2:
                    continue
                y = scale * np.array([[s[x] for x in common] for s in series])
                mean = y.mean(0)
                lo, hi = (y.min(0), y.max(0)) if band == "minmax" else (mean - y.std(0), mean + y.std(0))
                color = f"C{i % 10}"
                ax.plot(common, mean, color=color, label=f"{_row_label(rep, row)} (n={len(runs)})")
                if len(runs) > 1:
                    ax.fill_between(common, lo, hi, color=color, alpha=0.2, linewidth=0)
            ax.set_title(_col_label(rep, col) if col else metric_words(metric), fontsize=9)
            ax.set_xlabel("round")
            integer_ticks(ax)
            ax.set_ylabel(metric_words(metric) + (" (%)" if scale == 100 else ""))
            ax.grid(alpha=0.3)
            if ax.lines:
                legend(ax)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.suptitle(f"{t.title}\nmean over seeds, band = {'min–max' if band == 'minmax' else '± std'}", fontsize=9)
        figs.append((metric, fig))
    return figs


def plot_comm(rep: Report, out: Path) -> list[Path]:
    """``--comm``: per method, the table's accuracy against the cumulative MB sent (up + down, docs/communication.md),
    the mean over seeds at the rounds every seed evaluated (round 0: 0 MB); one panel per column value. Nothing when
    no run logged ``comm/MB_cum`` (runs made before it existed)."""
    from ..plots import figure, save

    t = rep.table
    metric = next((m for m in curve_metrics(rep) if "acc" in m), None)
    if metric is None:
        return []
    panels = [c for c in rep.columns] if t.cols else [None]
    fig, axes = figure(min(len(panels), 3), math.ceil(len(panels) / 3), width=5.2, height=3.8, squeeze=False)
    scale = 100.0 if t.spec.get("percent") else 1.0
    for ax, col in zip(axes.flat, panels):
        for i, row in enumerate(rep.row_keys):
            runs = [
                r
                for r, _ in rep._runs(row, col or rep.columns[0])
                if r.status == "complete" and canon(r.key(t.rows)) == row
            ]
            pairs = [(dict(r.series(metric)), {0: 0.0, **dict(r.series("comm/MB_cum"))}) for r in runs]
            common = sorted(set.intersection(*(set(a) & set(b) for a, b in pairs))) if pairs else []
            if len(common) < 2:
                continue
            x = np.mean([[b[k] for k in common] for _, b in pairs], axis=0)
            y = scale * np.mean([[a[k] for k in common] for a, _ in pairs], axis=0)
            ax.plot(x, y, marker=".", color=f"C{i % 10}", label=f"{_row_label(rep, row)} (n={len(runs)})")
        ax.set_title(_col_label(rep, col) if col else metric_words(metric), fontsize=9)
        ax.set_xlabel("communication so far (MB, up + down)")
        ax.set_ylabel(metric_words(metric) + (" (%)" if scale == 100 else ""))
        ax.grid(alpha=0.3)
        if ax.lines:
            legend(ax)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if not any(ax.lines for ax in axes.flat):
        import matplotlib.pyplot as plt

        plt.close(fig)
        return []
    fig.suptitle(f"{t.title}\naccuracy against communication, mean over seeds", fontsize=9)
    return [save(fig, out / f"{t.stem}_comm.png")]


def plot_vs_keys(rep: Report, out: Path) -> list[Path]:
    """Metric vs a numeric row/column key, one line per other key, the paper's numbers as hollow points
    (δ, α, IF, ...)."""
    from ..plots import save

    return [save(fig, out / f"{rep.table.stem}_vs_{_slug(name)}.png") for name, fig in vs_key_figures(rep)]


def vs_key_figures(rep: Report) -> list:
    """(x key, figure) of :func:`plot_vs_keys`, not saved."""
    from ..plots import figure

    t, figs = rep.table, []
    numeric_rows = len(rep.row_keys) > 1 and all(_is_num(k) for k in rep.row_keys)
    numeric_cols = len(rep.columns) > 1 and all(_is_num(c.key) for c in rep.columns)
    if numeric_cols:  # x = column value, one line per row (accuracy vs α per method, vs IF per expert count)
        xkey, ylabel = (
            (t.cols.split(":")[-1].split(".")[-1], metric_words(rep.columns[0].metric)) if t.cols else _metric_axes(t)
        )  # cols null: the metrics' names are the numbers
        fig, ax = figure(width=7, height=4.2)
        xs = [float(c.key) for c in rep.columns]
        for i, row in enumerate(rep.row_keys):
            _line(
                ax,
                xs,
                [rep.cells[(row, c.key)] for c in rep.columns],
                [rep.paper(row, c) for c in rep.columns],
                f"C{i % 10}",
                _row_label(rep, row),
            )
        _axes(
            ax,
            xs,
            key_words(t.cols) if t.cols else xkey.replace("_", " "),
            ylabel + (" (%)" if all(t.percent(c.metric) for c in rep.columns) else ""),
        )
        ax.set_title(t.title, fontsize=9)
        figs.append((xkey, fig))
    if numeric_rows:  # x = row value; one line per column (cols set) or one panel per kind of metric (δ table)
        xs = [float(k) for k in rep.row_keys]
        if t.cols:
            groups = [(metric_words(rep.columns[0].metric), rep.columns)]
        else:
            acc = [c for c in rep.columns if t.percent(c.metric) or "acc" in t.metrics[c.metric]]
            groups = ([("accuracy", acc)] if acc else []) + [(c.metric, [c]) for c in rep.columns if c not in acc]
        fig, axes = figure(len(groups), width=5, height=3.8, squeeze=False)
        for ax, (name, cols) in zip(axes.flat, groups):
            for i, c in enumerate(cols):
                _line(
                    ax,
                    xs,
                    [rep.cells[(r, c.key)] for r in rep.row_keys],
                    [rep.paper(r, c) for r in rep.row_keys],
                    f"C{i % 10}",
                    _col_label(rep, c),
                )
            _axes(ax, xs, key_words(t.rows), name + (" (%)" if any(t.percent(c.metric) for c in cols) else ""))
            why = next((w for c in cols if rep.has_paper(c) and (w := rep.not_comparable(c))), None)
            if why:  # the report gives these no Δ (n/c): the picture says so beside the paper's points
                ax.set_title(fill(f"not comparable with the paper: {why}", 60), fontsize=8)
        fig.suptitle(t.title, fontsize=9)
        figs.append((rep.row_title(), fig))
    return figs


def _metric_axes(t: Table) -> tuple[str, str]:
    """x key and y label of a table whose columns are metrics named by numbers (``cols: null``): the table's own
    ``xlabel``/``ylabel``, else what the metrics are — CAFeMe Fig. 4's ``"5": newclients/step5_acc`` is the accuracy
    after 5 personalization steps."""
    paths = [str(p) for p in t.metrics.values()]
    steps = bool(paths) and all(re.fullmatch(r"newclients/step\d+_acc(\.\w+)?", p) for p in paths)
    return (
        t.spec.get("xlabel") or ("personalization_step" if steps else "column"),
        t.spec.get("ylabel") or ("new-client accuracy" if steps else "value"),
    )


def _line(ax, xs, cells, papers, color, label):
    pts = [(x, c.mean, c.std) for x, c in zip(xs, cells) if c.mean is not None]
    if pts:
        x, m, s = zip(*pts)
        ax.errorbar(x, m, yerr=s, color=color, marker="o", capsize=3, label=f"{label} (ours)")
    ref = [(x, float(p)) for x, p in zip(xs, papers) if _number(p) is not None]
    if ref:  # points only: a line would invent the values between the paper's numbers
        x, p = zip(*ref)
        ax.plot(
            x,
            p,
            color=color,
            linestyle="none",
            marker="D",
            markerfacecolor="none",
            markersize=7,
            label=f"{label} (paper)",
        )


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
        legend(ax)


def legend(ax) -> None:
    """In the axes when it is short; beside them when it has more than 6 entries (it would cover the data)."""
    if len(ax.get_legend_handles_labels()[0]) > 6:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=7)
