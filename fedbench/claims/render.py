"""A paper's claims page: the verdict table (printed with rich, Markdown, CSV), one picture per claim and scale, how
the runs were made (commands, commit, dates, machine, wall time), and a W&B run holding the table."""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from pathlib import Path
from textwrap import fill

import numpy as np

from ..report.tables import fmt, path_words
from .looks import DRAWS, MOST_SEEDS, hold_chance, seeds_to_hold
from .plan import HOLD_FROM, first_chance, page_note
from .predicates import (
    ALPHA,
    ALPHAS,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    LOOKS,
    NEEDS_DATA,
    NO_DIFFERENCE,
    NOT_COMPARABLE,
    NOT_RUN,
    POWER,
    VERDICTS,
    Outcome,
    Test,
    level,
    sd_upper,
)
from .results import ClaimResult, launches, sweep_dir
from .spec import PaperClaims

STYLE = {
    HOLDS: "green",
    FAILS: "red",
    NO_DIFFERENCE: "cyan",
    INCONCLUSIVE: "yellow",
    NOT_RUN: "dim",
    NOT_COMPARABLE: "dim",
    NEEDS_DATA: "dim",
}


# ---- text of one result ----------------------------------------------------------------------------------------


def _num(x, digits: int) -> str:
    return fmt(x, digits) if x is not None else ""


def _key(res: ClaimResult) -> str:
    return res.claim.over.split(":")[-1].split(".")[-1]


def _paper_cols(res: ClaimResult) -> list:
    return list(dict.fromkeys(k for v in res.claim.paper.values() if isinstance(v, dict) for k in v))


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
        v = c.paper.get(row)
        v = v.get(col) if isinstance(v, dict) else v
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


def picture_name(res: ClaimResult) -> str:
    return f"{res.claim.id}_{res.scale}.png"


# ---- pictures --------------------------------------------------------------------------------------------------


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


def _finite(values) -> list:
    """The values that are numbers (a diverged run's NaN is drawn as no point; the tests count it as the worst)."""
    return [v for v in values if math.isfinite(v)]


def _isnum(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _paper(res: ClaimResult, row: str, col):
    v = res.claim.paper.get(row)
    return v.get(col) if isinstance(v, dict) else v


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


# ---- the table: rich, Markdown, CSV ----------------------------------------------------------------------------

HEADER = [
    "claim",
    "paper",
    "fedbench (mean ± std over seeds)",
    "verdict",
    "can hold (at the paper's effects)",
    "scale",
    "wall time",
]


def line(res: ClaimResult) -> list[str]:
    h = hold(res)
    return [
        f"{res.claim.id}: {res.claim.claim} ({said(res.claim)})",
        paper_text(res),
        ours_text(res),
        row_verdict(res),
        "" if h is None else f"{100 * h['chance']:.0f} %" + (" (pilot)" if h["pilot"] else ""),
        res.scale,
        duration(res.seconds),
    ]


def hold(res: ClaimResult) -> dict | None:
    """Issue #52 item 7: the chance the whole claim holds on the scale's seeds if every test's true effect were the
    paper's (looks.hold_chance: the observed paired covariance of the judged tests — of a pilot's, at its 80 % upper
    bound — all tests at once, Holm and the two looks included; one judged test: its power), and where it is under
    50 % the seeds that would reach 80 % in one look (looks.seeds_to_hold). None without tests or paper numbers.
    Computed once per result."""
    if res.hold is None:
        res.hold = _hold(res) or {}
    return res.hold or None


def _hold(res: ClaimResult) -> dict | None:
    out = res.outcome if res.outcome.tests else res.pilot
    if out is None or not out.tests or res.experiment is None:
        return None
    pilot, tests, tol = out is res.pilot, out.tests, res.claim.tolerance
    k = len(res.experiment.scale.seeds)
    chance = tests[0].power() if len(tests) == 1 and not pilot else hold_chance(tests, tol, k, pilot)
    if chance is None:
        return None
    seeds = seeds_to_hold(tests, tol, pilot) if chance < 0.5 else None
    return {"chance": chance, "seeds": seeds, "pilot": pilot, "k": k, "tests": len(tests)}


def hold_line(res: ClaimResult) -> str | None:
    """The chance to hold in words, for the claim's details."""
    h = hold(res)
    if h is None:
        return None
    how = (
        f"its one test's power ({'two looks' if h['k'] == LOOKS[-1] else f'one look at α = {ALPHA:g}'})"
        if h["tests"] == 1 and not h["pilot"]
        else f"all {h['tests']} tests at once, simulated ({DRAWS} draws of {h['k']} seeds, "
        + ("the two looks" if h["k"] == LOOKS[-1] else f"one look at α = {ALPHA:g}")
        + ", Holm) from the "
        + ("pilot's paired covariance at its 80 % upper bound" if h["pilot"] else "observed paired covariance")
    )
    text = (
        f"* Chance to hold: {100 * h['chance']:.0f} % if every test's true effect were the paper's "
        f"{'(its own setting, not this scale) ' if res.scale != 'paper' else ''}— {how}."
    )
    if h["chance"] < 0.5:
        text += (
            ' Under 50 %: this design could rarely say "holds" even if the paper is right, so "inconclusive" or a '
            "failing test here is weak evidence against the paper; "
            + (
                f"{h['seeds']} seeds in one look at α = {ALPHA:g} would reach {100 * POWER:g} %."
                if h["seeds"] is not None
                else f"not even {MOST_SEEDS} seeds in one look would reach {100 * POWER:g} %."
            )
        )
    return text


def print_rich(pc: PaperClaims, results: list[ClaimResult], console=None) -> None:
    import shutil

    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    console = console or Console(width=max(120, shutil.get_terminal_size((180, 40)).columns))
    rt = RichTable(title=Text(f"{pc.title}: claims"), show_lines=True)
    widest_id = max((len(res.claim.id) + 1 for res in results), default=0)  # an id is never cut, at any width
    for h in HEADER:
        rt.add_column(h, overflow="fold", min_width=widest_id if h == HEADER[0] else None)
    for res in results:
        cells = [Text(x) for x in line(res)]
        cells[3].stylize(STYLE.get(res.outcome.verdict, ""))
        rt.add_row(*cells)
    console.print(rt)


CSV_FIELDS = [
    "paper",
    "scale",
    "claim",
    "predicate",
    "said",
    "verdict",
    "look",
    "reason",
    "test",
    "at",
    "bound",
    "n",
    "mean",
    "sd",
    "lo",
    "hi",
    "p_holds",
    "p_fails_holm",
    "p_same_holm",
    "mde",
    "paper_gap",
    "power",
    "per_seed",
    "test_verdict",
    "test_reason",
    "alpha",
    "tolerance",
    "worst",
    "paper_values",
    "fedbench",
    "runs_complete",
    "runs",
    "seconds",
    "hold_chance",
    "hold_seeds_80",
    "scale_runs_complete",
    "scale_runs",
]


def to_csv(paper: str, results: list[ClaimResult]) -> str:
    """One line per test of each claim (a claim without tests: one line): the verdicts, the test's mean, sd (n − 1),
    (1 − 2α) interval, p-values, minimum detectable effect and the paper's gap with the power there, per-seed values."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_FIELDS)
    w.writeheader()
    done = {s: _runs_done([r for r in results if r.scale == s]) for s in dict.fromkeys(r.scale for r in results)}
    for res in results:
        c = res.claim
        base = {
            "paper": paper,
            "scale": res.scale,
            "claim": c.id,
            "predicate": c.predicate.text,
            "said": said(c),
            "verdict": res.outcome.verdict,
            "look": res.outcome.look or "",
            "reason": res.outcome.reason,
            "alpha": repr(ALPHA),
            "tolerance": repr(c.tolerance),
            "worst": repr(c.worst),
            "paper_values": paper_text(res),
            "fedbench": ours_text(res),
            "runs_complete": res.n_complete,
            "runs": res.n_runs,
            "seconds": f"{res.seconds:.1f}",
            "hold_chance": "" if (h := hold(res)) is None else repr(h["chance"]),
            "hold_seeds_80": "" if h is None or h["seeds"] is None else h["seeds"],
            "scale_runs_complete": done[res.scale][0],  # the scale's runs, a run shared by claims once (the page's)
            "scale_runs": done[res.scale][1],
        }
        for t in res.outcome.tests or [None]:
            row = dict(base)
            if t is not None:
                row.update(
                    test=t.label,
                    at=t.at or "",
                    bound=_bound(t),
                    n=t.n,
                    **{k: _repr(getattr(t, k)) for k in ("mean", "sd", "lo", "hi", "p_holds")},
                    p_fails_holm=_repr(t.p_fails),
                    p_same_holm=_repr(t.p_same) if t.op != "within" else "",
                    mde=_repr(t.mde()),
                    paper_gap=_repr(t.gap),
                    power=_repr(t.power()),
                    test_verdict=t.verdict,
                    test_reason=t.reason,
                    alpha=repr(t.alpha),
                    per_seed=";".join(f"{s}:{v!r}" for s, v in sorted(t.per_seed.items(), key=lambda kv: str(kv[0]))),
                )
            w.writerow(row)
    return buf.getvalue()


def _repr(x) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else repr(float(x))


def _bound(t: Test) -> str:
    return f"within ±{t.bound:g}" if t.op == "within" else f"{t.op} {t.bound:g}"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def protocol_lines(pc: PaperClaims) -> list[str]:
    """The evaluation protocols of the paper's experiments (their configs' ``eval.protocol``), each once."""
    from .. import protocol

    lines = []
    for per_scale in pc.experiments.values():
        exp = per_scale.get("paper") or next(iter(per_scale.values()))
        line = protocol.line(exp.compose(), counts=False)
        if line not in lines:
            lines.append(line)
    return lines


def to_markdown(
    pc: PaperClaims,
    results: list[ClaimResult],
    scales: list[str],
    runs_root: Path,
    pictures: dict,
    commands: dict,
    records: Path | None = None,
) -> str:
    """The results page of one paper (docs/results/<paper>.md)."""
    md = [f"# {pc.title}: do the paper's claims hold?", ""]
    if pc.reference:
        md += [pc.reference, ""]
    md += [
        f"Claims as data: `conf/claims/{pc.paper}.yaml`. How a verdict is reached (a seed-paired t-interval, one-sided "
        f"α = {ALPHA:g} spent over two looks — {LOOKS[0]} seeds at α1 = {ALPHAS[0]:.3g}, else {LOOKS[1]} at "
        f"α2 = {ALPHAS[1]:.3g} —, Holm over a claim's tests, equivalence at the paper's bound, power): "
        "[docs/claims.md](../claims.md). Generated by `fedbench-claims report` from the runs; it is not edited by "
        "hand.",
        "",
        *[x for line in protocol_lines(pc) for x in (f"Protocol ([docs/protocol.md](../protocol.md)): {line}.", "")],
        "## Summary",
        "",
        (
            "| scale | claims | holds | fails | no difference | inconclusive | not run | not comparable | needs data "
            "| runs complete | compute time of the runs |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scale in scales:
        mine = [r for r in results if r.scale == scale]
        n = Counter(r.outcome.verdict for r in mine)
        recorded = _recorded(records, scale)
        if recorded:  # the records' own compute times (the page rebuilds from them alone)
            seconds = sum(float((r.get("summary") or {}).get("wall_time") or 0) for r in recorded)
        else:
            seconds = sum(r.get("seconds", 0) for r in launches(sweep_dir(runs_root, scale, pc.paper)))
        complete, total = _runs_done(mine)
        md.append(
            f"| {scale} | {len(mine)} | "
            + " | ".join(str(n.get(v, 0)) for v in VERDICTS)
            + f" | {complete}/{total} | {duration(seconds)} |"
        )
    if len(scales) > 1:  # issue #31: where an effect appears, scale by scale
        md += ["", "## By scale", "", "| claim | " + " | ".join(scales) + " |", "|---|" + "---|" * len(scales)]
        for claim in pc.claims:
            cells = []
            for scale in scales:
                res = next(r for r in results if r.claim.id == claim.id and r.scale == scale)
                counted = f" ({res.n_complete}/{res.n_runs})" if res.experiment else ""
                cells.append(row_verdict(res) + counted)
            md.append(f"| {claim.id} | " + " | ".join(cells) + " |")
        md += [
            "",
            "(complete runs / the runs the claim needs at that scale — a diverged run is an outcome, counted as the "
            "claim's worst value, so a verdict may stand on fewer complete runs; a failed or missing one leaves it "
            "not run; each scale's budget: its note below. Look 1: "
            f"decided on the first {LOOKS[0]} seeds; look 2: on all {LOOKS[1]}.)",
        ]
    md += precision_lines(results, scales)
    md += ["", "## Claims", "", "| " + " | ".join(HEADER) + " |", "|---|---|---|---|---:|---|---:|"]
    for res in results:
        cells = [_md(x) for x in line(res)]
        cells[0] = f"**{res.claim.id}**: {_md(res.claim.claim)} ({said(res.claim)})"
        cells[3] = f"**{cells[3]}**"
        md.append("| " + " | ".join(cells) + " |")
    md += [
        "",
        "(paper): the paper's own words, quoted under Details; (ours): our extension; (paper + ours): the paper's "
        "words read with a bound or a measure of ours, said under Details.",
        "",
        "Wall time = compute time of the claim's runs (training rounds and evaluations, from their "
        "`metrics.jsonl`; start-up and data loading excluded). A run shared by several claims counts in each.",
        "",
    ]
    md += ["## How these numbers were made", ""]
    found: dict = {}  # the plan note's chances to hold: this page's own (never its previous CSV's)
    for res in results:
        if (h := hold(res)) is not None and res.scale in HOLD_FROM:
            found.setdefault(res.claim.id, {})[res.scale] = h["chance"]
    chances = first_chance(found)
    for scale in scales:
        md += _provenance(pc, scale, runs_root, commands.get(scale, {}), records, chances)
    md += ["## Details", ""]
    for res in results:
        md += _details(res, pictures.get((res.claim.id, res.scale)), pictures.get((res.claim.id, res.scale, "gap")))
    return "\n".join(md).rstrip() + "\n"


def precision_lines(results: list[ClaimResult], scales: list[str]) -> list[str]:
    """Issue #32: the cpu-bf16 scale (the cpu scale's runs in bf16 autocast) next to the cpu scale (fp32), claim by
    claim and test by test: does the fast path keep every verdict, and how far does it move each test's margin
    (bf16 − fp32, paired by seed) against the seed-to-seed spread the verdict already has to beat?"""
    if not {"cpu", "cpu-bf16"} <= set(scales):
        return []
    pairs = [
        (a, b)
        for a in results
        if a.scale == "cpu" and a.experiment
        for b in results
        if b.scale == "cpu-bf16" and b.claim.id == a.claim.id
    ]
    done = [(a, b) for a, b in pairs if a.n_runs and a.n_complete == a.n_runs and b.n_runs and b.n_complete == b.n_runs]
    same = sum(a.outcome.verdict == b.outcome.verdict for a, b in done)
    md = [
        "",
        "## bf16 against fp32",
        "",
        f"Of the {len(pairs)} claims, {len(done)} have every run complete in both fp32 (cpu) and bf16 autocast "
        f"(cpu-bf16, the same runs with hardware.precision=bf16): **{same} of {len(done)} verdicts are equal**"
        + (
            f"; different: {', '.join(a.claim.id for a, b in done if a.outcome.verdict != b.outcome.verdict)}."
            if same < len(done)
            else "."
        ),
        "Δ = the test's margin in bf16 minus in fp32, seed by seed (mean [smallest, largest]); sd = the fp32 margin's "
        "seed-to-seed standard deviation.",
        "",
        "| claim | test | fp32: mean [interval] | bf16: mean [interval] | Δ | sd | fp32 verdict | bf16 verdict |",
        "|---|---|---|---|---|---:|---|---|",
    ]
    for a, b in pairs:
        d = a.digits
        for i, t in enumerate(a.outcome.tests or [None]):
            u = b.outcome.tests[i] if t is not None and i < len(b.outcome.tests) else None
            if t is None or u is None or (u.label, u.at) != (t.label, t.at):
                cells = [_md(t and _shown_test(t) or ""), "", "", "", ""]
            else:
                seeds = [
                    k
                    for k in sorted(set(t.per_seed) & set(u.per_seed), key=str)
                    if not math.isnan(t.per_seed[k]) and not math.isnan(u.per_seed[k])
                ]
                delta = [u.per_seed[k] - t.per_seed[k] for k in seeds]
                cells = [
                    _md(_shown_test(t)) + (f" at {t.at}" if t.at else ""),
                    _interval(t, d),
                    _interval(u, d),
                    f"{fmt(float(np.mean(delta)), d, sign=True)} [{fmt(min(delta), d, sign=True)}, "
                    f"{fmt(max(delta), d, sign=True)}]"
                    if delta
                    else "",
                    _num(t.sd, d),
                ]
            verdicts = [a.outcome.verdict, b.outcome.verdict] if i == 0 else ["", ""]
            md.append(f"| {a.claim.id if i == 0 else ''} | " + " | ".join(cells + verdicts) + " |")
    return md


def _interval(t: Test, d: int) -> str:
    if t.n < 1:  # every seed left out (both runs diverged)
        return "—"
    return fmt(t.mean, d, sign=True) + (f" [{fmt(t.lo, d, sign=True)}, {fmt(t.hi, d, sign=True)}]" if t.n > 1 else "")


def _runs_done(results: list[ClaimResult]) -> tuple[int, int]:
    """Complete and expected runs of a scale's claims, a run shared by several claims once."""
    runs: dict = {}
    for r in results:
        runs.update(r.run_ids)
    return sum(runs.values()), len(runs)


def _shown(text: str, runs_root: Path) -> str:
    """A committed page names no machine's path: an absolute ``--runs`` directory is shown as ``<runs>``."""
    if not runs_root.is_absolute():
        return text
    return text.replace(str(runs_root.resolve()), "<runs>").replace(str(runs_root), "<runs>")


def _pilot_line(res: ClaimResult) -> str:
    """The pilot arithmetic (issue #31): each test's paired sd over the seeds that have every run, and the smallest
    gap the scale's seeds would detect at it, next to the paper's gap."""
    from .results import pilot_mde

    k = len(res.experiment.scale.seeds)
    seeds = sorted(next(iter(res.pilot.tests)).per_seed)
    how = f"in two looks ({LOOKS[0]} seeds at α1, else {LOOKS[1]} at α2)" if k == LOOKS[-1] else f"α = {ALPHA:g}"
    parts = []
    d = res.digits
    for t in res.pilot.tests:
        m, m0 = pilot_mde(t, k), pilot_mde(t, k, optimistic=True)
        parts.append(
            f"{t.label}{f' at {t.at}' if t.at else ''}: mean {t.mean:.{d}f}, paired sd {t.sd:.{d}f}"
            + (f" (σ ≤ {sd_upper(t.sd, t.n):.{d}f})" if m is not None else "")
            + (f" → detects ≥ {m:.{d}f} (≥ {m0:.{d}f} if σ were the sd)" if m is not None else "")
            + (f" (the paper's gap {t.gap:.{d}f})" if t.gap is not None else "")
        )
    return (
        f"* Pilot — no verdict (seeds {', '.join(map(str, seeds))} have every run): the smallest gap {k} seeds would "
        f"detect at {100 * POWER:g} % power, {how}, if σ were its {100 * POWER:g} % upper confidence bound from the "
        f"pilot's paired sd ({len(seeds)} seeds understate σ often: the sd alone would be optimistic) — "
        + "; ".join(parts)
    )


def _provenance(
    pc: PaperClaims, scale: str, runs_root: Path, commands: dict, records: Path | None = None, chances=None
) -> list[str]:
    md = _provenance_lines(pc, scale, runs_root, commands, records, chances)
    if runs_root.is_absolute():
        md.insert(-1, "* `<runs>` = the `--runs` directory the runs were made in (default `outputs/claims`).")
    return [_shown(line, runs_root) for line in md]


def _recorded(records: Path | None, scale: str) -> list[dict]:
    import json

    if records is None or not Path(records).exists():
        return []
    return [r for r in map(json.loads, Path(records).read_text().splitlines()) if r["scale"] == scale]


def _counted(values) -> str:
    return ", ".join(f"{v} ({n} run{'s' * (n > 1)})" for v, n in Counter(values).most_common())


def _from_records(recs: list[dict], path: Path) -> list[str]:
    """Where the recorded runs were made: from the records alone, so that the page is rebuilt byte for byte."""
    dates = sorted(r["started"][:10] for r in recs if r.get("started"))
    wall = sum(float((r.get("summary") or {}).get("wall_time") or 0) for r in recs)
    md = [
        f"* Records: `{path.parent.name}/{path.name}`, {len(recs)} run(s) — " + _counted(r["status"] for r in recs),
        "* fedbench commit: " + _counted(f"`{r['commit']}`" if r.get("commit") else "not recorded" for r in recs),
        "* Machine: " + _counted(r.get("machine") or "not recorded" for r in recs),
    ]
    md += [f"* Started: {dates[0]}" + (f" to {dates[-1]}" if dates[-1] != dates[0] else "")] if dates else []
    md += [f"* Compute time of the recorded runs: {duration(wall)}"] if wall else []
    md += [
        f"* Source: {src} ({n} run{'s' * (n > 1)})"
        for src, n in Counter(r["source"] for r in recs if r.get("source")).items()
    ]
    return md


