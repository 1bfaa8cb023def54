"""A claim's predicate (docs/claims.md): parsed from one line of text, judged seed-paired on a table of per-run values.

Forms (names are values of the claim's ``by`` key, e.g. methods; ``over`` is the swept key, if any)::

    fedrema > local > fedavg        ordering: every pair of names in different places (a > b, a > c, b > c); names
                                    in one place (``a > b, c``) are not compared with each other; a number is a constant
    ecl - fedavg_ft > 2             margin: the difference against a bound (>=, <= read as >, <)
    |ecl - ecl_m3| < 1.5            equivalence: the difference within ±1.5
    fedrema decreasing              trend over ``over`` (also ``increasing``); ``a - b decreasing`` for a difference:
                                    per seed, the least-squares slope over the swept values' ranks (1st, 2nd, ...)
                                    times k − 1, the fitted change from the smallest to the largest value. Ranks, not
                                    the values: the claims say "falls as X grows", an order; on raw values one end of
                                    a wide sweep (CAFeMe's α = 1000 of 0.3 ... 1000) carries the fit (issue #52)
    fedrema flat within 2.5         equivalence over ``over``: every two swept values within ±2.5 of each other
    close within 1.0                equivalence: each number of the paper within ±1.0 (paper scale only)

Every form reduces to tests of a paired quantity q_s, one value per seed s, claimed above a bound (``>``), below it
(``<``) or within ±bound (``within``); a comparison with ``over`` is tested at every swept value. **The rule**
(:func:`judge`; α = :data:`ALPHA`): from the mean of q over the n seeds and its t-interval (n − 1 degrees of freedom),
a test

* **holds** if the one-sided (1 − α) confidence bound lies on the claimed side of the bound (``within``: the two
  one-sided tests at −bound and +bound, TOST, at the paper's own bound);
* **fails** if the one-sided (1 − α) bound lies on the other side (``within``: beyond −bound or +bound, α/2 each);
* shows **no difference** if its (1 − 2α) interval lies within ±τ of the bound (TOST at the claim's tolerance τ, the
  smallest effect that matters; ``within`` tests have none: their bound is the paper's) — checked first: an interval
  on the claimed side but wholly inside bound ± τ is an effect too small to matter, not a "holds" (issue #52);
* is **inconclusive** otherwise.

"fails" and "no difference" are Holm-adjusted over the claim's tests. A claim holds if every test holds (an
intersection-union test: each at α, no correction needed), fails if any test fails, shows no difference if any test
does and none fails, and is inconclusive otherwise. So each claim errs with probability ≤ α in each direction.

**Two looks** (issue #51; :data:`LOOKS`, :data:`ALPHAS`): on a scale of 5 seeds the rule is group-sequential. Look 1
judges the first 3 of the scale's seeds (in the scale's order) at α1; a decisive claim (holds, fails, no difference)
stops there. Otherwise look 2 judges all 5 at α2. α1 = 0.0114 is the O'Brien–Fleming-type spending of Lan & DeMets
(1983) at the information fraction 3/5, α1 = 2(1 − Φ(z(1 − α/2)·√(5/3))); α2 = α − α1 = 0.0386 (Bonferroni over the
looks). By the union bound each test errs with probability ≤ α1 + α2 = α over both looks; Holm at a look on that
look's p-values rejects no more than Holm on the repeated p-values min(p1/(α1/α), p2/(α2/α)), the closure of such
two-look tests — so every error rate above still holds, for any family, with no calibration (an α2 calibrated to the
exact one-test level would not carry over to Holm families). Power and the minimum detectable effect are the
design's: the chance that the test on its own holds at look 1, or is not decided there and holds at look 2
(:func:`seq_chance`). A scale with another number of
seeds (smoke: 2) is judged in one look at α.

A claim is judged only on complete data: every run it reads at a look (each name at each swept value and seed) must
have a value, else it is **not run (k of n)** — at look 1 "not decided at 3 seeds; seeds 3, 4 to run". A diverged
run — a non-finite value in the table — is an outcome, never dropped: it counts as the claim's ``worst`` value
(accuracy: 0).

:func:`judge` takes each test's values as arrays with the seeds on axis 0, so that the simulation test
(tests/test_claims_rule.py) runs the rule on many replications at once; :func:`evaluate` does too (both looks).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from ..report.runs import canon

HOLDS, FAILS, NO_DIFFERENCE, INCONCLUSIVE = "holds", "fails", "no difference", "inconclusive"
NOT_RUN, NOT_COMPARABLE, NEEDS_DATA = "not run", "not comparable (scale)", "needs data"
VERDICTS = (HOLDS, FAILS, NO_DIFFERENCE, INCONCLUSIVE, NOT_RUN, NOT_COMPARABLE, NEEDS_DATA)
ALPHA = 0.05  # one-sided, per test: P(false holds) <= ALPHA per claim, P(false fails) <= ALPHA per claim (Holm)
POWER = 0.8  # the power at which a test's minimum detectable effect is given
LOOKS = (3, 5)  # seeds at the first and the final look of the group-sequential rule (a scale's seeds in their order)
_A1 = 2 * (1 - stats.norm.cdf(stats.norm.ppf(1 - ALPHA / 2) * math.sqrt(LOOKS[1] / LOOKS[0])))
ALPHAS = (
    float(_A1),
    float(ALPHA - _A1),
)  # α spent at each look: O'Brien–Fleming-type (Lan–DeMets) at 3/5, the rest at the end
DECISIVE = (HOLDS, FAILS, NO_DIFFERENCE)  # the verdicts that stop at look 1

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
    """One tested quantity, its value per seed, and the claimed side of ``bound``: ``>``, ``<`` or ``within``
    (|q| < bound). :func:`judge` fills in the rest."""

    label: str
    per_seed: dict  # {seed: q_s}
    op: str  # ">" | "<" | "within"
    bound: float
    at: str | None = None  # the swept value(s) it was measured at
    paper: float | None = None  # the paper's own value of q (its numbers through the same test)
    n: int = 0
    mean: float = math.nan
    sd: float = math.nan  # sample standard deviation (n - 1) of q over the seeds
    lo: float = math.nan  # the (1 - 2 ALPHA) interval of the mean: each end a one-sided (1 - ALPHA) bound
    hi: float = math.nan
    p_holds: float = math.nan  # p-value against "the claim is false" (within: TOST, the larger of the two)
    p_fails: float = math.nan  # p-value against "the claim is true", Holm-adjusted over the claim's tests
    p_same: float = math.nan  # TOST p-value for "within ±tolerance of the bound", Holm-adjusted
    verdict: str = ""
    reason: str = ""
    alpha: float = ALPHA  # the α it was judged at: ALPHAS[look - 1] in the two-look rule, ALPHA in one look
    sequential: bool = False  # judged by the two-look rule: its power and mde are the design's (LOOKS, ALPHAS)
    tolerance: float = 0.0  # the claim's τ (a stop at look 1 for "no difference" is part of the design's power)

    @property
    def values(self) -> list:
        return list(self.per_seed.values())

    @property
    def tied(self) -> list:
        """The seeds left out: both runs of the difference diverged (a tie of two worst values says nothing)."""
        return [s for s, v in self.per_seed.items() if np.ndim(v) == 0 and math.isnan(v)]

    @property
    def gap(self) -> float | None:
        """The paper's distance from the bound on the claimed side (``within``: its room inside ±bound)."""
        return None if self.paper is None else _gap(self.op, self.bound, self.paper)

    def power(self) -> float | None:
        """P(holds) if q's true mean were the paper's and its seed-to-seed sd the observed one; in the two-look rule
        P(holds at look 1 or at look 2) (:func:`seq_chance`)."""
        if self.paper is None or self.n < 2 or not self.sd > 0:
            return None
        if self.sequential and not self.tied:
            return seq_chance(self.op, self.bound, self.paper, self.sd, self.tolerance)
        return chance(self.op, self.bound, self.paper, self.sd, self.n, self.alpha, self.tolerance)

    def mde(self) -> float | None:
        """The minimum detectable effect: the smallest gap (as :attr:`gap`) the test detects with probability
        :data:`POWER`, at the observed sd (in the two-look rule: holds at look 1 or at look 2). For ``within``: the
        room inside the bound needed at the paper's |q| (0 without one), i.e. the smallest bound the test would confirm
        there, minus |q|."""
        if self.n < 2 or not self.sd > 0:
            return None
        if self.sequential and not self.tied:
            return seq_mde(self.op, self.bound, self.paper, self.sd, self.tolerance)
        return mde(self.op, self.bound, self.paper, self.sd, self.n, self.alpha, self.tolerance)


