"""One claim's result in words, as the claims page's cells and lines give it: the paper's numbers, fedbench's mean ±
sd over seeds, the verdict with the look that reached it, a wall time."""

from __future__ import annotations

import math

import numpy as np

from ..report.tables import fmt
from .predicates import NOT_RUN, Outcome
from .results import ClaimResult


def _num(x, digits: int) -> str:
    return fmt(x, digits) if x is not None else ""


def _key(res: ClaimResult) -> str:
    return res.claim.over.split(":")[-1].split(".")[-1]


def _paper_cols(res: ClaimResult) -> list:
    return list(dict.fromkeys(k for v in res.claim.paper.values() if isinstance(v, dict) for k in v))


def _paper(res: ClaimResult, row: str, col):
    v = res.claim.paper.get(row)
    return v.get(col) if isinstance(v, dict) else v


def _finite(values) -> list:
    """The values that are numbers (a diverged run's NaN is drawn as no point; the tests count it as the worst)."""
    return [v for v in values if math.isfinite(v)]


def _rows_text(res: ClaimResult, rows: list, cols: list, value) -> str:
    """``FedReMa 65.4, FedAvg 61.9``, or per row over the swept values: ``FedReMa at s = 0.2, 0.8: 52.9, 46.5``."""
    parts = []
    for row in rows:
        pts = [(col, v) for col in cols if (v := value(row, col))]
        if not pts:
            continue
        if cols == [None]:
            parts.append(f"{res.label(row)} {pts[0][1]}")
        else:
            parts.append(
                f"{res.label(row)} at {_key(res)} = {', '.join(str(c) for c, _ in pts)}: "
                + ", ".join(v for _, v in pts)
            )
    return ("; " if cols != [None] else ", ").join(parts)


def paper_text(res: ClaimResult) -> str:
    """The paper's numbers the claim names."""
    c = res.claim
    if not c.paper:
        return "— (no numbers in the paper)"
    cols = [None] if not c.over else _paper_cols(res)

    def value(row, col):
        v = _paper(res, row, col)
        return None if v is None else f"{v:g}"

    return _rows_text(res, list(c.paper), cols, value)


def ours_text(res: ClaimResult) -> str:
    """fedbench's mean ± sample sd (n − 1) over seeds of each named row (per swept value) and the number of seeds
    with a finite value (a diverged run is counted in the brackets, not in n)."""
    if not res.data:
        return "—"

    def value(row, col):
        vals = _finite(res.cell(row, col).values())
        if not vals:
            return None
        return _num(np.mean(vals), res.digits) + (
            f" ± {_num(np.std(vals, ddof=1), res.digits)}" if len(vals) > 1 else ""
        )  # the sample sd (n − 1), as the tests use (issue #52)

    text = _rows_text(res, res.rows, res.cols, value) or "—"
    ns = sorted({len(_finite(res.cell(r, c).values())) for r in res.rows for c in res.cols if res.cell(r, c)})
    if ns:
        text += f" (n = {ns[0]}{'–' + str(ns[-1]) if len(ns) > 1 else ''} seed{'s' * (ns != [1])})"
    if res.status:
        text += " [" + ", ".join(f"{n} {k}" for k, n in res.status.items()) + "]"
    if res.status.get("diverged"):
        text += f" (a diverged run counts as {res.claim.worst:g} in the tests; the means above leave it out)"
    return text


def verdict_text(outcome: Outcome) -> str:
    """The verdict and the look it was reached at: ``holds (look 1)``."""
    return outcome.verdict + (f" (look {outcome.look})" if outcome.look else "")


def row_verdict(res: ClaimResult) -> str:
    """The claims table's verdict cell: as :func:`verdict_text`, and "not at this scale" where the scale has no setting
    of the claim's experiment — as the "By scale" table says (issue #53: one said "not run", the other "not at this
    scale")."""
    if res.experiment is None and res.outcome.verdict == NOT_RUN:
        return "not at this scale"
    return verdict_text(res.outcome)


def duration(seconds: float) -> str:
    if not seconds:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


__all__ = ["duration", "ours_text", "paper_text", "row_verdict", "verdict_text"]
