"""A claim's predicate (docs/claims.md): parsed from one line of text, evaluated seed-paired on the runs' values.

Forms (names are values of the claim's ``by`` key, e.g. methods; ``over`` is the swept key, if any)::

    fedrema > local > fedavg        ordering: every adjacent pair, each name of a ``a, b`` list; a number is a constant
    ecl - fedavg_ft > 2             margin: the difference against a bound (>=, <= read as >, <)
    |ecl - ecl_m3| < 1.5            two-sided: the absolute difference below a bound
    fedrema decreasing              trend over ``over`` (also ``increasing``); ``a - b decreasing`` for a difference
    fedrema flat within 2.5         range over ``over`` (max - min) below a bound
    close within 1.0                each number of the paper within 1.0 (paper scale only)

Every form reduces to tests "quantity q_s per seed s, claimed on one side of a bound"; a comparison with ``over``
is tested at every swept value. **The rule** (:func:`decide`): with n paired seeds (a seed counts when every value the
quantity needs exists for it; pairs are matched by seed, never by position) and the margin m_s = q_s - bound
(sign-flipped for "<"), a test

* **holds** if n >= min_seeds, every m_s > 0 and mean(m) > tolerance;
* **fails** if n >= min_seeds, every m_s < 0 and mean(m) < -tolerance;
* is **inconclusive** otherwise (too few seeds, mixed signs, or a mean within the tolerance of the bound).

A claim holds if all its tests hold, fails if any fails, and is inconclusive otherwise. A claim where a name it reads
(or one of its swept values) has no values yet is **not run**: it is never judged on the tests that remain.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ..report.runs import canon

HOLDS, FAILS, INCONCLUSIVE = "holds", "fails", "inconclusive"
NOT_RUN, NOT_COMPARABLE = "not run", "not comparable (scale)"
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE, NOT_RUN, NOT_COMPARABLE)

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_NAME = r"[A-Za-z0-9_.:+]+"
_EXPR = rf"({_NAME})(?:\s+-\s+({_NAME}))?"


class PredicateError(ValueError):
    """A predicate text that none of the forms reads."""


@dataclass(frozen=True)
class Predicate:
    text: str
    kind: str  # order | diff | absdiff | trend | flat | close
    terms: tuple = ()  # order: ((names...), (names...), ...); diff/absdiff: (a, b); trend/flat: (a,) or (a, b)
    op: str = ">"  # the claimed side: ">" or "<" (trend: ">" increasing, "<" decreasing)
    bound: float = 0.0

    @property
    def names(self) -> list[str]:
        """The row names the predicate reads (numbers in an ordering are constants, not names)."""
        flat = [t for term in self.terms for t in (term if isinstance(term, tuple) else (term,))]
        return [t for t in dict.fromkeys(flat) if not (self.kind == "order" and _is_number(t))]

    @property
    def needs_sweep(self) -> bool:
        return self.kind in ("trend", "flat")


def _is_number(text: str) -> bool:
    return re.fullmatch(_NUM, str(text)) is not None


def parse(text: str) -> Predicate:
    """One predicate line -> :class:`Predicate`; :class:`PredicateError` names the forms when none matches."""
    s = " ".join(str(text).split())
    if m := re.fullmatch(rf"close within ({_NUM})", s):
        return Predicate(s, "close", (), "<", float(m[1]))
    if m := re.fullmatch(rf"{_EXPR} flat within ({_NUM})", s):
        return Predicate(s, "flat", tuple(t for t in m.groups()[:2] if t), "<", float(m[3]))
    if m := re.fullmatch(rf"{_EXPR} (increasing|decreasing)", s):
        return Predicate(s, "trend", tuple(t for t in m.groups()[:2] if t), ">" if m[3] == "increasing" else "<", 0.0)
    if m := re.fullmatch(rf"\|\s*({_NAME})\s+-\s+({_NAME})\s*\|\s*<=?\s*({_NUM})", s):
        return Predicate(s, "absdiff", (m[1], m[2]), "<", float(m[3]))
    if m := re.fullmatch(rf"({_NAME})\s+-\s+({_NAME})\s*(>=|>|<=|<)\s*({_NUM})", s):
        return Predicate(s, "diff", (m[1], m[2]), m[3][0], float(m[4]))
    ops = set(re.findall(r"[<>]", s))
    if len(ops) == 1 and "=" not in s:
        op = ops.pop()
        terms = tuple(tuple(n.strip() for n in part.split(",")) for part in s.split(op))
        if len(terms) >= 2 and all(n and re.fullmatch(_NAME, n) for term in terms for n in term):
            if all(_is_number(n) for term in terms for n in term):
                raise PredicateError(f"predicate {text!r}: compares only numbers")
            return Predicate(s, "order", terms, op, 0.0)
    raise PredicateError(
        f"predicate {text!r} is none of: 'a > b [> c]', 'a > b, c', 'a - b > x', '|a - b| < x', "
        "'a [- b] increasing|decreasing', 'a [- b] flat within x', 'close within x'"
    )


# ---- the decision rule -----------------------------------------------------------------------------------------


@dataclass
class Test:
    """One tested quantity: its value per seed and the side of ``bound`` the claim puts it on."""

    label: str
    per_seed: dict  # {seed: q_s}
    op: str  # ">" or "<"
    bound: float
    at: str | None = None  # the swept value it was measured at (comparisons with ``over``)
    verdict: str = ""
    reason: str = ""

    @property
    def values(self) -> list[float]:
        return list(self.per_seed.values())

    @property
    def mean(self):
        return float(np.mean(self.values)) if self.per_seed else None

    @property
    def std(self):
        return float(np.std(self.values)) if self.per_seed else None  # population std, as the report's cells


def decide(per_seed: dict, op: str, bound: float, tolerance: float, min_seeds: int) -> tuple[str, str]:
    """The rule of the module docstring: (verdict, reason in a few words)."""
    n = len(per_seed)
    if n < min_seeds:
        return INCONCLUSIVE, f"{n} paired seed(s), fewer than {min_seeds}"
    sign = 1.0 if op == ">" else -1.0
    margin = sign * (np.asarray(list(per_seed.values()), dtype=float) - bound)
    mean = float(margin.mean())
    right, wrong = int((margin > 0).sum()), int((margin < 0).sum())
    side = f"{op} {bound:g}"
    if right == n and mean > tolerance:
        return HOLDS, f"all {n} seeds {side}, mean margin {mean:.3g} > tolerance {tolerance:g}"
    if wrong == n and mean < -tolerance:
        return FAILS, f"all {n} seeds on the other side of {bound:g}, mean margin {mean:.3g} < -{tolerance:g}"
    if right == n or wrong == n:
        return INCONCLUSIVE, f"all {n} seeds on one side, but |mean margin| {abs(mean):.3g} <= tolerance {tolerance:g}"
    return INCONCLUSIVE, f"{right} of {n} seeds {side}, {wrong} on the other side, {n - right - wrong} equal"


def combine(verdicts: list[str]) -> str:
    """A claim's verdict from its tests: fails if any fails, holds if all hold, else inconclusive."""
    if not verdicts:
        return NOT_RUN
    if FAILS in verdicts:
        return FAILS
    return HOLDS if all(v == HOLDS for v in verdicts) else INCONCLUSIVE