def _gap(op: str, bound: float, q: float) -> float:
    return q - bound if op == ">" else bound - q if op == "<" else bound - abs(q)


def chance(op: str, bound: float, mu: float, sd: float, n: int, alpha: float = ALPHA, tolerance: float = 0.0) -> float:
    """P(a test holds) when q's true mean is ``mu`` and its seed-to-seed sd ``sd`` (normal noise): the (1 − 2α)
    interval m ± t·s/√n must land in the claimed region and — ``>`` and ``<`` — not wholly inside bound ± ``tolerance``
    ("no difference" comes first: :func:`judge`), i.e. m > max(b + w, b + τ − w) for ``>``. Exact: integrated over
    the sample sd s, with (n − 1)s²/σ² ~ χ²(n − 1), on 2000 quantiles of χ² (error ~1e-5); for ``>`` and ``<`` at
    τ = 0 this is the noncentral t's tail, scipy.stats.nct.sf(t, n − 1, gap·√n/σ)."""
    lo, hi = {">": (bound, math.inf), "<": (-math.inf, bound), "within": (-bound, bound)}[op]
    if sd == 0:
        return float(lo < mu < hi)
    df, sm = n - 1, sd / math.sqrt(n)
    s = np.sqrt(stats.chi2.ppf((np.arange(2000) + 0.5) / 2000, df) / df)  # s/σ at its quantiles
    w = stats.t.ppf(1 - alpha, df) * sm * s
    low, high = lo + w, hi - w
    if op == ">":
        low = np.maximum(low, bound + tolerance - w)
    elif op == "<":
        high = np.minimum(high, bound - tolerance + w)
    return float(np.clip(stats.norm.cdf((high - mu) / sm) - stats.norm.cdf((low - mu) / sm), 0, None).mean())