def _provenance_lines(
    pc: PaperClaims, scale: str, runs_root: Path, commands: dict, records: Path | None = None, chances=None
) -> list[str]:
    s = pc.scales.get(scale)
    recorded = _recorded(records, scale)
    recs = [] if recorded else launches(sweep_dir(runs_root, scale, pc.paper))
    md = [f"### {scale} scale", ""]
    if s and s.note:
        md += [s.note, ""]
    if scale == "paper":  # the GPU work this scale still needs, in the order it pays (fedbench/claims/plan.py)
        md += ["**The work left**: " + page_note(pc.paper, scale, records, chances), ""]
    md += [
        f"* Commands: `{commands.get('run', f'fedbench-claims run {pc.paper} --scale {scale}')}` then "
        f"`{commands.get('report', f'fedbench-claims report {pc.paper} --scale {scale}')}`."
    ]
    if recorded:
        md += _from_records(recorded, Path(records))
    elif recs:
        commits = list(dict.fromkeys(r.get("commit", "unknown") for r in recs))
        machines = list(dict.fromkeys(r.get("machine", "unknown") for r in recs))
        dates = sorted(r.get("started", "")[:10] for r in recs if r.get("started"))
        invoked = list(dict.fromkeys(r.get("invoked") for r in recs if r.get("invoked")))
        md += [f"* Launched as: {', '.join(f'`{i}`' for i in invoked)}"] if invoked else []
        md += [
            f"* fedbench commit: {', '.join(f'`{c}`' for c in commits)}",
            f"* Date: {dates[0]}" + (f" to {dates[-1]}" if dates[-1] != dates[0] else ""),
            f"* Machine: {'; '.join(machines)}",
            f"* Wall time of the launches: {duration(sum(r.get('seconds', 0) for r in recs))} "
            f"({len(recs)} launch(es); exit codes {sorted({r.get('exit') for r in recs})})",
        ]
    else:
        md += ["* No `fedbench-claims run` launch is recorded for these runs (no commit, date or machine to report)."]
    md.append("* The experiments (each one multirun; runs shared between experiments are made once):")
    for exp in pc.needed(scale):
        md.append(f"  * `{exp.name}`: `{exp.command(str(sweep_dir(runs_root, scale, pc.paper)))}`")
    return md + [""]


def _details(res: ClaimResult, picture: Path | None, gap: Path | None = None) -> list[str]:
    c = res.claim
    md = [
        f"### {c.id} ({res.scale}): {verdict_text(res.outcome)}",
        "",
        c.claim,
        "",
        f"* Source: {c.source}",
        *([f"* The paper's words: “{c.quote}”"] if c.quote else []),
        *([f"* Ours: {c.ours}"] if c.ours else []),
        f"* Predicate: `{c.predicate.text}` on `{c.metric}`"
        + (f" over `{c.over}`" if c.over else "")
        + (f", where {', '.join(f'`{k}={v}`' for k, v in c.where.items())}" if c.where else "")
        + f"; tolerance τ = {c.tolerance:g} ({c.tolerance_why}); a diverged run counts as {c.worst:g}"
        + (f"; seeds {', '.join(map(str, res.experiment.scale.seeds))}" if res.experiment else ""),
        f"* Verdict: **{res.outcome.verdict}** — {res.outcome.reason}",
        f"* Runs: {res.n_complete} of {res.n_runs} complete"
        + (f" (experiment `{c.experiment}`)" if res.experiment else ""),
    ]
    for name, lacking in sorted(res.adopted.items()):
        md.append(
            f"* Run `{name}` was made by another command than the experiment's and is matched by its config.yaml"
            + (
                f"; it predates the keys {', '.join(f'`{k}`' for k in lacking)} (their defaults are assumed)"
                if lacking
                else ""
            )
        )
    for (row, col), choice in res.tuned.items():
        md.append(
            f"* {res.label(row)}{'' if col is None else f' at {_key(res)} = {col}'}: the paper's grid, chosen on the "
            f"tuning seeds {', '.join(map(str, res.experiment.scale.tune_seeds))} (never on the judged ones): "
            + (choice.describe() if choice.chosen is not None else "not all tuning runs are in")
        )
    if res.pilot is not None:
        md.append(_pilot_line(res))
    if (h := hold_line(res)) is not None:
        md.append(h)
    for path, rows in res.diagnostics.items():
        md.append(
            f"* Diagnostic `{path}` (mean ± std over the complete runs): "
            + "; ".join(
                f"{res.label(row)} {np.mean(v):.3g} ± {np.std(v, ddof=1) if len(v) > 1 else 0:.2g} (n = {len(v)})"
                for row, v in sorted(rows.items())
            )
        )
    absent = [p for p in c.diagnose if p not in res.diagnostics]
    if absent and any(res.cell(r, col) for r in res.rows for col in res.cols):  # runs made before fedbench logged it
        md.append(f"* Diagnostic {', '.join(f'`{p}`' for p in absent)}: not in these runs (logged by newer runs)")
    if c.note:
        md.append(f"* Note: {c.note}")
    if res.outcome.tests:
        md += ["", *test_table(res)]
    if picture is not None:
        md += ["", f"![{c.id} ({res.scale})]({picture.parent.name}/{picture.name})"]
    if gap is not None:
        md += ["", f"![{c.id} ({res.scale}): the gap round by round]({gap.parent.name}/{gap.name})"]
    return md + [""]


def test_table(res: ClaimResult) -> list[str]:
    """One row per test: the per-seed values, the mean with its (1 − 2α) interval, the p-value of the claimed side,
    n, the minimum detectable effect (power POWER at the observed sd; of the two-look design where the claim has its
    5 seeds) next to the paper's gap and the power there. The interval's level is that of the look."""
    d = res.digits
    shown = level(res.outcome.tests[0].alpha)
    md = [
        f"| test | at | per seed | n | mean [{shown} interval] | p | detects (power {100 * POWER:g} %) | "
        "paper's gap | power at the paper's gap | verdict |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for t in res.outcome.tests:
        per = ", ".join(
            f"{s}: {'both diverged' if math.isnan(v) else fmt(v, d, sign=True)}"
            for s, v in sorted(t.per_seed.items(), key=lambda kv: str(kv[0]))
        )
        power = t.power()
        md.append(
            f"| {_md(_shown_test(t))} | {t.at or ''} | {per} | {t.n} | {_interval(t, d)} | "
            f"{t.p_holds:.2g} | {_num(t.mde(), d)} | {_num(t.gap, d)} | "
            f"{'' if power is None else f'{100 * power:.0f} %'} | {t.verdict} |"
        )
    if res.scale != "paper" and any(t.gap is not None for t in res.outcome.tests):
        md += [
            "",
            f"(The paper's gap is measured in the paper's own setting, not this {res.scale} scale's: the power there "
            "is a yardstick of this design, not a prediction of the effect here.)",
        ]
    return md


def said(c) -> str:
    """Whose claim: the paper's words, ours, or the paper's words read with a bound of ours."""
    return "paper + ours" if c.quote and c.ours else "paper" if c.quote else "ours"


def _shown_test(t: Test) -> str:
    return f"|{t.label}| < {t.bound:g}" if t.op == "within" else f"{t.label} {t.op} {t.bound:g}"


# ---- W&B -------------------------------------------------------------------------------------------------------


def log_wandb(pc: PaperClaims, results: list[ClaimResult], pictures: list[Path], out: Path, mode: str) -> str:
    """One W&B run (job type ``claims``) holding the verdict table (the CSV's columns) and the pictures."""
    import wandb

    run = wandb.init(
        project="fedbench",
        job_type="claims",
        name=f"claims-{pc.paper}",
        dir=str(out),
        mode=mode,
        config={"paper": pc.paper, "scales": sorted({r.scale for r in results})},
        reinit="finish_previous",
        settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
    )
    rows = list(csv.reader(io.StringIO(to_csv(pc.paper, results))))
    run.log(
        {
            f"claims/{pc.paper}": wandb.Table(columns=rows[0], data=rows[1:]),
            **{f"claims/{p.stem}": wandb.Image(str(p)) for p in pictures},
        }
    )
    run.finish()
    return run.id


__all__ = [
    "CSV_FIELDS",
    "HEADER",
    "duration",
    "line",
    "log_wandb",
    "ours_text",
    "paper_text",
    "picture_name",
    "plot",
    "print_rich",
    "test_table",
    "verdict_text",
    "to_csv",
    "to_markdown",
]
