"""Does the paper's claim hold? Each seed paper's claims as data (``conf/claims/<paper>.yaml``), run at a scale and
judged seed-paired (docs/claims.md).

    fedbench-claims run <paper|all> [--scale cpu|paper|smoke] [--runs DIR] [--dry-run] [<neutral overrides>...]
    fedbench-claims report [<paper|all>] [--scale cpu[,paper]] [--runs DIR] [--out DIR] [--wandb [MODE] | --no-wandb]
                           [--pictures pdf,svg]
    fedbench-claims check [<paper|all>]
    fedbench-claims record <paper|all> [--scale cpu|paper|smoke] [--runs DIR] [--out DIR]
    fedbench-claims plan [<paper> ...] [--scale paper] [--markdown] [--each-run]
                         [--measure [--data-root DIR] | --figures]

``run`` launches, per scale and paper, the multiruns the claims need (one ``fedbench -m`` per experiment, all in
``<runs>/<scale>/<paper>``); finished runs are reused and interrupted ones resumed. ``report`` prints, and writes to
``<out>/<paper>.md`` (+ ``.csv``, pictures in ``<out>/<paper>/``), each claim's paper numbers, fedbench's mean ± std
over seeds and its verdict; ``check`` composes every experiment and checks every claim without running anything.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter
from pathlib import Path

from ..errors import ConfigError
from .predicates import VERDICTS, Outcome, Predicate, PredicateError, Test, evaluate, judge, parse
from .records import ENDED, add, committed_records, default_out, record_of, records_path
from .records import load as load_records
from .results import ClaimResult, RunSet, evaluate_claim, launches, sweep_dir
from .runner import run
from .spec import SCALES, ClaimsError, PaperClaims, check, load, papers

RUNS = Path("outputs/claims")


def _papers(name: str | None) -> list[str]:
    if name in (None, "all"):
        return papers()
    if name not in papers():
        raise ClaimsError(f"no claims for {name!r} — one of: all, {', '.join(papers())}")
    return [name]


def report(
    paper: str | PaperClaims,
    scales: list[str],
    runs_root: Path = RUNS,
    out: Path | None = None,
    plots: bool = True,
    wandb: str | None = None,
    console=None,
    commands: dict | None = None,
    records: Path | None = None,
    force: bool = False,
) -> list[ClaimResult]:
    """One paper's page from its runs (those under ``runs_root``, and those of the ``records`` file that no run dir
    holds): printed, written to ``out`` (Markdown, CSV, pictures), logged to W&B."""
    from .pictures import gap_picture_name, picture_name, plot, plot_gaps
    from .render import log_wandb, print_rich, to_csv, to_markdown

    pc = load(paper) if isinstance(paper, str) else paper
    paper = pc.paper
    out = Path(out) if out else default_out()
    results, pictures = [], {}
    for scale in scales:
        runset = RunSet(pc, scale, runs_root, records=records)
        results += [evaluate_claim(pc, claim, runset) for claim in pc.claims]
        if runset.unrecorded:
            print(
                f"fedbench-claims: {len(runset.unrecorded)} {scale}-scale run(s) under {runs_root} have no record in "
                f"{records}, so the page will not rebuild from the repository: `fedbench-claims record {paper} "
                f"--scale {scale}` first",
                file=sys.stderr,
            )
    print_rich(pc, results, console)
    lost = lost_evidence(out / f"{paper}.csv", results)
    if lost and not force:
        raise ClaimsError(
            f"{out / paper}.md not rewritten: it would lose evidence ({'; '.join(lost[:3])}"
            f"{f'; {len(lost) - 3} more' if len(lost) > 3 else ''}): the page counts complete runs that neither "
            f"{runs_root} nor {records or 'a records file'} holds — record them where they are (`fedbench-claims "
            f"record {paper} --scale {lost_scale(lost)} --runs <their dir>`) or make them (`fedbench-claims run "
            f"{paper} --scale {lost_scale(lost)}`); or pass --force to rewrite it with less"
        )
    out.mkdir(parents=True, exist_ok=True)
    for res in results if plots else []:
        png = plot(res, out / pc.paper / picture_name(res))
        if png is not None:
            pictures[(res.claim.id, res.scale)] = png
        gap = plot_gaps(res, out / pc.paper / gap_picture_name(res))  # where it fails: the gap round by round
        if gap is not None:
            pictures[(res.claim.id, res.scale, "gap")] = gap
    for old in sorted((out / paper).glob("*.png")) if plots else []:  # a picture of an earlier page, not this one's
        if old not in pictures.values():
            old.unlink()
    (out / f"{paper}.md").write_text(to_markdown(pc, results, scales, runs_root, pictures, commands or {}, records))
    (out / f"{paper}.csv").write_text(to_csv(paper, results))
    from ..loggers import wandb_mode

    mode = "disabled" if wandb in (None, "disabled") else wandb_mode(wandb)  # auto: online with an API key
    if mode != "disabled":
        try:
            log_wandb(pc, results, list(pictures.values()), out / paper, mode)
        except Exception as e:  # noqa: BLE001  (the files are the report; W&B is a copy)
            print(f"fedbench-claims: W&B logging ({mode}) failed: {type(e).__name__}: {e}", file=sys.stderr)
    return results


def lost_evidence(page_csv: Path, results: list[ClaimResult]) -> list[str]:
    """What a new page would lose against the one at ``page_csv``: a (scale, claim) it has and the new one lacks, or
    has with fewer complete runs ("<scale> <claim>: 2 of the page's 6 complete runs")."""
    import csv

    try:
        rows = list(csv.DictReader(page_csv.open()))
    except OSError:
        return []
    had: dict = {}
    for row in rows:
        had[row["scale"], row["claim"]] = int(row.get("runs_complete") or 0)
    now = {(r.scale, r.claim.id): r.n_complete for r in results}
    return [
        f"{scale} {claim}: {now.get((scale, claim), 0)} of the page's {n} complete runs"
        for (scale, claim), n in had.items()
        if n > now.get((scale, claim), 0)
    ]


def lost_scale(lost: list[str]) -> str:
    return lost[0].split(" ", 1)[0]


def _scales_with_runs(paper: str, runs_root: Path, records: Path | None = None) -> list[str]:
    recorded = {s for s in SCALES if records is not None and load_records(records, s)}
    return [s for s in SCALES if s != "smoke" and (sweep_dir(runs_root, s, paper).is_dir() or s in recorded)]


def summary(out: Path | None = None) -> str:
    """The README's table of verdicts: per paper and scale, how many claims hold, fail, ... — read from the pages'
    CSVs (docs/results/<paper>.csv), so that it says what the pages say (tests/test_claims_pages.py)."""
    import csv

    from .predicates import VERDICTS

    out = Path(out) if out else default_out()
    head = ["paper", "scale", "claims", *VERDICTS, "runs complete (a run shared by claims once)", "page"]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 3) + "---|"]
    for paper in papers():
        path = out / f"{paper}.csv"
        if not path.exists():
            continue
        claims: dict = {}
        with path.open() as f:
            for row in csv.DictReader(f):
                claims.setdefault((row["scale"], row["claim"]), row)
        for scale in [s for s in SCALES if any(k[0] == s for k in claims)]:
            rows = [r for (s, _), r in claims.items() if s == scale]
            counts = Counter(r["verdict"] for r in rows)
            done, total = int(rows[0]["scale_runs_complete"]), int(rows[0]["scale_runs"])  # as the page's summary
            md.append(
                f"| {load(paper).title} | {scale} | {len(rows)} | "
                + " | ".join(str(counts.get(v, 0)) for v in VERDICTS)
                + f" | {done}/{total} | [docs/results/{paper}.md](docs/results/{paper}.md) |"
            )
    return "\n".join(md) + "\n"


def _page_scales(page_csv: Path) -> list[str]:
    """The scales a committed page shows (its CSV), so that a page without runs or records is rebuilt as it is."""
    import csv

    if not page_csv.exists():
        return []
    with page_csv.open() as f:
        return [s for s in dict.fromkeys(row["scale"] for row in csv.DictReader(f)) if s in SCALES and s != "smoke"]


def record(pc: PaperClaims, scale: str, runs_root: Path, out: Path) -> tuple[int, int]:
    """``fedbench-claims record``: add (or renew) in ``out``'s records file of ``pc`` the records of the ended runs of
    its experiments at ``scale`` found under ``runs_root`` (matched to their jobs as the page matches them); the others'
    records stay. Each says where it was made: its status.json's commit and machine, else those of the ``fedbench-claims
    run`` launch that started last before it (fedbench/claims/records.py). Returns (records written from runs here,
    records in the file)."""
    starts = sorted(launches(sweep_dir(runs_root, scale, pc.paper)), key=lambda r: r.get("started", ""))
    rs, recs = RunSet(pc, scale, runs_root), []
    for exp in pc.needed(scale):
        for r in rs.runs(exp):
            if r.path is None or r.status not in ENDED:
                continue
            status = {}
            try:
                status = json.loads((r.path / "status.json").read_text())
            except (OSError, ValueError):
                pass
            before = [x for x in starts if x.get("started", "") <= status.get("started", "")]
            made = status if status.get("commit") else (before[-1] if before else {})
            rec = record_of(r, pc.paper, scale, made)
            rec["overrides"] = dict(sorted((r.job or r.overrides).items()))
            recs.append(rec)
    return add(records_path(out, pc.paper), recs, runs_root)


def plan_command(args) -> int:
    """``fedbench-claims plan``: every name and the scale checked (one line, exit 2) before any work."""
    from .plan import markdown, measure, plan_paper, print_plan

    if args.scale not in SCALES:
        raise ClaimsError(f"--scale {args.scale!r} — one of {', '.join(SCALES)}")
    names = [n for name in args.papers or ["all"] for n in _papers(name)]
    if args.markdown and args.papers:
        raise ClaimsError("--markdown is README's block of every paper: give no paper")
    for name in names:
        if args.scale not in load(name).scales:
            raise ClaimsError(f"--scale {args.scale!r} — {name} has the scales {', '.join(load(name).scales)}")
    if args.measure:
        measure(names, args.scale, args.data_root, log=lambda m: print(f"fedbench-claims: {m}", file=sys.stderr))
    elif args.figures:
        from ..report.runtime import update
        from .plan import conf_dir, gpu_figures_now

        update(conf_dir(), "gpu", {"figures": gpu_figures_now(committed_records)})
    plans = {name: plan_paper(load(name), args.scale, committed_records(name)) for name in names}
    if args.markdown:
        print(markdown(plans, args.scale), end="")
    else:
        print_plan(plans, args.scale, runs=args.each_run)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="fedbench-claims",
        description="Does the paper's claim hold? Run and judge each "
        "seed paper's claims (conf/claims/<paper>.yaml, docs/claims.md).",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run what the claims need at a scale (finished runs are reused)")
    r.add_argument("paper", help=f"all or one of: {', '.join(papers())}")
    r.add_argument("--scale", default="cpu", choices=SCALES)
    r.add_argument("--runs", type=Path, default=RUNS, help=f"where runs go (default {RUNS})")
    r.add_argument("--dry-run", action="store_true", help="print the multiruns, run nothing")
    r.add_argument(
        "--estimate", action="store_true", help="how long the runs still to make take here (measured), run nothing"
    )
    r.add_argument("--only", help="comma list of experiments (default: every one the claims need)")
    r.add_argument("--seeds", help="comma list of the scale's seeds (a pilot; default: all of them)")
    r.add_argument(
        "overrides",
        nargs="*",
        help="results-neutral overrides for every run: data_root=..., "
        "hardware.threads=1, hydra/launcher=parallel, logger=offline, ...",
    )
    p = sub.add_parser("report", help="the verdicts: printed, docs/results/<paper>.md + .csv + pictures")
    p.add_argument("paper", nargs="?", default="all")
    p.add_argument("--scale", help="comma list of scales (default: every scale but smoke that has runs)")
    p.add_argument("--runs", type=Path, default=RUNS, help=f"where the runs are (default {RUNS})")
    p.add_argument(
        "--out",
        type=Path,
        help="where the pages go (default: the repository's docs/results; with the "
        "smoke scale <runs>/smoke/results, so that a smoke check never overwrites a committed page)",
    )
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--pictures", help="also write every picture as pdf and/or svg, e.g. --pictures pdf,svg")
    p.add_argument("--force", action="store_true", help="rewrite a page even if it loses evidence (complete runs)")
    p.add_argument(
        "--wandb",
        nargs="?",
        const="auto",
        choices=["auto", "online", "offline", "disabled"],
        help="also log each page's table to W&B in this mode",
    )
    p.add_argument("--no-wandb", action="store_const", const="disabled", dest="wandb")
    rec = sub.add_parser("record", help="add the ended runs to docs/results/<paper>/runs.jsonl (commit it)")
    rec.add_argument("paper", help=f"all or one of: {', '.join(papers())}")
    rec.add_argument("--scale", default="cpu", choices=SCALES)
    rec.add_argument("--runs", type=Path, default=RUNS, help=f"where the runs are (default {RUNS})")
    rec.add_argument("--out", type=Path, help="where the records go (default: the repository's docs/results)")
    sub.add_parser("summary", help="the README's table of verdicts, from the pages' CSVs")
    pl = sub.add_parser(
        "plan", help="the runs still to make at a scale, their GPU cost (measured) and the order (docs/paper_scale.md)"
    )
    pl.add_argument("papers", nargs="*", metavar="paper", help=f"default: all of {', '.join(papers())}")
    pl.add_argument("--scale", default="paper", help=f"one of {', '.join(SCALES)} (default paper)")
    pl.add_argument("--markdown", action="store_true", help="README's block (all papers) instead of the tables")
    pl.add_argument("--each-run", action="store_true", help="also list every run, seed by seed")
    pl.add_argument(
        "--measure",
        action="store_true",
        help="first store the CPU estimate of each experiment and the GPU figures in conf/runtimes.yaml (needs data)",
    )
    pl.add_argument("--data-root", help="with --measure: where the datasets are (default $FEDBENCH_DATA)")
    pl.add_argument(
        "--figures", action="store_true", help="first store the GPU figures only (no data needed: new GPU records)"
    )
    c = sub.add_parser("check", help="compose every experiment and check every claim; runs nothing")
    c.add_argument("paper", nargs="?", default="all")
    args, rest = ap.parse_known_args(argv)  # overrides may come after the options too
    if rest and (args.command != "run" or any(a.startswith("-") or "=" not in a for a in rest)):
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "run":
        args.overrides += rest
    given = argv if argv is not None else sys.argv[1:]
    named = any(a == "--runs" or a.startswith("--runs=") for a in given)
    if args.command in ("report", "record") and named and not args.runs.is_dir():  # `run` makes it
        print(f"fedbench-claims: --runs {args.runs} — no such directory (omit it for {RUNS})", file=sys.stderr)
        return 2
    invoked = "fedbench-claims " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    try:
        if args.command == "run":
            return max(
                [0]
                + [
                    run(
                        load(name),
                        args.scale,
                        args.runs,
                        args.overrides,
                        args.dry_run,
                        invoked,
                        committed_records(name),
                        args.only.split(",") if args.only else None,
                        _seed_list(args.seeds) if args.seeds else None,
                        args.estimate,
                    )
                    for name in _papers(args.paper)
                ]
            )
        if args.command == "record":
            for name in _papers(args.paper):
                n, total = record(load(name), args.scale, args.runs, args.out or default_out())
                print(
                    f"fedbench-claims: {name} {args.scale}: {n} ended runs recorded; "
                    f"{records_path(args.out or default_out(), name)} holds {total}",
                    file=sys.stderr,
                )
            return 0
        if args.command == "summary":
            print(summary(), end="")
            return 0
        if args.command == "plan":
            return plan_command(args)
        if args.command == "check":
            problems = [msg for name in _papers(args.paper) for msg in check(load(name))]
            for msg in problems:
                print(f"fedbench-claims: {msg}", file=sys.stderr)
            if not problems:
                print(
                    f"fedbench-claims: {', '.join(_papers(args.paper))}: every experiment composes, every claim "
                    "checks out",
                    file=sys.stderr,
                )
            return 1 if problems else 0
        from ..plots import set_formats

        try:
            set_formats(args.pictures)
        except ValueError as e:
            raise ClaimsError(str(e)) from None
        done = 0
        for name in _papers(args.paper):
            named = args.scale.split(",") if args.scale else _scales_with_runs(name, args.runs, committed_records(name))
            for s in named:
                if s not in SCALES:
                    raise ClaimsError(f"--scale {s!r} — one of {', '.join(SCALES)}")
            out = args.out or (args.runs / "smoke" / "results" if "smoke" in named else default_out())
            # the page keeps every scale it shows (issue #53): its evidence is the committed records, so `report
            # <paper> --scale cpu` and `report all` rebuild the committed page byte for byte on a fresh clone
            page = _page_scales(out / f"{name}.csv") if "smoke" not in named else []
            scales = [s for s in SCALES if s in named or s in page]
            if not scales:
                print(
                    f"fedbench-claims: {name}: no runs under {args.runs} (run `fedbench-claims run {name}` first)",
                    file=sys.stderr,
                )
                continue
            commands = {
                s: {
                    "run": f"fedbench-claims run {name} --scale {s}",
                    "report": f"fedbench-claims report {name} --scale {s}",
                }
                for s in scales
            }
            recs = None if "smoke" in scales else committed_records(name)
            report(
                name,
                scales,
                args.runs,
                out,
                not args.no_plots,
                args.wandb,
                commands=commands,
                records=recs,
                force=args.force,
            )
            done += 1
            print(f"fedbench-claims: wrote {out / name}.md (.csv, pictures in {name}/)", file=sys.stderr)
        return 0 if done or args.paper == "all" else 1
    except (ClaimsError, ConfigError) as e:  # ConfigError: --estimate builds each experiment's data
        print(f"fedbench-claims: {e}", file=sys.stderr)
        return 2


def _seed_list(text: str) -> list[int]:
    """``--seeds 0,1``: the seeds as integers, or one line naming the flag, the value and what it takes."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdecimal() for p in parts):  # what int() reads, no sign
        raise ClaimsError(f"--seeds {text!r} — a comma list of seeds, integers >= 0 (e.g. --seeds 0,1)")
    return [int(p) for p in parts]


__all__ = [
    "ClaimResult",
    "ClaimsError",
    "Outcome",
    "PaperClaims",
    "Predicate",
    "PredicateError",
    "RUNS",
    "SCALES",
    "Test",
    "VERDICTS",
    "check",
    "judge",
    "evaluate",
    "evaluate_claim",
    "load",
    "main",
    "papers",
    "parse",
    "report",
    "run",
]
