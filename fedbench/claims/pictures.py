"""The claims page's pictures, one per claim and scale: fedbench's values against the paper's (bars, or a line over the
swept value), with a failing claim's gap round by round beside it (issue #31 item 5)."""

from __future__ import annotations

import math
from pathlib import Path
from textwrap import fill

import numpy as np

from ..report.tables import path_words
from .predicates import FAILS
from .results import ClaimResult
from .text import _finite, _key, _paper, _paper_cols


def picture_name(res: ClaimResult) -> str:
    return f"{res.claim.id}_{res.scale}.png"


def plot(res: ClaimResult, path: Path) -> Path | None:
    """:func:`figure`, saved (None when no run has a value)."""
    from ..report.figures import _save

    fig = figure(res)
    return _save(fig, path) if fig is not None else None


def gap_picture_name(res: ClaimResult) -> str:
    return f"{res.claim.id}_{res.scale}_gap.png"


def gaps(res: ClaimResult) -> dict:
    """A failing claim's diagnosis (issue #31 item 5): each of its failing tests ``a − b`` as the paired gap round by
    round — {test: {seed: [(round, a − b)]}} over the rounds both runs logged the claim's metric's series (``pers/acc``
    for ``pers/acc.best``). Empty when the claim does not fail or its metric has no per-round series."""
    out = {}
    for t in res.outcome.tests if res.outcome.verdict == FAILS else []:
        names = t.label.split(" − ")
        if t.verdict != FAILS or len(names) != 2:
            continue
        col = next((c for c in res.cols if (None if c is None else str(c)) == t.at), None)
        a, b = (res.series.get(n, {}).get(col, {}) for n in names)
        per = {}
        for seed in sorted(set(a) & set(b)):
            other = dict(b[seed])
            if pts := [(r, x - other[r]) for r, x in a[seed] if r in other]:
                per[seed] = pts
        if per:
            out[" − ".join(res.label(n) for n in names) + (f" at {_key(res)} = {t.at}" if t.at else "")] = per
    return out


def plot_gaps(res: ClaimResult, path: Path) -> Path | None:
    """:func:`gaps` drawn (None when there are none): every seed a thin line, their mean over the rounds all seeds
    logged a thick one, 0 dashed — whether the gap opened early or late, held, or closed."""
    from ..report.figures import _plt, _save, legend
    from .results import series_name

    found = gaps(res)
    if not found:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (label, per) in enumerate(found.items()):
        for pts in per.values():
            ax.plot([r for r, _ in pts], [g for _, g in pts], color=f"C{i}", alpha=0.35, linewidth=0.8)
        rounds = sorted(set.intersection(*({r for r, _ in pts} for pts in per.values())))
        mean = [float(np.mean([dict(pts)[r] for pts in per.values()])) for r in rounds]
        ax.plot(rounds, mean, color=f"C{i}", linewidth=2, label=f"{label} (mean of {len(per)} seeds; thin: each)")
    ax.axhline(0.0, color="0.3", linestyle="--", linewidth=0.8)
    ax.set_xlabel("round")
    name = series_name(res.claim.metric)
    ax.set_ylabel(f"gap in {path_words(name)}" + (f" ({res.unit} points)" if res.unit else ""))
    ax.set_title(fill(f"{res.claim.id} ({res.scale}): fails — the gap round by round", 90), fontsize=9)
    legend(ax)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def figure(res: ClaimResult):
    """Bars (mean ± std over seeds, each seed a dot) with the paper's numbers as black diamonds; for a trend or a
    range, our mean ± std over the swept value as a line and the paper's numbers as unconnected diamonds. Axes in
    words (``personalized accuracy, best round (%)``, ``CCP threshold δ``)."""
    from ..report.figures import _plt, legend

    if not any(res.cell(r, c) for r in res.rows for c in res.cols):
        return None
    plt, c = _plt(), res.claim
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    if c.predicate.kind in ("trend", "flat") and all(_isnum(col) for col in res.cols):
        _trend(ax, res)
    else:
        _bars(ax, res)
    ax.set_ylabel(path_words(c.metric) + (f" ({res.unit})" if res.unit else ""))
    ax.set_title(fill(f"{c.id} ({res.scale}): {res.outcome.verdict} — {c.predicate.text}", 90), fontsize=9)
    legend(ax)
    ax.grid(alpha=0.3)
    return fig


