"""A paper's claims page as a verdict table: printed with rich, written as CSV and as the Markdown page (its summary,
each claim's details and tests), logged as a W&B table. Its parts in their own rooms: the words of one result
(text.py), the pictures (pictures.py), how the runs were made (howmade.py)."""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from pathlib import Path

import numpy as np

from ..report.tables import fmt
from .howmade import compute_time, how_made
from .looks import DRAWS, MOST_SEEDS, hold_chance, seeds_to_hold
from .plan import HOLD_FROM, first_chance
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
    Test,
    level,
    sd_upper,
)
from .results import ClaimResult
from .spec import PaperClaims
from .text import _key, _num, duration, ours_text, paper_text, row_verdict, verdict_text

STYLE = {
    HOLDS: "green",
    FAILS: "red",
    NO_DIFFERENCE: "cyan",
    INCONCLUSIVE: "yellow",
    NOT_RUN: "dim",
    NOT_COMPARABLE: "dim",
    NEEDS_DATA: "dim",
}


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
        complete, total = _runs_done(mine)
        md.append(
            f"| {scale} | {len(mine)} | "
            + " | ".join(str(n.get(v, 0)) for v in VERDICTS)
            + f" | {complete}/{total} | {duration(compute_time(pc, scale, runs_root, records))} |"
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
        md += how_made(pc, scale, runs_root, commands.get(scale, {}), records, chances)
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
    "line",
    "log_wandb",
    "print_rich",
    "test_table",
    "to_csv",
    "to_markdown",
]
