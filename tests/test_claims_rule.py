"""The claims' decision rule (fedbench/claims/predicates.py, docs/claims.md): the seed-paired t-interval of one look
by hand, each bound on its own side, equivalence (TOST) at the paper's bound, "no difference" within ±τ, Holm over a
claim's tests, chains tested pair by pair, diverged runs as the worst value, the completeness guard; the two looks
(issue #51: 3 seeds at α1, else 5 at α2) by hand; then the two-look rule simulated with the committed pages' own
seed-to-seed sds — its error rates and the power and minimum detectable effect the pages print — and the paper's own
numbers, fed as seeds, holding for every claim."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from scipy import stats
from scipy.optimize import brentq

from fedbench.claims.predicates import (
    ALPHA,
    ALPHAS,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    LOOKS,
    NO_DIFFERENCE,
    NOT_RUN,
    POWER,
    _looks,
    chance,
    evaluate,
    holm,
    mde,
    paper_data,
    parse,
    seq_chance,
)
from fedbench.claims.spec import load, paper_problems, papers

SEEDS = [0, 1, 2, 3, 4]
T95_4 = 2.131846786  # t quantile 0.95 at 4 df (tables); the two-sided 95 % one would be 2.776445105
T95_2 = 2.919985580  # 0.95 at 2 df


def judge(text, data, cols=(None,), seeds=SEEDS, tolerance=0.5, worst=0.0, paper=None, two_looks=False):
    """The rule on ``data``; by default in one look at α (the arithmetic of each look: the sections up to "two
    looks"), with ``two_looks`` as the pages judge 5 seeds."""
    return evaluate(parse(text), data, list(cols), list(seeds), tolerance, worst, paper=paper, two_looks=two_looks)


def rows(**series) -> dict:
    """``a=[...]`` -> {"a": {None: {0: .., 1: .., ...}}}: one value per seed of SEEDS."""
    return {k: {None: dict(zip(SEEDS, v))} for k, v in series.items()}


# ---- the interval by hand --------------------------------------------------------------------------------------------

# five paired margins: mean 1.3, sum of squared deviations 9.3, sd = sqrt(9.3 / 4) = 1.52480, se = sd / sqrt(5)
Q = [2.0, 0.5, 3.5, 1.0, -0.5]
SE = math.sqrt(9.3 / 4 / 5)


def test_the_interval_of_five_margins_by_hand():
    """mean ± t(0.95, 4 df)·se = 1.3 ± 2.1318·0.68191 = [−0.1537, +2.7537]; p of "q > 0" = P(T4 > 1.3/0.68191 =
    1.9064) = 0.0646 (tables). The one-sided 95 % bound is below 0: inconclusive; above −0.2: "q > −0.2" holds (a
    two-sided 95 % interval, 1.3 − 2.7764·0.68191 = −0.593, would not)."""
    out = judge("a > b", rows(a=[x + 10 for x in Q], b=[10.0] * 5))
    [t] = out.tests
    assert (t.n, t.mean, t.sd) == (5, pytest.approx(1.3), pytest.approx(math.sqrt(9.3 / 4)))
    assert (t.lo, t.hi) == (pytest.approx(1.3 - T95_4 * SE), pytest.approx(1.3 + T95_4 * SE))
    assert t.lo == pytest.approx(-0.15373, abs=1e-5) and t.p_holds == pytest.approx(0.06464, abs=1e-5)
    assert out.verdict == INCONCLUSIVE
    assert judge("a - b > -0.2", rows(a=Q, b=[0.0] * 5)).verdict == HOLDS  # −0.154 > −0.2: one-sided, not two-sided
    assert judge("a - b > -0.1", rows(a=Q, b=[0.0] * 5)).verdict == INCONCLUSIVE
    # the other side: hi = 2.7537, so q < 2.8 holds and q < 2.7 does not; flipping the sign flips the verdicts
    assert judge("a - b < 2.8", rows(a=Q, b=[0.0] * 5)).verdict == HOLDS
    assert judge("a - b < 2.7", rows(a=Q, b=[0.0] * 5)).verdict == INCONCLUSIVE
    assert judge("b - a > -2.8", rows(a=Q, b=[0.0] * 5)).verdict == HOLDS
    # fails: the one-sided bound on the other side — q > 2.8 fails (hi 2.7537 < 2.8), q > 2.7 does not
    assert judge("a - b > 2.8", rows(a=Q, b=[0.0] * 5)).verdict == FAILS
    assert judge("a - b > 2.7", rows(a=Q, b=[0.0] * 5)).verdict == INCONCLUSIVE


def test_seeds_pair_by_seed_not_by_position():
    """FedReMa's seeds arrive in another order than FedAvg's; paired by seed the differences are 0.5, 1.2, 1.0
    (mean 0.9, sd 0.361, lo = 0.9 − 2.92·0.208 = 0.29: holds), by position −19, 10.5, 11.2 (inconclusive). A seed
    outside the scale's seeds is not read."""
    data = {"fedrema": {None: {0: 10.0, 1: 20.0, 2: 30.0, 3: 0.0}}, "fedavg": {None: {2: 29.0, 0: 9.5, 1: 18.8}}}
    out = judge("fedrema > fedavg", data, seeds=[0, 1, 2])
    assert out.tests[0].per_seed == pytest.approx({0: 0.5, 1: 1.2, 2: 1.0}) and out.verdict == HOLDS
    assert out.tests[0].lo == pytest.approx(0.9 - T95_2 * np.std([0.5, 1.2, 1.0], ddof=1) / math.sqrt(3))


# ---- two looks (issue #51) -------------------------------------------------------------------------------------------

A1 = 0.011396418  # 2(1 − Φ(1.959964·√(5/3))) = 2(1 − Φ(2.530297)): O'Brien–Fleming-type spending at 3 of 5 seeds
T_A1_2 = (1 - 2 * A1) / math.sqrt(2 * A1 * (1 - A1))  # t(1 − α1, 2 df) in closed form: 6.50993


def _t4(tail: float) -> float:
    """t(1 − tail, 4 df) in closed form (a = 4p(1 − p); q = cos(arccos(√a)/3)/√a; t = 2√(q − 1))."""
    a = 4 * tail * (1 - tail)
    return 2 * math.sqrt(math.cos(math.acos(math.sqrt(a)) / 3) / math.sqrt(a) - 1)


def test_the_two_looks_spend_alpha_as_designed():
    """α1 = 0.011396 (hand value above), α2 = α − α1 = 0.038604; the looks at 3 and 5 seeds. The closed forms agree
    with the tables where those exist: t(0.95, 4) = 2.131847."""
    assert LOOKS == (3, 5)
    assert ALPHAS[0] == pytest.approx(A1, abs=1e-8) and ALPHAS[0] + ALPHAS[1] == pytest.approx(ALPHA, abs=1e-15)
    assert _t4(0.05) == pytest.approx(T95_4, abs=1e-8)


def test_a_claim_decisive_at_three_seeds_stops_there():
    """Margins 2.0, 2.2, 1.9 at seeds 0–2 (mean 2.0333, sd 0.15275, se 0.088192): the look-1 bound 2.0333 −
    6.50993·0.088192 = 1.4592 > 0 — holds at look 1, whatever seeds 3 and 4 say (here −6, which on all 5 seeds would
    not hold) and whether they exist. Mirrored it fails at look 1; margins 0.01, −0.01, 0 lie within ±τ = 0.5: no
    difference at look 1. The first look reads the scale's first 3 seeds in the scale's order, not the smallest."""
    b = [10.0] * 5
    out = judge("a > b", rows(a=[12.0, 12.2, 11.9, 4.0, 4.0], b=b), two_looks=True)
    [t] = out.tests
    assert (out.verdict, out.look, t.n, t.alpha) == (HOLDS, 1, 3, pytest.approx(A1, abs=1e-8))
    se = math.sqrt(((2.0 - 2.0333333) ** 2 + (2.2 - 2.0333333) ** 2 + (1.9 - 2.0333333) ** 2) / 2 / 3)
    assert t.lo == pytest.approx(2.0333333 - T_A1_2 * se, abs=1e-6) and t.lo == pytest.approx(1.4592, abs=1e-4)
    assert "look 1" in out.reason and "seeds 3, 4 not read" in out.reason
    assert judge("a > b", rows(a=[12.0, 12.2, 11.9, 4.0, 4.0], b=b)).verdict == INCONCLUSIVE  # one look over 5
    three = {
        k: {None: {s: v for s, v in per[None].items() if s < 3}}
        for k, per in rows(a=[12, 12.2, 11.9, 4, 4], b=b).items()
    }
    assert judge("a > b", three, two_looks=True).verdict == HOLDS
    mirrored = judge("a > b", rows(a=[8.0, 7.8, 8.1, 16.0, 16.0], b=b), two_looks=True)
    assert (mirrored.verdict, mirrored.look) == (FAILS, 1)
    same = judge("a > b", rows(a=[10.01, 9.99, 10.0, 15.0, 5.0], b=b), two_looks=True)
    assert (same.verdict, same.look) == (NO_DIFFERENCE, 1)
    order = [4, 3, 2, 1, 0]  # the scale lists seed 4 first: look 1 reads seeds 4, 3, 2
    data = {k: {None: dict(zip(order, v))} for k, v in {"a": [12.0, 12.2, 11.9, 4.0, 4.0], "b": b}.items()}
    out = judge("a > b", data, seeds=order, two_looks=True)
    assert (out.verdict, out.look, sorted(out.tests[0].per_seed)) == (HOLDS, 1, [2, 3, 4])


def test_a_claim_not_decided_at_three_seeds_is_judged_on_five_at_alpha2():
    """The five margins Q: at look 1 (2.0, 0.5, 3.5: mean 2.0, se 0.86603, bounds 2.0 ∓ 5.6378) nothing is decided;
    at look 2 the bound is 1.3 − t(1 − α2, 4)·0.68191 = 1.3 − 2.365398·0.68191 = −0.31298. So "q > −0.35" holds at
    look 2 and "q > −0.25" is inconclusive — which one look at α (bound −0.1537) would call "holds": the final look
    spends α2 < α. Without seeds 3 and 4 the claim is not run: "not decided at 3 seeds; seeds 3, 4 to run"."""
    data = rows(a=Q, b=[0.0] * 5)
    out = judge("a - b > -0.35", data, two_looks=True)
    [t] = out.tests
    assert (out.verdict, out.look, t.n, t.alpha) == (HOLDS, 2, 5, pytest.approx(ALPHA - A1, abs=1e-8))
    assert t.lo == pytest.approx(1.3 - _t4(ALPHA - A1) * SE, abs=1e-7) and t.lo == pytest.approx(-0.31298, abs=1e-5)
    assert "look 2" in out.reason
    assert judge("a - b > -0.25", data, two_looks=True).verdict == INCONCLUSIVE
    assert judge("a - b > -0.25", data).verdict == HOLDS  # one look at α
    del data["a"][None][3], data["a"][None][4]
    out = judge("a - b > -0.35", data, two_looks=True)
    assert out.verdict == NOT_RUN and out.look is None
    assert out.reason.startswith("not decided at 3 seeds (look 1: inconclusive); seeds 3, 4 to run — 8 of 10 runs")
    del data["a"][None][2]
    assert judge("a - b > -0.35", data, two_looks=True).reason.startswith("7 of 10 runs have a value")


def test_the_chance_that_look_1_decides_follows_the_observed_effect():
    """fedbench.claims.looks.stop_chance (docs/claims.md's runs saved): with no effect and a paired sd of 7.9 against
    τ = 0.5, look 1 decides only by error — holds or fails at α1 each, 2α1 = 0.0228 (± 3 Monte-Carlo se); with an
    effect of 10 at sd 0.16 it always does (holds at look 1). α2 at look 1 would give 0.077."""
    from fedbench.claims.looks import DRAWS, stop_chance

    rng = np.random.default_rng(5)
    none = judge("a > b", rows(a=[10.0, -10.0, 5.0, -5.0, 0.0], b=[0.0] * 5)).tests
    assert none[0].sd == pytest.approx(math.sqrt(250 / 4))
    got = stop_chance(none, 0.5, rng)
    assert got == pytest.approx(2 * A1, abs=3 * math.sqrt(2 * A1 * (1 - 2 * A1) / DRAWS))
    plain = judge("a > b", rows(a=[10.1, 9.9, 10.0, 10.2, 9.8], b=[0.0] * 5)).tests
    assert stop_chance(plain, 0.5, rng) == 1.0


# ---- equivalence: each bound on its own side ---------------------------------------------------------------------


def test_within_is_tost_at_the_papers_own_bound():
    """|a − b| < 2.5 with differences 1.9, 2.1, 2.0, 2.2, 1.8 (mean 2.0, sd 0.158, interval 2.0 ± 0.151 =
    [1.849, 2.151]): inside ±2.5 — holds; judged against 2.5 − 0.5 it would not be. Mirrored (−2.0) it holds too;
    within ±2.1 it is inconclusive; within ±1.8 (below the interval's α/2 end, 2.0 − 2.776·0.0707 = 1.804) it fails,
    but not within ±1.81, which only the one-sided α bound (1.849) clears: each side of a within test fails at α/2."""
    d = [1.9, 2.1, 2.0, 2.2, 1.8]
    data = rows(a=[60 + x for x in d], b=[60.0] * 5)
    flipped = rows(a=[60.0] * 5, b=[60 + x for x in d])
    assert judge("|a - b| < 2.5", data).verdict == HOLDS
    assert judge("|a - b| < 2.5", flipped).verdict == HOLDS
    [t] = judge("|a - b| < 2.5", data).tests
    assert (t.lo, t.hi) == (pytest.approx(2.0 - T95_4 * 0.0707107, abs=1e-6), pytest.approx(2.0 + T95_4 * 0.0707107))
    assert judge("|a - b| < 2.1", data).verdict == INCONCLUSIVE
    assert judge("|a - b| < 1.8", data).verdict == FAILS and judge("|a - b| < 1.8", flipped).verdict == FAILS
    assert judge("|a - b| < 1.81", data).verdict == INCONCLUSIVE


def test_flat_within_tests_every_two_swept_values_at_the_bound():
    """FedReMa's δ: "flat within 2.5" is |y(δ1) − y(δ2)| < 2.5 for every two δ. Seeds around the paper's 63.36,
    65.40, 65.06 (range 2.04): every pair inside ±2.5 — holds (the old rule, range < 2.5 − 0.5, called it
    inconclusive). Raise δ = 0.5 by 1.5 (range 3.54): the pair 0.1 − 0.5 fails, the others hold."""
    jitter = [0.1, -0.1, 0.05, -0.05, 0.0]
    paper = {"0.1": 63.36, "0.5": 65.40, "0.9": 65.06}
    data = {
        "fedrema": {c: {s: v + j * (i + 1) for s, j in zip(SEEDS, jitter)} for i, (c, v) in enumerate(paper.items())}
    }
    out = judge("fedrema flat within 2.5", data, cols=list(paper))
    assert [t.at for t in out.tests] == ["0.1 − 0.5", "0.1 − 0.9", "0.5 − 0.9"] and out.verdict == HOLDS
    data["fedrema"]["0.5"] = {s: v + 1.5 for s, v in data["fedrema"]["0.5"].items()}
    out = judge("fedrema flat within 2.5", data, cols=list(paper))
    assert [t.verdict for t in out.tests] == [FAILS, HOLDS, HOLDS] and out.verdict == FAILS  # 0.5 − 0.9: 1.84


# ---- no difference, Holm -------------------------------------------------------------------------------------------


def test_no_difference_is_an_interval_within_tolerance_of_the_bound():
    """Differences 0.1, −0.1, 0.05, −0.05, 0.2 (mean 0.04, interval ±0.131): within ±0.5 of 0 — no difference; with
    τ = 0.1 the interval (−0.091, 0.171) reaches past 0.1 — inconclusive. Against a bound of 3 (q − 3 within ±0.5)
    the same holds for values near 3."""
    d = [0.1, -0.1, 0.05, -0.05, 0.2]
    assert judge("a > b", rows(a=[50 + x for x in d], b=[50.0] * 5)).verdict == NO_DIFFERENCE
    assert judge("a > b", rows(a=[50 + x for x in d], b=[50.0] * 5), tolerance=0.1).verdict == INCONCLUSIVE
    assert judge("a - b > 3", rows(a=[53 + x for x in d], b=[50.0] * 5)).verdict == NO_DIFFERENCE
    assert judge("|a - b| < 3", rows(a=[53 + x for x in d], b=[50.0] * 5)).verdict == INCONCLUSIVE  # no τ in within


def test_holm_adjusts_fails_over_a_claims_tests():
    """Holm by hand for p = 0.03, 0.01, 0.04: sorted 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 → max(0.06, 0.04) = 0.06.
    In a claim: "a > c" alone with a − c = −0.2, −0.5, 0.1, −0.6, −0.3 (mean −0.3, sd 0.27386, t = −2.4495,
    p = P(T4 < −2.4495) = 0.0352) fails; inside "a > b, c", where a − b clearly holds, Holm doubles it to 0.0705 —
    inconclusive. "holds" needs no adjustment (every test must hold): a − b holds in both."""
    assert holm(np.array([0.03, 0.01, 0.04])) == pytest.approx([0.06, 0.03, 0.06])
    np.testing.assert_allclose(holm(np.array([[0.03, 0.5], [0.01, 0.2]])), [[0.03, 0.5], [0.02, 0.4]])  # 2 families
    c = [60.0, 61.0, 59.5, 60.5, 62.0]
    a = [x + d for x, d in zip(c, [-0.2, -0.5, 0.1, -0.6, -0.3])]
    b = [x - 3 for x in c]
    alone = judge("a > c", rows(a=a, c=c), tolerance=0.1)
    assert alone.tests[0].p_fails == pytest.approx(0.035242, abs=1e-5) and alone.verdict == FAILS
    pair = judge("a > b, c", rows(a=a, b=b, c=c), tolerance=0.1)
    assert [t.verdict for t in pair.tests] == [HOLDS, INCONCLUSIVE] and pair.verdict == INCONCLUSIVE
    assert pair.tests[1].p_fails == pytest.approx(2 * 0.035242, abs=2e-5)


def test_a_chain_tests_every_pair():
    """A > B > C with A − B = −0.3 + e and B − C = −0.3 − e + f (e = 1, −1, 0.5, −0.5, 0; f = 0.02, −0.01, 0, 0.01,
    −0.02: each pair's interval −0.3 ± 0.75 straddles 0) but A − C = −0.6 + f on every seed: only the pair the old
    rule skipped fails. (f is there because identical differences on every seed are no evidence: issue #52.)"""
    e = [1.0, -1.0, 0.5, -0.5, 0.0]
    f = [0.02, -0.01, 0.0, 0.01, -0.02]
    c = [50.0, 51.0, 49.0, 50.5, 52.0]
    b = [x - 0.3 - y + z for x, y, z in zip(c, e, f)]  # B − C = −0.3 − e + f
    a = [x - 0.3 + y for x, y in zip(b, e)]  # A − B = −0.3 + e
    out = judge("a > b > c", rows(a=a, b=b, c=c))
    assert [(t.label, t.verdict) for t in out.tests] == [
        ("a − b", INCONCLUSIVE),
        ("a − c", FAILS),
        ("b − c", INCONCLUSIVE),
    ]
    assert out.verdict == FAILS
    both = judge("a > b, c", rows(a=a, b=b, c=c))
    assert [t.label for t in both.tests] == ["a − b", "a − c"]  # names in one place are not compared


# ---- complete data, diverged runs ----------------------------------------------------------------------------------


def test_every_name_value_and_seed_must_have_a_value():
    """A missing value anywhere — a name, a swept value, a seed — makes the claim "not run (k of n)", naming what is
    missing; a trend needs every swept value at every seed."""
    full = rows(a=[3.0, 4.0, 3.5, 5.0, 4.5], b=[1.0, 1.5, 1.0, 2.0, 1.2])
    assert judge("a > b", full).verdict == HOLDS
    del full["b"][None][3]
    out = judge("a > b", full)
    assert out.verdict == NOT_RUN and out.reason.startswith("9 of 10 runs") and "b" in out.reason
    trend = {"a": {x: {s: 50.0 - (10 + s) * x + s for s in SEEDS} for x in (0.2, 0.4, 0.6)}}
    assert judge("a decreasing", trend, cols=[0.2, 0.4, 0.6]).verdict == HOLDS
    del trend["a"][0.6][4]
    out = judge("a decreasing", trend, cols=[0.2, 0.4, 0.6])
    assert out.verdict == NOT_RUN and "14 of 15" in out.reason and "0.6" in out.reason
    assert judge("a decreasing", {"a": {0.2: trend["a"][0.2]}}, cols=[0.2, 0.4, 0.6]).verdict == NOT_RUN


def test_a_diverged_run_counts_as_the_worst_value():
    """A diverged run (NaN) of A counts as `worst` (0): A beats B on 3 seeds by 2–3 points and diverged on the other 2
    — differences 2, 3, 2.5, −40, −41: inconclusive, never "holds" on the survivors; A diverged on every seed: fails.
    For a lower-is-better metric the claim's worst is the high end (forgetting degree: 1)."""
    b = [40.0, 41.0, 40.5, 40.0, 41.0]
    a = [42.0, 44.0, 43.0, math.nan, math.nan]
    out = judge("a > b", rows(a=a, b=b))
    assert out.tests[0].per_seed == pytest.approx({0: 2.0, 1: 3.0, 2: 2.5, 3: -40.0, 4: -41.0})
    assert out.verdict == INCONCLUSIVE
    assert judge("a > b", rows(a=[math.nan] * 5, b=b)).verdict == FAILS
    assert judge("a > b", rows(a=[math.inf] * 5, b=b)).verdict == FAILS
    forgetting = rows(a=[math.nan] * 5, b=[0.6, 0.7, 0.65, 0.62, 0.68])
    assert judge("a < b", forgetting, tolerance=0.02, worst=1.0).verdict == FAILS


# ---- simulation: error rates and power ---------------------------------------------------------------------------

R = 20_000  # replications per setting: Monte-Carlo se of a 5 % rate = sqrt(.05 · .95 / R) = 0.0015


def page_sds() -> list[float]:
    """The seed-to-seed sds (n − 1) of every test on the committed pages (docs/results/*.csv, per-seed values), with
    those of the last 3-seed pages before the records (tests/data/page_sds.json says where from): the range the rule
    meets in practice."""
    out = json.loads((Path(__file__).parent / "data" / "page_sds.json").read_text())["sds"]
    for path in sorted((REPO / "docs" / "results").glob("*.csv")):
        for line in csv.DictReader(path.open()):
            values = [v for x in line["per_seed"].split(";") if x and math.isfinite(v := float(x.split(":", 1)[1]))]
            if len(values) > 1 and np.std(values) > 0:
                out.append(float(np.std(values, ddof=1)))
    return sorted(set(round(s, 3) for s in out))


def simulate(text, means: dict, sd: float, rng, cols=(None,), tolerance=0.5, two_looks=True):
    """The rule (predicates.evaluate on arrays of R replications: both looks, each replication stopping at its own) on
    data: each name at each swept value normal around ``means[name][col]`` with sd ``sd`` per seed. The outcome."""
    data = {
        name: {col: {s: m + sd * rng.standard_normal(R) for s in SEEDS} for col, m in per.items()}
        for name, per in means.items()
    }
    return evaluate(parse(text), data, list(cols), SEEDS, tolerance, two_looks=two_looks)


def rate(verdicts, which) -> float:
    return float(np.mean(verdicts == which))


def holds_rate(op: str, bound: float, mu: float, sd: float, rng, tolerance: float = 0.5) -> float:
    """How often the rule (two looks) says "holds" for one test of q (true mean ``mu``, sd ``sd``) against ``bound``."""
    text = f"|a - b| < {bound!r}" if op == "within" else f"a - b {op} {bound!r}"
    data = {"a": {None: {s: mu + sd * rng.standard_normal(R) for s in SEEDS}}, "b": {None: dict.fromkeys(SEEDS, 0.0)}}
    return rate(evaluate(parse(text), data, [None], SEEDS, tolerance).verdict, HOLDS)


@pytest.mark.slow
def test_error_rates_under_no_effect_with_the_pages_sds():
    """With no true difference and the pages' sds, judged in two looks: false "holds" and false "fails" each ≤ 5 %
    (+3 Monte-Carlo se) for one comparison, a list, a chain, a comparison at 3 swept values and a trend. One comparison
    errs at the design's own rate, predicates.seq_chance at the bound (P(holds at look 1 at α1, or undecided there and
    holds at look 2 at α2), between α2 and α; lower where the sd is small against τ, which stops at look 1 as "no
    difference"), and at look 1 at α1 exactly — so α1 at both looks (too few errors), or α at the final look (too
    many), fails here. With the true gap exactly at τ, "no difference" ≤ 5 %; an equivalence ("within 2.5", "flat within
    2.5") holds ≤ 5 % with its difference at the bound (TOST) and fails ≤ 5 % with no difference. With both runs
    diverged on ~30 % of the seeds (left out, issue #52) a comparison still errs ≤ 5 % each way, and an equivalence at
    its bound gains nothing from the ties (≤ 5 %)."""
    sds = page_sds()
    assert len(sds) >= 15 and min(sds) < 0.5 and max(sds) > 8  # the pages' range (FedKA's forgetting to FedCOM's)
    rng, se = np.random.default_rng(30), math.sqrt(ALPHA * (1 - ALPHA) / R)
    holds, fails, first, design, others = [], [], [], [], []
    for sd in sds[:: max(1, len(sds) // 6)]:  # 6 of them, over the whole range
        out = simulate("a > b", {"a": {None: 0.0}, "b": {None: 0.0}}, sd / math.sqrt(2), rng)  # q's sd = sd
        holds.append(rate(out.verdict, HOLDS))
        fails.append(rate(out.verdict, FAILS))
        first.append(float(np.mean((out.look == 1) & (out.verdict == HOLDS))))
        design.append(seq_chance(">", 0.0, 0.0, sd, 0.5))
        zero = {None: 0.0}
        for text in ("a > b > c", "a > b, c"):
            v = simulate(text, {k: zero for k in "abc"}, sd, rng).verdict
            others += [rate(v, HOLDS), rate(v, FAILS)]
        xyz = {c: 0.0 for c in "xyz"}
        v = simulate("a > b", {"a": xyz, "b": xyz}, sd, rng, cols="xyz").verdict
        others += [rate(v, HOLDS), rate(v, FAILS)]
        v = simulate("a decreasing", {"a": {x: 0.0 for x in (0.05, 0.1, 0.5)}}, sd, rng, cols=(0.05, 0.1, 0.5)).verdict
        others += [rate(v, HOLDS), rate(v, FAILS)]
        v = simulate("a > b", {"a": {None: 0.5}, "b": zero}, sd / 8, rng, tolerance=0.5).verdict  # the gap at τ
        others.append(rate(v, NO_DIFFERENCE))
        others.append(rate(simulate("|a - b| < 2.5", {"a": {None: 2.5}, "b": zero}, sd, rng).verdict, HOLDS))
        others.append(rate(simulate("|a - b| < 2.5", {"a": zero, "b": zero}, sd, rng).verdict, FAILS))
        others.append(rate(simulate("a flat within 2.5", {"a": xyz}, sd, rng, cols="xyz").verdict, FAILS))
        edge = {"x": 0.0, "y": 0.0, "z": 2.5}
        others.append(rate(simulate("a flat within 2.5", {"a": edge}, sd, rng, cols="xyz").verdict, HOLDS))
        for text, gap, which in (("a > b", 0.0, HOLDS), ("a > b", 0.0, FAILS), ("|a - b| < 2.5", 2.5, HOLDS)):
            both = rng.random((len(SEEDS), R)) < 0.3  # both runs diverged on ~30 % of the seeds (issue #52)
            data = {
                name: {None: {s: np.where(both[s], math.nan, m + sd * rng.standard_normal(R)) for s in SEEDS}}
                for name, m in (("a", gap), ("b", 0.0))
            }
            others.append(rate(evaluate(parse(text), data, [None], SEEDS, 0.5).verdict, which))
    k = len(holds)
    assert max(design) > ALPHAS[1] and max(design) < ALPHA  # the two looks together, where the sd is large
    pooled = 3 * se / math.sqrt(k) + 0.002  # + the design's own Monte-Carlo error (2^17 samples)
    assert np.mean(holds) == pytest.approx(np.mean(design), abs=pooled)
    assert np.mean(fails) == pytest.approx(np.mean(design), abs=pooled)
    # look 1 holds at α1 exactly, less the "no difference" stops τ = 0.5 takes first where the sd is small
    (m1, w1, _), _ = _looks()
    chosen = sds[:: max(1, len(sds) // 6)]
    at_1 = [float(((d * (m1 - w1) > 0) & ~((d * (m1 - w1) > -0.5) & (d * (m1 + w1) < 0.5))).mean()) for d in chosen]
    assert max(at_1) == pytest.approx(ALPHAS[0], abs=0.002)  # where the sd is large against τ: α1 itself
    assert np.mean(first) == pytest.approx(np.mean(at_1), abs=3 * math.sqrt(ALPHAS[0] * (1 - ALPHAS[0]) / R / k))
    assert max(holds + fails + others) <= ALPHA + 3 * se, (holds, fails, others)
    print(
        f"false holds {np.mean(holds):.4f}, false fails {np.mean(fails):.4f} (design {np.mean(design):.4f}), "
        f"at look 1 {np.mean(first):.4f}, others max {max(others):.4f}"
    )


@pytest.mark.slow
def test_the_printed_power_and_detectable_effect_agree_with_simulation():
    """For every claim's test with a paper gap (the paper's numbers through the rule) at the pages' sds: the power the
    page prints (Test.power: the chance the two-look rule says "holds" when the paper's effect is true) and the minimum
    detectable effect (the gap with POWER) match the rule simulated there, within 3 Monte-Carlo se + 0.005.
    Hand check: FedKA's 2.1-point gap at the page's paired sd 1.265 has noncentral-t power 0.9145 in one look of 5
    seeds at α; the two looks' power lies between that and one look of 5 at α2 (the look-1 stops aside)."""
    nct = stats.nct.sf(T95_4, 4, 2.1 * math.sqrt(5) / 1.265)
    assert chance(">", 0.0, 2.1, 1.265, 5) == pytest.approx(nct, abs=1e-4)
    assert chance(">", 0.0, 2.1, 1.265, 5) == pytest.approx(0.9145, abs=1e-4)
    two = seq_chance(">", 0.0, 2.1, 1.265, 0.5)
    assert chance(">", 0.0, 2.1, 1.265, 5, ALPHAS[1]) < two < chance(">", 0.0, 2.1, 1.265, 5)
    sds, rng, checked = page_sds(), np.random.default_rng(7), 0
    for paper in papers():
        for c in load(paper).claims:
            if not c.paper or c.predicate.kind == "close":
                continue
            pp = {row: v if isinstance(v, dict) else {None: v} for row, v in c.paper.items()}
            cols = [None] if not c.over else list(dict.fromkeys(k for v in pp.values() for k in v))
            out = evaluate(c.predicate, paper_data(pp, cols, SEEDS, 0.3), cols, SEEDS, c.tolerance, c.worst, pp)
            for t in out.tests[:2]:
                t.sd = sds[checked % len(sds)]  # the page's observed sd, as the page would print with it
                checked += 1
                ref, need = abs(t.paper), t.mde()
                if t.op == "within":
                    at_mde = ("within", ref + need, ref)
                else:
                    at_mde = (t.op, t.bound, t.bound + need if t.op == ">" else t.bound - need)
                for (op, bound, mu), printed in (((t.op, t.bound, t.paper), t.power()), (at_mde, POWER)):
                    got = holds_rate(op, bound, mu, t.sd, rng, c.tolerance)
                    tol = 3 * math.sqrt(printed * (1 - printed) / R) + 0.005
                    assert got == pytest.approx(printed, abs=tol), (paper, c.id, t.label, t.at, t.sd, mu)
    assert checked >= 20


def test_a_grid_value_chosen_on_the_judged_seeds_would_inflate_false_holds():
    """Why FedKA's β is chosen on tune_seeds: with no effect of any β (4 grid values, all as good as FedAvg), choosing
    the β with the best mean over the 5 judged seeds and judging those same runs says "holds" about 13 % of the time;
    chosen on 3 other seeds, the judged runs do not depend on the choice and the rate is α."""
    rng = np.random.default_rng(3)
    judged, tuning, fedavg = rng.standard_normal((4, 5, R)), rng.standard_normal((4, 3, R)), rng.standard_normal((5, R))

    def holds_when_chosen_by(means):
        fedka = np.take_along_axis(judged, np.broadcast_to(means.argmax(0), (1, 5, R)), 0)[0]
        data = {"fedka": {None: dict(zip(SEEDS, fedka))}, "fedavg": {None: dict(zip(SEEDS, fedavg))}}
        return rate(evaluate(parse("fedka > fedavg"), data, [None], SEEDS, 0.0).verdict, HOLDS)  # τ aside

    same, held_out = holds_when_chosen_by(judged.mean(1)), holds_when_chosen_by(tuning.mean(1))
    assert 0.11 < same < 0.15
    assert held_out == pytest.approx(ALPHA, abs=3 * math.sqrt(ALPHA * (1 - ALPHA) / R))


def test_mde_is_where_the_power_is_80_percent():
    """mde solves chance(gap) = 0.8; for n = 5 and sd 1 the noncentral t gives the gap 1.359 (the normal approximation,
    (z.95 + z.8)/√5 = 1.112, would understate it); the same gap on the "<" side."""
    g = mde(">", 0.0, None, 1.0, 5)
    assert chance(">", 0.0, g, 1.0, 5) == pytest.approx(POWER, abs=1e-4)
    nct = brentq(lambda d: stats.nct.sf(T95_4, 4, d * math.sqrt(5)) - POWER, 0.1, 5)
    assert g == pytest.approx(nct, abs=1e-3) and g == pytest.approx(1.3594, abs=1e-3)
    assert mde("<", 2.0, None, 1.0, 5) == pytest.approx(g)


# ---- the paper's own numbers -----------------------------------------------------------------------------------------


def test_the_papers_own_numbers_as_seeds_hold_for_every_claim():
    """Every claim with numbers, judged by the rule (its tolerance, α, Holm) on the paper's numbers as 5 seeds 0.05
    apart, holds — including FedReMa's "flat within 2.5" (range 2.04), FedKA's α = 0.05 gap of 0.4, FedCOM's matching
    at 94.5 vs 94 and FedReMa's 0.5 over FedPAC, which the old rule (each bound moved by τ) left inconclusive."""
    checked = 0
    for paper in papers():
        pc = load(paper)
        for c in pc.claims:
            assert paper_problems(pc, c) == [], (paper, c.id)
            checked += bool(c.paper)
    assert checked >= 20


# ---- issue #52: ties of two diverged runs, identical runs ---------------------------------------------------------


def test_a_seed_where_both_runs_diverged_is_left_out_not_a_tie():
    """Both runs of a − b diverged on seeds 0–2 (each counts as worst = 0, so the old rule read q = 0 there — a
    "tie"): with seeds 3 and 4 at +3.5 and −3.0 the equivalence |a − b| < 2.5 "held" on q = 0, 0, 0, 3.5, −3.0
    (interval [−2.09, +2.29] inside ±2.5) although both real seeds lie outside the bound. Left out, the test has n = 2
    (mean 0.25, sd 4.596): inconclusive, its reason naming the seeds. A seed where only one run diverged still counts
    that run as worst: a diverged on seed 1 alone gives q_1 = 0 − 60."""
    nan = math.nan
    data = rows(a=[nan, nan, nan, 63.5, 57.0], b=[nan, nan, nan, 60.0, 60.0])
    out = judge("|a - b| < 2.5", data)
    [t] = out.tests
    assert (t.n, t.tied) == (2, [0, 1, 2]) and out.verdict == INCONCLUSIVE
    assert (t.mean, t.sd) == (pytest.approx(0.25), pytest.approx(math.sqrt(2 * 3.25**2)))
    assert "seeds 0, 1, 2 left out: both runs diverged" in t.reason
    assert judge("|a - b| < 2.5", data, two_looks=True).verdict == INCONCLUSIVE
    one = judge("a > b", rows(a=[61.0, nan, 62.0, 60.5, 61.5], b=[60.0] * 5)).tests[0]
    assert one.per_seed[1] == -60.0 and one.n == 5 and not one.tied
    ecl = rows(a=[nan, nan, nan, 41.6, nan], b=[nan, nan, nan, 40.0, nan])  # ECL cpu ecl_helps_scaffold's pattern
    out = judge("a > b", ecl, two_looks=True)
    assert out.verdict == INCONCLUSIVE and out.look == 2 and out.tests[0].n == 1
    assert out.tests[0].power() is None and out.tests[0].mde() is None  # no "could detect ≥ 0.97, power 100 %"


def test_identical_runs_are_no_evidence_either_way():
    """a − b = 1.25 exactly on every seed (sd 0): the old rule read se = 0 as an exact mean — "holds", p = 0. Two
    arms equal on every seed (FedReMa's δ = 0.1 and 0.5 runs, where the CCP never ends) "held" a flat claim and read
    as "no difference, p = 0". Now each is inconclusive, "identical on every seed", with no power or detectable
    effect; one seed off by 0.5 makes it a test again."""
    a = [60.0, 61.5, 59.0, 62.0, 60.5]
    out = judge("a > b", rows(a=a, b=[x - 1.25 for x in a]))
    [t] = out.tests
    assert (t.sd, t.p_holds, out.verdict) == (0.0, 1.0, INCONCLUSIVE)
    assert "identical on every seed" in t.reason and t.power() is None and t.mde() is None
    assert judge("a > b", rows(a=a, b=a)).verdict == INCONCLUSIVE  # not "no difference"
    flat = {"a": {c: dict(zip(SEEDS, a)) for c in ("0.1", "0.5")}}
    assert judge("a flat within 2.5", flat, cols=["0.1", "0.5"]).verdict == INCONCLUSIVE
    assert judge("a flat within 2.5", flat, cols=["0.1", "0.5"], two_looks=True).verdict == INCONCLUSIVE
    off = rows(a=a, b=[x - 1.25 for x in a[:4]] + [a[4] - 1.75])
    assert judge("a > b", off).verdict == HOLDS


def test_an_effect_inside_the_tolerance_is_no_difference_not_holds():
    """Issue #52: FedKA medium less_forgetting_missing — the interval [−0.0079, −0.0039] lay below 0 *and* inside
    ±τ = 0.02, and the old rule said "holds" (it checked holds before τ). Five paired differences −0.0050, −0.0070,
    −0.0045, −0.0065, −0.0060 (mean −0.0058, sd 0.00104): below 0 with p = 1.2e-4, but within 0 ± 0.02 — "no
    difference", its reason saying the effect is real but under τ. The same numbers ×10 (mean −0.058) leave ±τ: holds.
    The printed power follows: at a true effect of −0.01 (half of τ) and sd 0.001 "holds" is nearly impossible (it
    was ~1), and chance() with τ equals the rule simulated (the "no difference" region removed from "holds")."""
    q = [-0.0050, -0.0070, -0.0045, -0.0065, -0.0060]
    data = rows(a=q, b=[0.0] * 5)
    out = judge("a < b", data, tolerance=0.02)
    [t] = out.tests
    assert t.p_holds < 2e-4 and t.hi < 0 and out.verdict == NO_DIFFERENCE
    assert "below 0, but by less than τ" in t.reason
    assert judge("a < b", data, tolerance=0.02, two_looks=True).verdict == NO_DIFFERENCE
    assert judge("a < b", rows(a=[10 * x for x in q], b=[0.0] * 5), tolerance=0.02).verdict == HOLDS
    assert judge("a < b", data, tolerance=0.0).verdict == HOLDS  # τ = 0: nothing is too small
    assert chance("<", 0.0, -0.01, 0.001, 5, ALPHA, 0.02) < 1e-6 < 0.99 < chance("<", 0.0, -0.01, 0.001, 5)
    rng = np.random.default_rng(52)
    for mu, sd in ((0.3, 0.4), (0.8, 0.5), (-0.6, 0.3)):
        op = ">" if mu > 0 else "<"
        got = holds_rate(op, 0.0, mu, sd, rng, tolerance=0.5)
        want = seq_chance(op, 0.0, mu, sd, 0.5)
        assert got == pytest.approx(want, abs=3 * math.sqrt(want * (1 - want) / R) + 0.003), (mu, sd)
        one = rate(
            judge(
                f"a {op} b",
                {
                    "a": {None: {s: mu + sd * rng.standard_normal(R) for s in SEEDS}},
                    "b": {None: dict.fromkeys(SEEDS, 0.0)},
                },
                tolerance=0.5,
            ).verdict,
            HOLDS,
        )
        want = chance(op, 0.0, mu, sd, 5, ALPHA, 0.5)
        assert one == pytest.approx(want, abs=3 * math.sqrt(want * (1 - want) / R) + 0.002), (mu, sd)


# ---- issue #52 item 7: the chance that a whole claim holds --------------------------------------------------------


def _observed_test(label, values, paper, op=">", bound=0.0):
    from fedbench.claims.predicates import Test

    return Test(label, dict(zip(SEEDS, values)), op, bound, paper=paper)


def test_the_chance_a_claim_holds_is_the_rule_on_seeds_drawn_at_the_papers_effects():
    """A chain a > b > c (3 tests sharing names, so correlated) observed on 5 seeds, each test with a paper gap near
    its 80 % power: per-test power says ~80 % each, the claim holds far less often. looks.hold_chance (fixed draws)
    agrees with the rule itself — predicates.evaluate on R replications, both looks, Holm — run on seeds drawn normal
    with the paper's means and the observed covariance; one test's chance is its power (seq_chance); a pilot's
    covariance at the 80 % upper bound on σ lowers the chance; seeds_to_hold finds the fewest seeds for 80 % in one
    look, matching the noncentral-t power of one test (chance at n − 1 < 0.8 <= at n)."""
    from fedbench.claims.looks import hold_chance, seeds_to_hold
    from fedbench.claims.predicates import sd_upper

    a, b, c = (
        np.array([61.0, 63.5, 60.2, 62.8, 61.9]),
        np.array([59.8, 61.0, 59.9, 60.1, 60.7]),
        np.array([58.1, 60.2, 57.0, 59.9, 58.6]),
    )
    tests = [
        _observed_test("a − b", a - b, 1.6),
        _observed_test("a − c", a - c, 3.0),
        _observed_test("b − c", b - c, 1.4),
    ]
    got = hold_chance(tests, 0.5, 5)
    # the rule on R replications drawn from the same model: a, b, c per seed with the observed covariance of the
    # differences, i.e. draw the 3 differences jointly (a − c = (a − b) + (b − c) keeps them consistent)
    q = np.stack([a - b, b - c])
    dev = q - q.mean(1, keepdims=True)
    rng = np.random.default_rng(11)
    z = np.einsum("in,nsr->isr", dev, rng.standard_normal((5, 5, R))) / 2.0  # √(n − 1) = 2
    ab, bc = 1.6 + z[0], 1.4 + z[1]
    cc = {s: np.zeros(R) for s in SEEDS}
    data = {"a": {None: {s: ab[s] + bc[s] for s in SEEDS}}, "b": {None: {s: bc[s] for s in SEEDS}}, "c": {None: cc}}
    want = rate(evaluate(parse("a > b > c"), data, [None], SEEDS, 0.5).verdict, HOLDS)
    assert got == pytest.approx(want, abs=0.03), (got, want)  # 4000 fixed draws (se <= 0.008) vs R
    one = [_observed_test("a − b", a - b, 1.6)]
    sd = float(np.std(a - b, ddof=1))
    assert hold_chance(one, 0.5, 5) == pytest.approx(seq_chance(">", 0.0, 1.6, sd, 0.5), abs=0.025)
    assert hold_chance(one, 0.5, 5) > got  # three tests at once hold less often than one of them
    pilot = [_observed_test("a − b", (a - b)[:2], 1.6)]
    sd2 = float(np.std((a - b)[:2], ddof=1))
    assert hold_chance(pilot, 0.5, 5, pilot=True) == pytest.approx(
        seq_chance(">", 0.0, 1.6, sd_upper(sd2, 2), 0.5), abs=0.025
    )
    assert hold_chance(pilot, 0.5, 5, pilot=True) < hold_chance(pilot, 0.5, 5)
    n = seeds_to_hold(one, 0.5)
    assert chance(">", 0.0, 1.6, sd, n - 2, ALPHA, 0.5) < POWER < chance(">", 0.0, 1.6, sd, n + 1, ALPHA, 0.5)
    assert hold_chance([_observed_test("a − b", a - b, None)], 0.5, 5) is None  # no paper number: no chance
