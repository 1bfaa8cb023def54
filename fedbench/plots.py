"""Pictures written next to a run's metrics and by the reports (matplotlib, no display needed).

One look for all of them: saved at ``DPI`` and at least ``MIN_WIDTH_PX`` wide, integer ticks on count axes (clients,
classes, rounds), cell labels that read on every cell colour."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .files import written

DPI = 150
VECTOR = ("pdf", "svg")  # formats a report may add beside each PNG (--pictures): vector, for papers and slides
ALSO: list[str] = []  # the ones asked for (set_formats); the PNG is always written, the pages embed it
MIN_WIDTH_PX = 1050  # >= 1000 px: readable when a page or a slide scales the picture down
MIN_WIDTH_IN = MIN_WIDTH_PX / DPI
_OFF: list[bool] = []  # the innermost `drawing(False)`: a run with logger.pictures=false writes no picture


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display), imported on first use: a run that draws nothing (its
    ``logger.pictures=false``) never pays the ~0.6 s import."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(ncols: int = 1, nrows: int = 1, width: float | None = None, height: float = 4.2, **kw):
    """``plt.subplots`` at least ``MIN_WIDTH_IN`` wide (``width`` per column, else shared evenly)."""
    w = max(MIN_WIDTH_IN, (width or 0) * ncols)
    return pyplot().subplots(nrows, ncols, figsize=(w, height * nrows), **kw)


def integer_ticks(ax, x: bool = True, y: bool = False) -> None:
    """Only whole-number ticks (rounds, clients, classes, steps)."""
    from matplotlib.ticker import MaxNLocator

    if x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if y:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def set_formats(text: str | None) -> None:
    """``--pictures pdf,svg``: every picture also in these formats (``png`` may be named too; it is always written)."""
    asked = [f.strip().lower() for f in (text or "").split(",") if f.strip()]
    bad = [f for f in asked if f not in ("png", *VECTOR)]
    if bad:
        raise ValueError(f"--pictures {text!r} — a comma list of png, {', '.join(VECTOR)}")
    ALSO[:] = [f for f in VECTOR if f in asked]


@contextmanager
def drawing(on: bool):
    """Within it, :func:`save` writes pictures only if ``on`` (a run's ``logger.pictures``): a sweep of short runs
    spends a good part of each run drawing them (partition, curves, client spread, diagnostics); the metrics, CSVs
    and matrices they show are written all the same."""
    _OFF.append(not on)
    try:
        yield
    finally:
        _OFF.pop()


def off() -> bool:
    """Inside ``drawing(False)``: a picture's maker may skip drawing the figure (:func:`save` would not write it)."""
    return bool(_OFF and _OFF[-1])


def save(fig, path: str | Path) -> Path | None:
    """Write ``fig`` as a PNG at ``DPI``, scaled up (aspect kept) to at least ``MIN_WIDTH_PX`` wide, and close it; also
    as each format of ``ALSO`` beside it (same name, its suffix). tight_layout makes room for what is outside the axes
    (a legend beside them, a wrapped title). Under ``drawing(False)``: closes ``fig``, writes nothing, returns None."""
    plt = pyplot()
    if off():
        plt.close(fig)
        return None
    w, h = fig.get_size_inches()
    if w < MIN_WIDTH_IN:
        fig.set_size_inches(MIN_WIDTH_IN, h * MIN_WIDTH_IN / w)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        for out in [path, *(path.with_suffix(f".{f}") for f in ALSO)]:
            with written(out):  # a full disk: one line naming the picture, the cut file removed
                fig.savefig(out, dpi=DPI)
    finally:
        plt.close(fig)
    return path


def text_colour(rgba) -> str:
    """Black on light cells, white on dark ones (relative luminance of the cell's colour, ITU-R BT.709)."""
    r, g, b = rgba[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


def heatmap_figure(
    matrix,
    title: str,
    xlabel: str,
    ylabel: str,
    cmap: str = "viridis",
    annotate: bool | None = None,
    vmin=None,
    vmax=None,
):
    """The figure of :func:`heatmap` (not saved): integer ticks on both axes (rows and columns are indices)."""
    m = np.asarray(matrix, dtype=float)
    h, w = m.shape
    fig, ax = pyplot().subplots(figsize=(max(MIN_WIDTH_IN, min(14, 1.5 + 0.45 * w)), max(3.5, min(12, 1.2 + 0.35 * h))))
    im = ax.imshow(m, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    fig.colorbar(im, ax=ax)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    integer_ticks(ax, x=True, y=True)
    if annotate if annotate is not None else (h * w <= 400):
        for i in range(h):
            for j in range(w):
                v = m[i, j]
                if not np.isfinite(v):
                    continue
                ax.text(
                    j,
                    i,
                    f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color=text_colour(im.cmap(im.norm(v))),
                )
    return fig


def heatmap(
    matrix,
    path: str | Path,
    title: str,
    xlabel: str,
    ylabel: str,
    cmap: str = "viridis",
    annotate: bool | None = None,
    vmin=None,
    vmax=None,
) -> Path | None:
    """Draw ``matrix`` as a heatmap PNG; small matrices get their values written in the cells (None: not drawn)."""
    if off():
        return None
    return save(heatmap_figure(matrix, title, xlabel, ylabel, cmap, annotate, vmin, vmax), path)


def client_spread_figure(best, best_round: int, last, last_round: int, sizes, title: str | None = None):
    """Per-client personalized accuracy (%) at the best round (by ``pers/acc``) and at the last round (one series when
    they are the same round): sorted from the worst client (left), and against the client's number of training samples
    (right) — or, when every client has as many (equal shards: one column of dots, issue #53), how many clients reach
    each accuracy (a histogram in 10 % bins)."""
    fig, (ranked, right) = figure(ncols=2, width=5.2)
    if title:
        fig.suptitle(title)
    series = [(f"best round ({best_round})", best, "o"), (f"last round ({last_round})", last, "x")]
    if best_round == last_round:
        series = [(f"best = last round ({last_round})", last, "o")]
    equal = len(set(np.asarray(sizes).tolist())) == 1
    for i, (label, acc, marker) in enumerate(series):
        acc = 100 * np.asarray(acc, dtype=float)
        rank = np.arange(1, len(acc) + 1)
        ranked.plot(rank, np.sort(acc), marker=marker, markersize=4, color=f"C{i}", label=label)
        if not equal:
            right.scatter(sizes, acc, marker=marker, s=22, color=f"C{i}", label=label)
    if equal:  # one bar per series in each 10 % bin, side by side
        accs = [100 * np.asarray(acc, dtype=float) for _, acc, _ in series]
        colors, labels = [f"C{i}" for i in range(len(series))], [label for label, _, _ in series]
        right.hist(accs, bins=np.linspace(0, 100, 11), color=colors, label=labels)
    ranked.set_title("per-client accuracy, sorted", fontsize=10)
    ranked.set_xlabel("client, sorted by accuracy (worst first)")
    ranked.set_ylabel("personalized accuracy (%)")
    if equal:
        right.set_title(
            f"clients by accuracy (each has {int(np.asarray(sizes).flat[0])} training samples)", fontsize=10
        )
        right.set_xlabel("personalized accuracy (%)")
        right.set_ylabel("clients")
        right.set_xticks(np.linspace(0, 100, 11))
    else:
        right.set_title("per-client accuracy vs the client's data size", fontsize=10)
        right.set_xlabel("training samples of the client")
        right.set_ylabel("personalized accuracy (%)")
    integer_ticks(ranked)
    integer_ticks(right, x=not equal, y=equal)  # (clients are counted in whole numbers)
    for ax in (ranked, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig
