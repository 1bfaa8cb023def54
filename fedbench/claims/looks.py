"""The rule's design numbers, simulated from a claim's observed paired covariance (issue #51, #52; the rule:
fedbench/claims/predicates.py, docs/claims.md): the runs the two looks save, and the chance that a claim can hold.

    python -m fedbench.claims.looks    # the runs-saved table, from the committed records (docs/results/*/runs.jsonl)

Both draw seeds as :func:`_drawn` does: each test's per-seed values normal with given means and the observed
covariance of its tests (a chain's shared names keep the tests correlated), on fixed random numbers so that the pages
rebuild byte for byte.

* **Runs saved** (:func:`savings`): for every claim judged at a scale of 5 seeds, the chance that look 1 decides it
  at its observed means (:func:`stop_chance`, the rule at look 1 on :data:`DRAWS` sets of 3 seeds). A decided claim
  saves the runs of seeds 3 and 4: 2 per cell (name × swept value) it reads. Runs a claim shares with another count in
  each, as the pages' run counts do.
* **The chance to hold** (:func:`hold_chance`): P(the whole claim holds) if every test's true mean were the paper's
  own value — every test at once, Holm and the two looks included — which per-test power does not show: five tests of
  80 % power each hold together far less often. From a pilot (fewer seeds than the first look) the covariance is
  scaled up to the 80 % upper confidence bound on σ² (predicates.sd_upper), as its power is.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .predicates import ALPHA, ALPHAS, DECISIVE, HOLDS, LOOKS, POWER, Test, evaluate, judge, needed, sd_upper

DRAWS = 4000  # simulated seeds per claim (Monte-Carlo se of a chance <= 0.008)
MOST_SEEDS = 64  # the most seeds :func:`seeds_to_hold` looks at


def _observed(tests: list[Test]) -> np.ndarray | None:
    """The tests' per-seed values, tests × n, over the seeds every test has (a seed some test leaves out — both runs
    diverged — is left out of all); None with fewer than 2."""
    q = np.array([[t.per_seed[s] for s in sorted(t.per_seed, key=str)] for t in tests], dtype=float)
    q = q[:, ~np.isnan(q).any(0)]
    return q if q.shape[1] >= 2 else None


def _drawn(q: np.ndarray, mean: np.ndarray, k: int, rng, scale: float = 1.0) -> np.ndarray:
    """tests × k × :data:`DRAWS` values: ``mean`` + Σ_s c_s·(q_s − q̄)/√(n − 1) over the n observed seeds,
    c ~ N(0, 1) — normal with the sample covariance of ``q`` exactly (× ``scale``², its sd × ``scale``)."""
    n = q.shape[1]
    dev = q - q.mean(1, keepdims=True)
    c = rng.standard_normal((n, k, DRAWS))  # per observed seed, per drawn seed, per draw
    return mean[:, None, None] + scale * np.einsum("in,nkr->ikr", dev, c) / math.sqrt(n - 1)


def _sim(tests: list[Test], drawn: np.ndarray) -> list[Test]:
    return [Test(t.label, dict(enumerate(drawn[i])), t.op, t.bound, t.at) for i, t in enumerate(tests)]


def stop_chance(tests: list[Test], tolerance: float, rng) -> float:
    """P(look 1 decides the claim) if its tests' per-seed values were normal with the observed means and covariance
    (:func:`_drawn`). Fewer than 2 seeds with every test: 0."""
    q = _observed(tests)
    if q is None:
        return 0.0
    return float(
        np.isin(judge(_sim(tests, _drawn(q, q.mean(1), LOOKS[0], rng)), tolerance, ALPHAS[0]), DECISIVE).mean()
    )


def _holds(tests: list[Test], drawn: np.ndarray, tolerance: float) -> np.ndarray:
    """Per draw: does the claim hold on the drawn seeds, judged as a scale of that many seeds is (two looks at 5,
    one look at α otherwise)?"""
    k = drawn.shape[1]
    if k != LOOKS[-1]:
        return judge(_sim(tests, drawn), tolerance, ALPHA) == HOLDS
    first = judge(_sim(tests, drawn[:, : LOOKS[0]]), tolerance, ALPHAS[0])
    final = judge(_sim(tests, drawn), tolerance, ALPHAS[1])
    return (first == HOLDS) | (~np.isin(first, DECISIVE) & (final == HOLDS))


def _paper_means(tests: list[Test]) -> np.ndarray | None:
    return None if any(t.paper is None for t in tests) else np.array([float(t.paper) for t in tests])


def _scale(q: np.ndarray, pilot: bool) -> float:
    """1, or for a pilot the 80 % upper confidence bound on σ per unit of sd (predicates.sd_upper)."""
    return sd_upper(1.0, q.shape[1]) if pilot else 1.0


def hold_chance(tests: list[Test], tolerance: float, k: int, pilot: bool = False) -> float | None:
    """P(the claim holds on ``k`` seeds) if each test's true mean were the paper's (``Test.paper``) and the seeds
    normal with the observed covariance (a ``pilot``'s: at its 80 % upper bound); None where a test has no paper
    value or fewer than 2 seeds have every test. Fixed random numbers: the same tests give the same chance."""
    mean, q = _paper_means(tests), _observed(tests)
    if mean is None or q is None:
        return None
    drawn = _drawn(q, mean, k, np.random.default_rng(52), _scale(q, pilot))
    return float(_holds(tests, drawn, tolerance).mean())


def seeds_to_hold(tests: list[Test], tolerance: float, pilot: bool = False, target: float = POWER) -> int | None:
    """The fewest seeds, judged in one look at α, with which the claim holds with probability ≥ ``target`` at the
    paper's effects (as :func:`hold_chance`); None if not within :data:`MOST_SEEDS`. The same random numbers for every
    number of seeds (the first k of :data:`MOST_SEEDS`), so the chance rises with k as it should."""
    mean, q = _paper_means(tests), _observed(tests)
    if mean is None or q is None:
        return None
    drawn = _drawn(q, mean, MOST_SEEDS, np.random.default_rng(52), _scale(q, pilot))

    def ok(k: int) -> bool:
        return _holds(tests, drawn[:, :k], tolerance).mean() >= target

    if not ok(MOST_SEEDS):
        return None
    lo, hi = 1, MOST_SEEDS  # ok(hi); not known at lo (2 seeds are the fewest with an interval)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def claim_savings(res, rng) -> dict | None:
    """One judged claim (a ClaimResult with a verdict at look 1 or 2): its cells, the stopping chance at its observed
    effects, and whether the committed runs stopped at look 1."""
    if res.outcome.look is None or res.experiment is None:
        return None
    c, seeds = res.claim, res.experiment.scale.seeds
    full = [s for s in seeds if all(s in res.cell(row, col) for row, col in _cells(res))]
    paper = {row: {None: v} if not isinstance(v, dict) else v for row, v in c.paper.items()}
    out = evaluate(c.predicate, res.data, res.cols, full, c.tolerance, c.worst, paper, two_looks=False)
    tests = [t for t in out.tests if t.n >= 2]
    if not tests:
        return None
    cells = len(_cells(res))
    return {
        "cells": cells,
        "p": stop_chance(tests, c.tolerance, rng),
        "look": res.outcome.look,
    }


def _cells(res) -> list:
    paper = {row: {None: v} if not isinstance(v, dict) else v for row, v in res.claim.paper.items()}
    return needed(res.claim.predicate, res.cols, paper)


def savings(papers_scales: dict) -> list[dict]:
    """Per paper and scale of 5 seeds: claims judged, runs of seeds 3-4 they read, runs look 1 saved on the committed
    runs, and the expected runs saved at their observed effects. ``papers_scales``: {paper: [scales]}; the committed
    records alone are read (``found=[]``: no run dir joins them)."""
    from .records import committed_records
    from .results import RunSet, evaluate_claim
    from .spec import load

    rows = []
    for paper, scales in papers_scales.items():
        pc = load(paper)
        for scale in scales:
            if scale not in pc.scales or len(pc.scales[scale].seeds) != LOOKS[-1]:
                continue
            rng = np.random.default_rng(51)
            runset = RunSet(pc, scale, Path("outputs/claims"), found=[], records=committed_records(paper))
            judged = [s for c in pc.claims if (s := claim_savings(evaluate_claim(pc, c, runset), rng)) is not None]
            if not judged:
                continue
            late = LOOKS[-1] - LOOKS[0]
            rows.append(
                {
                    "paper": pc.title,
                    "scale": scale,
                    "claims": len(judged),
                    "at_look_1": sum(s["look"] == 1 for s in judged),
                    "late_runs": sum(late * s["cells"] for s in judged),
                    "saved": sum(late * s["cells"] for s in judged if s["look"] == 1),
                    "expected": sum(late * s["cells"] * s["p"] for s in judged),
                    "runs": sum(LOOKS[-1] * s["cells"] for s in judged),
                }
            )
    return rows


def table(rows: list[dict]) -> str:
    """The rows as docs/claims.md's Markdown table, with a total."""
    md = [
        "| paper | scale | claims judged | decided at look 1 | runs of seeds 3–4 | saved (the committed runs) | "
        "expected saved (observed effects) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['paper']} | {r['scale']} | {r['claims']} | {r['at_look_1']} | {r['late_runs']} of {r['runs']} | "
            f"{r['saved']} | {r['expected']:.1f} |"
        )
    total = {k: sum(r[k] for r in rows) for k in ("claims", "at_look_1", "late_runs", "saved", "expected", "runs")}
    md.append(
        f"| all | | {total['claims']} | {total['at_look_1']} | {total['late_runs']} of {total['runs']} | "
        f"{total['saved']} ({100 * total['saved'] / max(1, total['runs']):.0f} %) | {total['expected']:.1f} "
        f"({100 * total['expected'] / max(1, total['runs']):.0f} %) |"
    )
    return "\n".join(md) + "\n"


def main() -> int:
    import csv

    from .records import default_out
    from .spec import papers

    scales = {}
    for paper in papers():
        with (default_out() / f"{paper}.csv").open() as f:
            scales[paper] = list(dict.fromkeys(r["scale"] for r in csv.DictReader(f)))
    print(table(savings(scales)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