# ---- evaluation ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    verdict: str
    reason: str
    tests: list = field(default_factory=list)


def _x(col) -> float:
    try:
        return float(col)
    except (TypeError, ValueError):
        raise PredicateError(f"a trend needs numeric values of the swept key, got {col!r}") from None


def evaluate(
    pred: Predicate,
    data: dict,
    cols: list,
    tolerance: float,
    min_seeds: int,
    paper: dict | None = None,
    paper_scale: bool = True,
) -> Outcome:
    """``data = {row: {col: {seed: value}}}`` (col ``None`` when nothing is swept); ``paper = {row: {col: value}}``.
    Seeds are matched by their value: a seed missing on one side drops out of that test."""
    if pred.kind == "close" and not paper_scale:
        return Outcome(NOT_COMPARABLE, "closeness to the paper's numbers is checked at paper scale only")
    if pred.kind != "close":  # a name (or a swept value) without values: the claim is not judged on the others
        empty = [n if col is None else f"{n} at {col}" for n in pred.names for col in cols if not _series(data, n, col)]
        if empty:
            return Outcome(NOT_RUN, "no values yet for " + ", ".join(empty))
    tests = _tests(pred, data, cols, paper or {})
    if not tests:
        return Outcome(NOT_RUN, "no values for the names the predicate reads")
    for t in tests:
        t.verdict, t.reason = decide(t.per_seed, t.op, t.bound, tolerance, min_seeds)
    verdict = combine([t.verdict for t in tests])
    if len(tests) == 1:
        reason = tests[0].reason
    else:
        counts = {v: sum(t.verdict == v for t in tests) for v in (HOLDS, FAILS, INCONCLUSIVE)}
        reason = f"{len(tests)} tests: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    return Outcome(verdict, reason, tests)