def mde(op: str, bound: float, paper: float | None, sd: float, n: int, alpha: float = ALPHA, tolerance: float = 0.0):
    """The gap g at which :func:`chance` = :data:`POWER` (see :meth:`Test.mde`)."""
    return _gap_at_power(op, bound, paper, sd, lambda op, b, mu: chance(op, b, mu, sd, n, alpha, tolerance), 1e-6)


def sd_upper(sd: float, n: int, level: float = POWER) -> float:
    """A one-sided ``level`` upper confidence bound on σ from a sample sd of ``n`` values (χ² with n − 1 df):
    sd·√((n − 1)/χ²_{1−level}(n − 1)). A 2-seed sd is below σ 68 % of the time (issue #52); at 80 % its bound is
    3.95 × the sd, at 3 seeds 2.11 ×, at 5 seeds 1.56 ×."""
    return float(sd * math.sqrt((n - 1) / stats.chi2.ppf(1 - level, n - 1)))


def _gap_at_power(op: str, bound: float, paper: float | None, sd: float, power_at, xtol: float) -> float:
    """The gap g (as :attr:`Test.gap`) at which ``power_at(op, bound, true mean)`` = :data:`POWER`; for ``within``
    the room inside the bound at the paper's |q| (0 without one)."""
    if sd == 0:
        return 0.0
    ref = abs(paper) if paper is not None else 0.0

    def power(g):
        if op == "within":
            return power_at(op, ref + g, ref)
        return power_at(op, bound, bound + g if op == ">" else bound - g)

    hi = sd
    while power(hi) < POWER:
        hi *= 2
    from scipy.optimize import brentq

    return float(brentq(lambda g: power(g) - POWER, 0.0, hi, xtol=xtol * sd))


DESIGN_DRAWS = 2**17  # normal samples of the two-look design's power (Monte-Carlo se of a power <= 0.0014)


