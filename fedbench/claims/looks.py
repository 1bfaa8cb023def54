"""The two-look rule's own numbers (issue #51; the rule: fedbench/claims/predicates.py, docs/claims.md): the runs it
saves at the committed pages' observed effects and sds, as the table docs/claims.md prints.

    python -m fedbench.claims.looks        # the table, from the committed records (docs/results/<paper>/runs.jsonl)

For every claim judged at a scale of 5 seeds: its tests on the seeds that have every run (5, or the first 3), their
observed means and covariance; the chance that look 1 decides the claim is the rule at look 1 (α1, Holm over the
claim's tests) on :data:`DRAWS` sets of 3 seeds drawn normal with those means and that covariance (fixed random
numbers: the table is reproducible). A decided claim saves the runs of seeds 3 and 4: 2 per cell (name × swept
value) it reads. Runs a claim shares with another count in each, as the pages' run counts do.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .predicates import ALPHAS, DECISIVE, LOOKS, Test, evaluate, judge, needed

DRAWS = 4000  # simulated look-1 data per claim (Monte-Carlo se of a stopping chance <= 0.008)


def stop_chance(tests: list[Test], tolerance: float, rng) -> float:
    """P(look 1 decides the claim) if its tests' per-seed values were normal with the observed means and covariance:
    each draw is mean + Σ_s c_s·(q_s − mean)/√(n − 1) over the n observed seeds, c ~ N(0, 1) — the sample covariance
    exactly, the tests' correlation (a chain's shared names) kept. Fewer than 2 seeds with every test: 0."""
    q = np.array([[t.per_seed[s] for s in sorted(t.per_seed, key=str)] for t in tests], dtype=float)  # tests × n
    q = q[:, ~np.isnan(q).any(0)]  # a seed some test leaves out (both runs diverged) is left out of all
    if q.shape[1] < 2:
        return 0.0
    mean, dev = q.mean(1, keepdims=True), q - q.mean(1, keepdims=True)
    c = rng.standard_normal((q.shape[1], LOOKS[0], DRAWS))  # per observed seed, per drawn seed, per draw
    drawn = mean[:, :, None] + np.einsum("in,nkr->ikr", dev, c) / math.sqrt(q.shape[1] - 1)  # tests × 3 × draws
    sim = [Test(t.label, dict(enumerate(drawn[i])), t.op, t.bound, t.at) for i, t in enumerate(tests)]
    return float(np.isin(judge(sim, tolerance, ALPHAS[0]), DECISIVE).mean())


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
    from . import committed_records
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

    from . import default_out
    from .spec import papers

    scales = {}
    for paper in papers():
        with (default_out() / f"{paper}.csv").open() as f:
            scales[paper] = list(dict.fromkeys(r["scale"] for r in csv.DictReader(f)))
    print(table(savings(scales)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
