"""Paper tables from multirun directories: collect the runs, build the table in the paper's layout next to the
paper's numbers, write Markdown/CSV, draw PNGs, log to W&B (docs/report.md).

    fedbench-report outputs/multirun/<sweep> [<more sweeps>] [--out DIR] [--wandb [MODE] | --no-wandb] [--no-plots]
                    [--format rich|markdown] [--metric NAME] [--spread] [--comm X] [--mixed-protocols]
    fedbench-tables [words] [--markdown [PATH]] [--estimate]
                    # every paper table, its commands, its time (docs/tables.md)

Only the run dirs' own files are read (never W&B's servers): ``config.yaml`` (resolved; ``.hydra/config.yaml`` before
a run started), ``.hydra/hydra.yaml`` (chosen group options, job number, overrides), ``status.json``,
``summary.json``, ``metrics.jsonl``, and each sweep's ``multirun.yaml`` (which jobs the sweep should have, so that
never-started jobs are reported as missing). The table comes from the runs' ``table:`` node (docs/experiments.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .catalog import PAPERS, experiment_tables, list_tables, tables_markdown
from .figures import curve_metrics, plot_comm, plot_curves, plot_vs_keys
from .grouping import DERIVED, Table, comm_tables, default_table, group_tables, pooled_keys, swept_tables
from .render import CSV_FIELDS, log_wandb, print_rich, to_csv, to_markdown, wandb_mode
from .runs import NOT_RUN_DIRS, RunRecord, canon, collect, expected_jobs, load_run, neutral_keys
from .tables import Cell, Column, Report
from .words import decimals, fmt

__all__ = [
    "CSV_FIELDS",
    "DERIVED",
    "NOT_RUN_DIRS",
    "PAPERS",
    "Cell",
    "Column",
    "Report",
    "RunRecord",
    "Table",
    "canon",
    "collect",
    "curve_metrics",
    "decimals",
    "default_table",
    "expected_jobs",
    "experiment_tables",
    "fmt",
    "group_tables",
    "list_tables",
    "load_run",
    "log_wandb",
    "main",
    "neutral_keys",
    "plot_curves",
    "plot_vs_keys",
    "print_rich",
    "report",
    "tables_markdown",
    "to_csv",
    "to_markdown",
    "wandb_mode",
]


# ---- entry points --------------------------------------------------------------------------------------------------


def report(
    dirs,
    out: Path | None = None,
    plots: bool = True,
    wandb: str | None = None,
    metric: str | None = None,
    band: str = "minmax",
    console=None,
    fmt: str = "rich",
    split: str | None = None,
    pool: bool = False,
    spread: bool = False,
    comm: float | None = None,
    mixed_protocols: bool = False,
) -> list[tuple[Report, list[Path]]]:
    """Every table found in ``dirs``: printed (``fmt``: a rich table, or the Markdown file's text), written to ``out``
    (default ``<first dir>/report``), plotted, logged. Runs without a table node that would share a cell while they
    differ in a config key (a swept hyperparameter, another dataset, ...) get that key as the table's rows or columns
    (:func:`~.grouping.swept_tables`); those that differ in more keys than two axes hold are refused (ValueError) unless
    ``split`` names a key to make one table per value of, or ``pool`` averages them anyway (with a warning).
    ``spread``: their tables also show the spread of the per-client accuracies (worst 10 %, 10th/50th/90th percentile,
    final). ``comm``: "MB to <comm> % accuracy" and "MB total" columns and a picture of accuracy against MB
    (docs/communication.md). Runs whose evaluation protocols differ in one column are refused (ValueError) unless
    ``mixed_protocols`` (docs/protocol.md)."""
    runs = collect(dirs)
    if not runs:
        raise FileNotFoundError(f"no runs under {', '.join(map(str, dirs))}")
    present = sorted({m for r in runs for m in r.summary.get("metrics", {})})
    if metric is not None and present and metric not in present:
        raise ValueError(f"--metric {metric!r} — no run under {dirs[0]} has it; they have: {', '.join(present)}")
    tables = []
    for table in group_tables(runs, metric, split, spread):
        clash = pooled_keys(table) if table.paper == "runs" and not pool else {}
        swept = swept_tables(table, clash) if clash else [table]
        tables += swept or []
        if not swept:
            shown = "; ".join(f"{k} ({', '.join(v)})" for k, v in list(clash.items())[:3])
            more = f" and {len(clash) - 3} more keys" if len(clash) > 3 else ""
            first = next(iter(clash))
            raise ValueError(
                f"runs of one method and seed differ in {shown}{more}: --split {first} makes one table per value, "
                "--pool averages them anyway"
            )
    if comm is not None:
        tables = [x for t in tables for x in [t, *comm_tables(t, comm)]]
    lines = {id(t): protocol_line(t, mixed_protocols) for t in tables}
    out = Path(out) if out else Path(dirs[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for table in tables:
        rep = Report(table)
        rep.protocol = lines.get(id(table))
        if fmt == "rich":
            print_rich(rep, console)
        pictures = (plot_curves(rep, out, band) + plot_vs_keys(rep, out)) if plots else []
        if plots and comm is not None and not table.spec.get("comm_of"):
            pictures += plot_comm(rep, out)
        md = to_markdown(rep, pictures, [str(d) for d in dirs])
        (out / f"{table.stem}.md").write_text(md)
        if fmt == "markdown":
            print(md)
        (out / f"{table.stem}.csv").write_text(to_csv(rep))
        mode = wandb_mode(wandb, rep)
        if mode != "disabled":
            try:
                log_wandb(rep, pictures, out, mode, group=Path(dirs[0]).resolve().name)
            except Exception as e:  # noqa: BLE001  (the files above are the report; W&B is a copy)
                print(f"fedbench-report: W&B logging ({mode}) failed: {type(e).__name__}: {e}", file=sys.stderr)
        done.append((rep, pictures))
    return done


def protocol_line(table: Table, mixed: bool) -> str | None:
    """The table's evaluation protocol in one line (fedbench/protocol.py), or None for runs made before it existed;
    ValueError when the runs of one column differ in it (unless ``mixed``: the line then names the differences)."""
    from omegaconf import OmegaConf

    from .. import protocol

    by_col: dict = {}
    lines = set()
    for run, _ in table.members:
        if not isinstance((run.config.get("eval") or {}).get("protocol"), dict):
            continue
        cfg = OmegaConf.create(run.config)
        col = canon(run.key(table.cols)) if table.cols else None
        by_col.setdefault(col, {})[f"{canon(run.key(table.rows))}"] = protocol.fields(cfg)
        lines.add(protocol.line(cfg))
    for col, fields in by_col.items():
        diffs = protocol.differences(fields)
        if diffs and not mixed:
            where = f" (column {col})" if col is not None else ""
            raise ValueError(
                f"runs in one column{where} differ in their evaluation protocol — {'; '.join(diffs)}; "
                "--mixed-protocols puts them together anyway"
            )
        if diffs:
            return "mixed protocols: " + "; ".join(diffs)
    return sorted(lines)[0] if len(lines) == 1 else ("; ".join(sorted(lines)) if lines else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="fedbench-report",
        description="Paper tables from multirun directories: "
        "mean ± std over seeds next to the paper's numbers, Markdown/CSV and PNGs (docs/report.md).",
    )
    ap.add_argument("dirs", nargs="+", type=Path, help="multirun dirs (or run dirs, or folders holding them)")
    ap.add_argument("--out", type=Path, help="where report files go (default: <first dir>/report)")
    ap.add_argument("--no-plots", action="store_true", help="tables only")
    ap.add_argument(
        "--wandb",
        nargs="?",
        const="auto",
        choices=["auto", "online", "offline", "disabled"],
        help="log the table to W&B in this mode (default: as the runs' logger.wandb.mode)",
    )
    ap.add_argument("--no-wandb", action="store_const", const="disabled", dest="wandb", help="never log to W&B")
    ap.add_argument("--metric", help="for runs without a table: node, the accuracy metric to show (default pers/acc)")
    ap.add_argument(
        "--band", choices=["minmax", "std"], default="minmax", help="band of the accuracy curves over seeds"
    )
    ap.add_argument(
        "--format",
        choices=["rich", "markdown"],
        default="rich",
        dest="fmt",
        help="print each table as a terminal table (split in parts when wider than the terminal) or as "
        "the Markdown written to <out>/<table>.md",
    )
    ap.add_argument(
        "--split",
        metavar="KEY",
        help="runs without a table: node, one table per value of this config key (dataset.name)",
    )
    ap.add_argument(
        "--pool", action="store_true", help="average runs of one method and seed that differ in a config key anyway"
    )
    ap.add_argument(
        "--spread",
        action="store_true",
        help="runs without a table: node, also the final worst-10 %% and 10th/50th/90th-percentile client accuracy "
        "(and many/medium/few-shot class accuracy on long-tailed data)",
    )
    ap.add_argument(
        "--comm",
        type=float,
        metavar="X",
        help="add the MB each method sent to first reach X %% accuracy and in total, and a picture of accuracy against "
        "MB (docs/communication.md)",
    )
    ap.add_argument(
        "--mixed-protocols",
        action="store_true",
        help="put runs with different evaluation protocols in one column anyway (docs/protocol.md)",
    )
    ap.add_argument("--pictures", help="also write every picture as pdf and/or svg, e.g. --pictures pdf,svg")
    args = ap.parse_args(argv)
    try:
        from ..plots import set_formats

        set_formats(args.pictures)
        done = report(
            args.dirs,
            args.out,
            not args.no_plots,
            args.wandb,
            args.metric,
            args.band,
            fmt=args.fmt,
            split=args.split,
            pool=args.pool,
            spread=args.spread,
            comm=args.comm,
            mixed_protocols=args.mixed_protocols,
        )
    except FileNotFoundError as e:
        print(f"fedbench-report: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"fedbench-report: {e}", file=sys.stderr)
        return 2
    out = args.out or args.dirs[0] / "report"
    print(
        f"fedbench-report: wrote {', '.join(r.table.stem for r, _ in done)} (.md, .csv"
        + (", .png" if any(p for _, p in done) else "")
        + f") to {out}",
        file=sys.stderr,
    )
    return 0