def _trend(ax, res: ClaimResult) -> None:
    c = res.claim
    terms = c.predicate.terms
    label = " − ".join(res.label(t) for t in terms)
    pts = [(float(col), v) for col in res.cols if (v := _finite(_expr(res, terms, col)))]
    ax.errorbar(
        [x for x, _ in pts],
        [np.mean(v) for _, v in pts],
        [np.std(v) for _, v in pts],
        marker="o",
        capsize=3,
        label=f"fedbench: {label} (mean ± std)",
    )
    for x, v in pts:
        ax.plot([x] * len(v), v, ".", color="0.3", markersize=4)
    paper = [(float(col), p) for col in _paper_cols(res) if (p := _paper_expr(res, terms, col)) is not None]
    if paper:  # the paper's values as points only: nothing is drawn between them
        ax.plot([x for x, _ in paper], [p for _, p in paper], "kD", linestyle="none", label=f"paper: {label}")
    xs = [x for x, _ in pts + paper]
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 50:  # (no point at all: a claim with no complete cell yet)
        ax.set_xscale("log")
    from ..report.figures import key_words

    ax.set_xlabel(key_words(c.over))


def _bars(ax, res: ClaimResult) -> None:
    rows, cols = res.rows, res.cols
    grouped = cols != [None]
    width = 0.8 / max(1, len(rows)) if grouped else 0.7
    for i, row in enumerate(rows):
        pos = np.arange(len(cols)) + (i - (len(rows) - 1) / 2) * width if grouped else np.array([float(i)])
        vals = [_finite(res.cell(row, col).values()) for col in cols]
        ax.bar(
            pos,
            [np.mean(v) if v else np.nan for v in vals],
            width * 0.9,
            yerr=[np.std(v) if v else 0 for v in vals],
            capsize=3,
            alpha=0.75,
            label=res.label(row),
            color=f"C{i}",
        )
        for p, v in zip(pos, vals):
            ax.plot([p] * len(v), v, ".", color="0.2", markersize=5)
        paper = [(p, v) for p, col in zip(pos, cols) if (v := _paper(res, row, col)) is not None]
        if paper:
            ax.plot(
                [p for p, _ in paper],
                [v for _, v in paper],
                "kD",
                linestyle="none",
                label="paper" if not any(_paper(res, r, col) is not None for r in rows[:i] for col in cols) else None,
            )
    if grouped:
        ax.set_xticks(np.arange(len(cols)))
        ax.set_xticklabels([f"{_key(res)}={col}" for col in cols])
    else:
        ax.set_xticks(np.arange(len(rows)))
        ax.set_xticklabels([res.label(r) for r in rows])
    ys = [v for r in rows for col in cols for v in _finite(res.cell(r, col).values())]
    ys += [v for r in rows for col in cols if (v := _paper(res, r, col)) is not None]
    if ys and min(ys) > 0:
        lo, hi = min(ys), max(ys)
        pad = 0.15 * (hi - lo) + 1.0
        ax.set_ylim(max(0.0, lo - pad), hi + pad)


def _isnum(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _expr(res: ClaimResult, terms: tuple, col) -> list:
    a = res.cell(terms[0], col)
    if len(terms) == 1:
        return list(a.values())
    b = res.cell(terms[1], col)
    return [a[s] - b[s] for s in a if s in b]


def _paper_expr(res: ClaimResult, terms: tuple, col):
    vals = [_paper(res, t, col) for t in terms]
    if any(v is None for v in vals):
        return None
    return vals[0] if len(vals) == 1 else vals[0] - vals[1]


__all__ = ["figure", "gap_picture_name", "gaps", "picture_name", "plot", "plot_gaps"]
