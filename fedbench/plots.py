"""Pictures written next to a run's metrics (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def heatmap(matrix, path: str | Path, title: str, xlabel: str, ylabel: str, cmap: str = "viridis",
            annotate: bool | None = None, vmin=None, vmax=None) -> Path:
    """Draw ``matrix`` as a heatmap PNG; small matrices get their values written in the cells."""
    m = np.asarray(matrix, dtype=float)
    h, w = m.shape
    fig, ax = plt.subplots(figsize=(min(14, 1.5 + 0.45 * w), min(12, 1.2 + 0.35 * h)))
    im = ax.imshow(m, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    fig.colorbar(im, ax=ax)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if annotate if annotate is not None else (h * w <= 400):
        for i in range(h):
            for j in range(w):
                v = m[i, j]
                ax.text(j, i, f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if im.norm(v) < 0.5 else "black")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