def _series(data: dict, name: str, col) -> dict:
    return dict(data.get(canon(name), {}).get(col, {}))


def _pair(a: dict, b: dict, f) -> dict:
    """{seed: f(a_s, b_s)} over the seeds both have (matched by seed)."""
    return {s: f(a[s], b[s]) for s in a if s in b}


def _expr(data: dict, terms: tuple, col) -> dict:
    if len(terms) == 1:
        return _series(data, terms[0], col)
    return _pair(_series(data, terms[0], col), _series(data, terms[1], col), lambda x, y: x - y)


def _at(col) -> str | None:
    return None if col is None else str(col)


def _tests(pred: Predicate, data: dict, cols: list, paper: dict) -> list[Test]:
    out = []
    if pred.kind == "order":
        for left, right in zip(pred.terms, pred.terms[1:]):
            for a in left:
                for b in right:
                    for col in cols:
                        sa = _constant_or_series(data, a, col)
                        sb = _constant_or_series(data, b, col)
                        if sa is None or sb is None:
                            continue
                        per = _pair_const(sa, sb)
                        if per:
                            out.append(Test(f"{a} − {b}", per, pred.op, 0.0, _at(col)))
    elif pred.kind in ("diff", "absdiff"):
        f = (lambda x, y: x - y) if pred.kind == "diff" else (lambda x, y: abs(x - y))
        a, b = pred.terms
        for col in cols:
            per = _pair(_series(data, a, col), _series(data, b, col), f)
            if per:
                label = f"{a} − {b}" if pred.kind == "diff" else f"|{a} − {b}|"
                out.append(Test(label, per, pred.op, pred.bound, _at(col)))
    elif pred.kind in ("trend", "flat"):
        by_seed: dict = {}
        for col in cols:
            for s, v in _expr(data, pred.terms, col).items():
                by_seed.setdefault(s, []).append((col, v))
        per = {}
        for s, pts in by_seed.items():
            if len({c for c, _ in pts}) < 2:
                continue
            ys = np.array([v for _, v in pts], dtype=float)
            if pred.kind == "flat":
                per[s] = float(ys.max() - ys.min())
            else:  # least-squares slope times the swept range: the fitted change from the first to the last value
                xs = np.array([_x(c) for c, _ in pts], dtype=float)
                dx = xs - xs.mean()
                per[s] = float((dx * (ys - ys.mean())).sum() / (dx * dx).sum() * (xs.max() - xs.min()))
        label = " − ".join(pred.terms) + (" range" if pred.kind == "flat" else " change")
        if per:
            out.append(Test(label, per, pred.op, pred.bound))
    elif pred.kind == "close":
        for row, cells in paper.items():
            for col in cols:
                p = cells.get(col) if isinstance(cells, dict) else cells
                if p is None or not isinstance(p, (int, float)) or math.isnan(p):
                    continue
                per = {s: abs(v - p) for s, v in _series(data, row, col).items()}
                if per:
                    out.append(Test(f"|{row} − paper {p:g}|", per, "<", pred.bound, _at(col)))
    return out


def _constant_or_series(data: dict, name: str, col):
    """A row's values at ``col``, or a number written in the predicate (when no row has that name)."""
    if canon(name) in data:
        return _series(data, name, col)
    if _is_number(name):
        return float(name)
    return None


def _pair_const(a, b) -> dict:
    if isinstance(a, float) and isinstance(b, float):
        return {}
    if isinstance(b, float):
        return {s: v - b for s, v in a.items()}
    if isinstance(a, float):
        return {s: a - v for s, v in b.items()}
    return _pair(a, b, lambda x, y: x - y)


def paper_data(paper: dict, cols: list) -> dict:
    """The paper's numbers as one pseudo-seed (``0``) of ``data`` — to check that a claim's predicate is true of the
    numbers it was transcribed from."""
    out: dict = {}
    for row, cells in paper.items():
        for col in cols:
            v = cells.get(col) if isinstance(cells, dict) else cells
            if isinstance(v, (int, float)):
                out.setdefault(row, {})[col] = {0: float(v)}
    return out


__all__ = [
    "HOLDS",
    "FAILS",
    "INCONCLUSIVE",
    "NOT_RUN",
    "NOT_COMPARABLE",
    "VERDICTS",
    "Predicate",
    "PredicateError",
    "Test",
    "Outcome",
    "parse",
    "decide",
    "combine",
    "evaluate",
    "paper_data",
]
