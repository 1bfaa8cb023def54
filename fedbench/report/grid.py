"""Best of a grid: a paper that tunes a method's hyperparameter over a grid and reports the method at its best value
(FedKA §5.1: "we choose the best μ in {0.1, 1, 5, 10} ... for MOON", "the best μ from {0.001, 0.01, 0.1, 1} for
FedProx", FedDyn's α, FedKA's β). The table node's ``tune:`` names, per row, the config key whose values form the
grid; a cell then shows only the runs of the grid value with the best mean (over seeds) of the selection metric.

    tune:
      by: global/acc.last      # selection metric (a table metric path; default: the table's first metric)
      mode: max                # max | min (e.g. rounds to a target)
      rows: {fedprox: algorithm.mu, moon: algorithm.mu, feddyn: algorithm.alpha, fedka: algorithm.beta}
      note: "FedKA §5.1: ..."  # printed with the table

The choice is made per cell of the table's columns (``cols``: e.g. per participation ratio), or once per row when
the columns are metrics (one value per method, as the paper reports one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .runs import canon


@dataclass
class GridChoice:
    key: str  # the grid's config key, e.g. algorithm.mu
    by: str  # the selection metric path
    scores: dict = field(default_factory=dict)  # grid value -> mean of ``by`` over its complete runs (None: no result)
    chosen: object = None  # the value whose runs the cell shows (None: no value has a result)

    @property
    def short(self) -> str:
        return self.key.split(".")[-1]

    def label(self) -> str:
        """``[mu=0.01 of 4]``: the chosen value and the grid's size."""
        return f"[{self.short}={self.chosen} of {len(self.scores)}]" if self.chosen is not None else ""

    def describe(self, scale: float = 1.0) -> str:
        """``mu ∈ {0.001, 0.01, 0.1, 1} → 0.01 (mean global/acc.last: 0.001 54.10, 0.01 55.50, ...)``."""
        shown = ", ".join(f"{v} {'—' if s is None else f'{scale * s:.2f}'}" for v, s in self.scores.items())
        grid = ", ".join(map(str, self.scores))
        return (
            f"{self.short} ∈ {{{grid}}} → {self.chosen if self.chosen is not None else 'none'} "
            f"(mean {self.by}: {shown})"
        )


def tune_spec(spec: dict) -> dict | None:
    """The table node's ``tune:`` as {by, mode, rows (canon row -> key), note}, or None."""
    t = spec.get("tune")
    if not isinstance(t, dict) or not t.get("rows"):
        return None
    mode = str(t.get("mode", "max"))
    if mode not in ("max", "min"):
        raise ValueError(f"table.tune.mode={mode!r} — max or min")
    return {
        "by": t.get("by"),
        "mode": mode,
        "rows": {canon(r): str(k) for r, k in t["rows"].items()},
        "note": t.get("note"),
    }


def choose(runs: list, key: str, by: str, score, mode: str = "max") -> GridChoice:
    """The grid value of ``key`` whose complete runs have the best mean ``score(run)`` (a float, or a reason why the run
    has none); ties keep the value met first. Grid values are the distinct values of ``key`` among ``runs``, in
    numeric order when they are numbers."""
    by_value: dict = {}
    for run in runs:
        by_value.setdefault(canon(run.key(key)), []).append(run)
    values = sorted(by_value, key=lambda v: (_num(v) is None, _num(v) or 0.0, str(v)))
    choice = GridChoice(key, by)
    best = None
    for v in values:
        pts = [score(r) for r in by_value[v] if r.status == "complete"]
        pts = [p for p in pts if isinstance(p, float)]
        choice.scores[v] = float(np.mean(pts)) if pts else None
        s = choice.scores[v]
        if s is not None and (best is None or (s > best if mode == "max" else s < best)):
            best, choice.chosen = s, v
    return choice


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


__all__ = ["GridChoice", "choose", "tune_spec"]