@functools.lru_cache(maxsize=1)
def _looks() -> tuple:
    """The two-look design on standard normal seeds (a fixed antithetic sample, so that the pages rebuild byte for
    byte and ``>`` and ``<`` see the same design): per look k, the mean of its seeds m_k and its interval's
    half-widths t(1 − α_k, n_k − 1)·s_k/√n_k and t(1 − α_k/2, n_k − 1)·s_k/√n_k, in units of σ."""
    z = np.random.default_rng(51).standard_normal((LOOKS[-1], DESIGN_DRAWS // 2))
    z = np.concatenate([z, -z], axis=1)
    out = []
    for n, a in zip(LOOKS, ALPHAS):
        se = z[:n].std(0, ddof=1) / math.sqrt(n)
        out.append((z[:n].mean(0), stats.t.ppf(1 - a, n - 1) * se, stats.t.ppf(1 - a / 2, n - 1) * se))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def seq_chance(op: str, bound: float, mu: float, sd: float, tolerance: float = 0.0) -> float:
    """:func:`chance` of the two-look rule for the test on its own (a one-test claim): P(it holds at look 1, or is not
    decided there — neither holds nor fails nor "no difference" at ±``tolerance`` — and holds at look 2), q's true
    mean ``mu`` and sd ``sd`` (normal noise), on :data:`DESIGN_DRAWS` fixed samples."""
    lo, hi = {">": (bound, math.inf), "<": (-math.inf, bound), "within": (-bound, bound)}[op]
    if sd == 0:
        return float(lo < mu < hi)
    (m1, w1, v1), (m2, w2, _) = _looks()
    m1, w1, v1, m2, w2 = (sd * x for x in (m1, w1, v1, m2, w2))

    def same(m, w):  # "no difference" (directional tests only; it comes first, :func:`judge`)
        if op == "within":
            return np.zeros(np.shape(m), dtype=bool)
        return (mu + m - w > bound - tolerance) & (mu + m + w < bound + tolerance)

    held = (mu + m1 - w1 > lo) & (mu + m1 + w1 < hi) & ~same(m1, w1)
    if op == "within":  # fails beyond either bound at α1/2; no "no difference"
        stop = held | (mu + m1 + v1 < -bound) | (mu + m1 - v1 > bound)
    else:
        stop = held | (mu + m1 + w1 < bound if op == ">" else mu + m1 - w1 > bound) | same(m1, w1)
    return float((held | (~stop & (mu + m2 - w2 > lo) & (mu + m2 + w2 < hi) & ~same(m2, w2))).mean())


@functools.lru_cache(maxsize=4096)
def seq_mde(op: str, bound: float, paper: float | None, sd: float, tolerance: float = 0.0) -> float:
    """:func:`mde` of the two-look rule: the gap g with :func:`seq_chance` = :data:`POWER`."""
    return _gap_at_power(op, bound, paper, sd, lambda op, b, mu: seq_chance(op, b, mu, sd, tolerance), 1e-4)


def _p(mean, x, se, df, upper: bool):
    """One-sided t-test p-value of H0 "true mean <= x" (``upper``) or ">= x"; 1 where there is no spread (se 0 or
    NaN: identical values on every seed are no evidence either way — issue #52)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (mean - x) / np.where(se > 0, se, np.nan)
        p = stats.t.sf(z, df) if upper else stats.t.cdf(z, df)
    return np.where(se > 0, p, 1.0)


def _measure(t: Test, tolerance: float, alpha: float) -> None:
    """The test's mean, sd, interval and raw p-values (arrays with the seeds on axis 0 give arrays). A NaN value — a
    seed where both runs of a difference diverged — is left out: n counts the others."""
    q = np.asarray(t.values, dtype=float)
    n = (~np.isnan(q)).sum(0)
    df, b = np.maximum(n - 1, 1), t.bound
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.nansum(q, 0) / n
        sd = np.where(n > 1, np.sqrt(np.nansum((q - mean) ** 2, 0) / df), np.nan)
    se = sd / np.sqrt(np.maximum(n, 1))
    t.n, t.mean, t.sd = _scalar(n), mean, sd
    t.lo, t.hi = mean - stats.t.ppf(1 - alpha, df) * se, mean + stats.t.ppf(1 - alpha, df) * se

    def above(x):
        return _p(mean, x, se, df, True)

    def below(x):
        return _p(mean, x, se, df, False)

    if t.op == "within":
        t.p_holds = np.maximum(above(-b), below(b))
        t.p_fails = np.minimum(1.0, 2 * np.minimum(below(-b), above(b)))
        t.p_same = np.ones_like(mean)
    else:
        t.p_holds = above(b) if t.op == ">" else below(b)
        t.p_fails = np.where(se > 0, 1.0 - t.p_holds, 1.0)
        t.p_same = np.maximum(above(b - tolerance), below(b + tolerance))


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values over axis 0 (a claim's tests): rejecting those <= α errs with
    probability <= α for the whole family."""
    p = np.asarray(p, dtype=float)
    k = p.shape[0]
    order = np.argsort(p, axis=0, kind="stable")
    factor = (k - np.arange(k)).reshape((k,) + (1,) * (p.ndim - 1))
    adjusted = np.maximum.accumulate(np.minimum(1.0, np.take_along_axis(p, order, 0) * factor), axis=0)
    out = np.empty_like(adjusted)
    np.put_along_axis(out, order, adjusted, 0)
    return out


def judge(tests: list[Test], tolerance: float, alpha: float = ALPHA):
    """Each test's verdict and the claim's (the module docstring's rule); arrays of replications give arrays."""
    for t in tests:
        t.alpha, t.tolerance = alpha, tolerance
        _measure(t, tolerance, alpha)
    fails, same = holm([t.p_fails for t in tests]), holm([t.p_same for t in tests])
    for t, f, s in zip(tests, fails, same):
        t.p_fails, t.p_same = _scalar(f), _scalar(s)
        t.verdict = _scalar(  # τ first: an effect wholly inside bound ± τ is too small to matter, whichever side
            np.select([s <= alpha, t.p_holds <= alpha, f <= alpha], [NO_DIFFERENCE, HOLDS, FAILS], INCONCLUSIVE)
        )
        t.mean, t.sd, t.lo, t.hi, t.p_holds = map(_scalar, (t.mean, t.sd, t.lo, t.hi, t.p_holds))
    v = np.array([t.verdict for t in tests])
    return _scalar(
        np.select(
            [(v == HOLDS).all(0), (v == FAILS).any(0), (v == NO_DIFFERENCE).any(0)],
            [HOLDS, FAILS, NO_DIFFERENCE],
            INCONCLUSIVE,
        )
    )


def _scalar(x):
    """A 0-d array as a plain Python number or string (one replication: the page's case)."""
    return x.item() if isinstance(x, np.generic | np.ndarray) and np.ndim(x) == 0 else x


def level(alpha: float) -> str:
    """The interval's level, (1 − 2α), as printed: ``90 %``, ``97.7 %``."""
    return f"{100 * (1 - 2 * alpha):.3g} %"


def _why(t: Test) -> str:
    """A test's verdict in a few words."""
    tied = (
        f"; seed{'s' * (len(t.tied) > 1)} {', '.join(map(str, t.tied))} left out: both runs diverged (no information "
        "about their difference)"
        if t.tied
        else ""
    )
    if t.n < 2:
        return f"{t.n} seed{'s' * (t.n != 1)}: no interval{tied}"
    if not t.sd > 0:
        return f"identical on every seed ({t.label} = {t.mean:+.3g}, paired sd 0): no evidence either way{tied}"
    return _said(t) + tied


def _said(t: Test) -> str:
    side = f"inside ±{t.bound:g}" if t.op == "within" else f"{'above' if t.op == '>' else 'below'} {t.bound:g}"
    interval = f"{level(t.alpha)} interval [{t.lo:+.3g}, {t.hi:+.3g}]"
    if t.verdict == HOLDS:
        return f"{interval} {side} (p = {t.p_holds:.2g})"
    if t.verdict == FAILS:
        return (
            f"{interval} on the other side of {'±' if t.op == 'within' else ''}{t.bound:g} (p = {t.p_fails:.2g}, Holm)"
        )
    if t.verdict == NO_DIFFERENCE:
        claimed = t.lo > t.bound if t.op == ">" else t.hi < t.bound
        return f"{interval} within {t.bound:g} ± τ = {t.tolerance:g} (p = {t.p_same:.2g}, Holm)" + (
            f": {side}, but by less than τ, the smallest effect that matters" if claimed else ""
        )
    need = t.mde()
    text = f"{interval} not {side}"
    if need is not None:
        text += f"; could detect a gap ≥ {need:.2g}" + (
            f", the paper's gap is {t.gap:.2g}" if t.gap is not None else ""
        )
    return text


# ---- evaluation ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    verdict: str
    reason: str
    tests: list = field(default_factory=list)
    look: int | None = None  # 1 or 2: the look (LOOKS) at which the verdict was reached; None when no verdict


def _x(col) -> float:
    try:
        return float(col)
    except (TypeError, ValueError):
        raise PredicateError(f"a trend needs numeric values of the swept key, got {col!r}") from None


def needed(pred: Predicate, cols: list, paper: dict) -> list[tuple]:
    """The (row, col) cells a claim reads: every name at every swept value; for ``close``, the paper's numbers."""
    if pred.kind == "close":
        return [(row, col) for row in paper for col in cols if _number(paper[row].get(col)) is not None]
    return [(canon(n), col) for n in pred.names for col in cols]


def evaluate(
    pred: Predicate,
    data: dict,
    cols: list,
    seeds: list,
    tolerance: float,
    worst: float = 0.0,
    paper: dict | None = None,
    paper_scale: bool = True,
    two_looks: bool = True,
) -> Outcome:
    """The claim's verdict from ``data = {row: {col: {seed: value}}}`` (col ``None`` when nothing is swept; a
    non-finite value = a diverged run) and ``paper = {row: {col: value}}``: a pure function of the table. Five
    ``seeds`` are judged in two looks (the module docstring; ``two_looks=False``: in one at α), other numbers
    in one. Every cell of :func:`needed` must have a value at every seed of the look, else the claim is not run; seeds
    are matched by their value, never by position. On arrays of replications the outcome's ``look`` is an array too."""
    if pred.kind == "close" and not paper_scale:
        return Outcome(NOT_COMPARABLE, "closeness to the paper's numbers is checked at paper scale only")
    paper = paper or {}
    cells = needed(pred, cols, paper)
    seeds = list(seeds)
    sequential = two_looks and len(seeds) == LOOKS[-1]
    first = seeds[: LOOKS[0]] if sequential else seeds
    lacking = {(row, col): [s for s in seeds if s not in data.get(row, {}).get(col, {})] for row, col in cells}
    have = len(cells) * len(seeds) - sum(map(len, lacking.values()))
    counted = f"{have} of {len(cells) * len(seeds)} runs have a value"
    if not cells or any(set(m) & set(first) for m in lacking.values()):
        return Outcome(NOT_RUN, f"{counted}; none yet for " + _missing(lacking, seeds))
    if not sequential:
        return _judged(pred, data, cells, cols, seeds, tolerance, worst, paper, ALPHA)
    out = _judged(pred, data, cells, cols, first, tolerance, worst, paper, ALPHAS[0], 1)
    if not isinstance(out.verdict, np.ndarray) and out.verdict in DECISIVE:
        if seeds[LOOKS[0] :]:
            out.reason += f"; seeds {', '.join(map(str, seeds[LOOKS[0] :]))} not read"
        return out
    rest = [s for s in seeds[LOOKS[0] :] if any(s in m for m in lacking.values())]
    if rest:
        return Outcome(
            NOT_RUN,
            f"not decided at {LOOKS[0]} seeds (look 1: {out.verdict}); seeds {', '.join(map(str, rest))} to run — "
            f"{counted}; none yet for " + _missing(lacking, seeds),
        )
    final = _judged(pred, data, cells, cols, seeds, tolerance, worst, paper, ALPHAS[1], 2)
    if not isinstance(out.verdict, np.ndarray):
        return final
    stop = np.isin(out.verdict, DECISIVE)  # replications (the simulation): each stops at its own look
    return Outcome(np.where(stop, out.verdict, final.verdict), "", final.tests, np.where(stop, 1, 2))


def _missing(lacking: dict, seeds: list) -> str:
    return ", ".join(
        f"{row}{'' if col is None else f' at {col}'} ({'every seed' if len(m) == len(seeds) else f'seed {m[0]}'})"
        for (row, col), m in lacking.items()
        if m
    )


def _judged(pred, data, cells, cols, seeds, tolerance, worst, paper, alpha, look=None) -> Outcome:
    """The rule at one look: the claim's tests on ``seeds`` at ``alpha``; ``look`` 1 or 2 in the two-look rule."""
    table = {
        row: {col: {s: _outcome(data[row][col][s]) for s in seeds} for col in cols if col in data[row]}
        for row in {row for row, _ in cells}
    }
    tests = _tests(pred, table, cols, paper, worst)
    on_paper = {(t.label, t.at): t.values[0] for t in _tests(pred, paper_data(paper, cols), cols, paper)}
    for t in tests:
        t.paper = on_paper.get((t.label, t.at))
        t.sequential = look is not None
    verdict = judge(tests, tolerance, alpha)
    if isinstance(verdict, np.ndarray):  # replications (the simulation): no words
        return Outcome(verdict, "", tests, look)
    for t in tests:
        t.reason = _why(t)
    where = (
        ""
        if look is None
        else f"look {look} (seeds {', '.join(map(str, seeds))}; α{look} = {alpha:.3g}, {level(alpha)} intervals): "
    )
    if len(tests) == 1:
        return Outcome(verdict, where + tests[0].reason, tests, look)
    counts = ", ".join(
        f"{n} {v}" for v in (HOLDS, FAILS, NO_DIFFERENCE, INCONCLUSIVE) if (n := sum(t.verdict == v for t in tests))
    )
    return Outcome(verdict, f"{where}{len(tests)} tests (Holm over {len(tests)}): {counts}", tests, look)


def _outcome(value):
    """A run's value; a diverged run's (non-finite) is NaN: the tests count it as the claim's worst (:func:`_worst`)."""
    v = np.asarray(value, dtype=float)
    return _scalar(np.where(np.isfinite(v), v, np.nan))


def _worst(v, worst: float):
    """A run's value for a test: a diverged run (NaN) counts as ``worst``."""
    return _scalar(np.where(np.isnan(v), worst, v))


def _diff(x, y, worst: float):
    """x − y of two runs, a diverged one counting as ``worst``; NaN — the seed left out of the test — where both
    diverged: a tie of two worst values is no evidence about their difference (issue #52)."""
    return _scalar(np.where(np.isnan(x) & np.isnan(y), np.nan, _worst(x, worst) - _worst(y, worst)))


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _series(data: dict, name: str, col) -> dict:
    return dict(data.get(canon(name), {}).get(col, {}))


def _pair(a: dict, b: dict, f) -> dict:
    """{seed: f(a_s, b_s)} over the seeds both have (matched by seed)."""
    return {s: f(a[s], b[s]) for s in a if s in b}


def _expr(data: dict, terms: tuple, col, worst: float) -> dict:
    """One row's runs (diverged: NaN), or the per-seed difference of two (:func:`_diff`)."""
    if len(terms) == 1:
        return _series(data, terms[0], col)
    return _pair(_series(data, terms[0], col), _series(data, terms[1], col), lambda x, y: _diff(x, y, worst))


def _at(col) -> str | None:
    return None if col is None else str(col)


def _tests(pred: Predicate, data: dict, cols: list, paper: dict, worst: float = 0.0) -> list[Test]:
    """The predicate's tests on ``data`` (a diverged run NaN, counting as ``worst``; a difference of two diverged runs
    NaN, left out of its test)."""
    out = []
    if pred.kind == "order":  # every pair of names in different places of the chain
        for i, left in enumerate(pred.terms):
            for right in pred.terms[i + 1 :]:
                for a in left:
                    for b in right:
                        for col in cols:
                            per = _pair_const(
                                _constant_or_series(data, a, col), _constant_or_series(data, b, col), worst
                            )
                            if per:
                                out.append(Test(f"{a} − {b}", per, pred.op, 0.0, _at(col)))
    elif pred.kind in ("diff", "absdiff"):
        a, b = pred.terms
        for col in cols:
            if per := _expr(data, pred.terms, col, worst):
                out.append(
                    Test(f"{a} − {b}", per, "within" if pred.kind == "absdiff" else pred.op, pred.bound, _at(col))
                )
    elif pred.kind == "flat":  # every two swept values within ±bound of each other
        label = " − ".join(pred.terms)
        one = len(pred.terms) == 1  # one row's runs: a diverged one counts as worst; a difference's NaN stays NaN
        for i, c1 in enumerate(cols):
            for c2 in cols[i + 1 :]:
                e1, e2 = _expr(data, pred.terms, c1, worst), _expr(data, pred.terms, c2, worst)
                if per := _pair(e1, e2, (lambda x, y: _diff(x, y, worst)) if one else (lambda x, y: x - y)):
                    out.append(Test(f"{label} difference", per, "within", pred.bound, f"{c1} − {c2}"))
    elif pred.kind == "trend":  # per seed: the least-squares slope over the swept values' ranks times (k − 1)
        rank = {col: float(i) for i, col in enumerate(sorted(cols, key=_x))}
        by_seed: dict = {}
        for col in cols:
            for s, v in _expr(data, pred.terms, col, worst).items():
                by_seed.setdefault(s, []).append((rank[col], _worst(v, worst) if len(pred.terms) == 1 else v))
        per = {}
        for s, pts in by_seed.items():
            if len(pts) >= 2:
                xs, ys = np.array([x for x, _ in pts]), np.stack([np.asarray(v, dtype=float) for _, v in pts])
                dx = xs - xs.mean()
                per[s] = _scalar(np.tensordot(dx, ys - ys.mean(0), axes=(0, 0)) / (dx @ dx) * (xs.max() - xs.min()))
        if per:
            out.append(Test(" − ".join(pred.terms) + " change (fit on ranks)", per, pred.op, 0.0))
    elif pred.kind == "close":
        for row, col in needed(pred, cols, paper):
            p = paper[row][col]
            if per := {s: _worst(v, worst) - p for s, v in _series(data, row, col).items()}:
                out.append(Test(f"{row} − paper {p:g}", per, "within", pred.bound, _at(col)))
    return out


def _constant_or_series(data: dict, name: str, col):
    """A row's values at ``col``, or a number written in the predicate (when no row has that name)."""
    if canon(name) in data:
        return _series(data, name, col)
    if _is_number(name):
        return float(name)
    return {}


def _pair_const(a, b, worst: float) -> dict:
    if isinstance(a, float) and isinstance(b, float):
        return {}
    if isinstance(b, float):
        return {s: _worst(v, worst) - b for s, v in a.items()}
    if isinstance(a, float):
        return {s: a - _worst(v, worst) for s, v in b.items()}
    return _pair(a, b, lambda x, y: _diff(x, y, worst))


def paper_data(paper: dict, cols: list, seeds=(0,), spread: float = 0.0) -> dict:
    """The paper's numbers as ``data``: one pseudo-seed (``0``) each, or — for ``fedbench-claims check`` — ``seeds``
    around each number with a small deterministic ``spread`` (mean exactly the paper's). Each number's offsets are
    its own permutation, scaled by 1 + k/100 for the k-th number, so that no difference of two numbers is the same on
    every seed (identical values on every seed are no evidence: issue #52)."""
    out: dict = {}
    k = 0
    for i, (row, cells) in enumerate(paper.items()):
        for j, col in enumerate(cols):
            v = _number(cells.get(col) if isinstance(cells, dict) else cells)
            if v is not None:
                offsets = np.random.default_rng((i, j)).permutation(len(seeds)) - (len(seeds) - 1) / 2
                out.setdefault(row, {})[col] = {
                    s: float(v + spread * (1 + k / 100) * o) for s, o in zip(seeds, offsets)
                }
                k += 1
    return out


__all__ = [
    "ALPHA",
    "ALPHAS",
    "DECISIVE",
    "HOLDS",
    "FAILS",
    "NO_DIFFERENCE",
    "INCONCLUSIVE",
    "LOOKS",
    "NEEDS_DATA",
    "NOT_RUN",
    "NOT_COMPARABLE",
    "POWER",
    "VERDICTS",
    "Predicate",
    "PredicateError",
    "Test",
    "Outcome",
    "chance",
    "evaluate",
    "holm",
    "judge",
    "mde",
    "needed",
    "paper_data",
    "parse",
    "seq_chance",
    "seq_mde",
]
