"""A report's outputs: Markdown, CSV, the rich table on the terminal, and a W&B run holding the table."""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

from .runs import RunRecord, _select
from .tables import Report

# ---- output ----------------------------------------------------------------------------------------------------


def to_markdown(rep: Report, pictures: list[Path], sources: list[str]) -> str:
    t, head = rep.table, rep.header()
    md = [
        f"# {t.title}",
        "",
        f"Runs: {', '.join(f'`{s}`' for s in sources)}. {rep.seeds_note()}"
        + (" Accuracies in %." if any(t.percent(n) for n in t.metrics) else ""),
        *(["", f"Protocol: {rep.protocol}."] if rep.protocol else []),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" + "---:|" * (len(head) - 1),
    ]
    md += ["| " + " | ".join(x.replace("|", "\\|") for x in line) + " |" for line in rep.lines()]
    if rep.comparison_notes():
        md += ["", "n/c = not compared with the paper:", ""] + [f"- {n}" for n in rep.comparison_notes()]
    if rep.grid_notes():
        md += ["", "Cells marked `[key=value of n]` show the best value of a grid of n (mean over seeds):", ""]
        md += [f"- {n}" for n in rep.grid_notes()]
    if rep.warnings():
        md += [""] + [f"**Warning:** {w}" for w in rep.warnings()]
    if rep.incomplete():
        md += ["", "Runs without a result:", ""]
        md += [f"- {r.status}: `{r.path or _job(r)}`" + (f" — {r.error}" if r.error else "") for r in rep.incomplete()]
    if pictures:
        md += [""] + [f"![{p.stem}]({p.name})" for p in pictures]
    return "\n".join(md) + "\n"


def _job(r: RunRecord) -> str:
    return ",".join(f"{k}={v}" for k, v in r.overrides.items())


CSV_FIELDS = [
    "table",
    "row",
    "row_label",
    "column",
    "metric",
    "ours_mean",
    "ours_std",
    "ours_min",
    "ours_max",
    "n",
    "n_runs",
    "seeds",
    "values",
    "status",
    "cell",
    "paper",
    "diff",
    "not_compared",
    "grid_key",
    "grid_value",
    "grid",
]


def to_csv(rep: Report) -> str:
    """One line per cell (tidy): our mean/std/min/max over the n runs with a value, why the others have none."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_FIELDS)
    w.writeheader()
    for row in rep.row_keys:
        for c in rep.columns:
            cell, p = rep.cells[(row, c.key)], rep.paper(row, c)
            w.writerow(
                {
                    "table": rep.table.stem,
                    "row": row,
                    "row_label": rep.row_names[row],
                    "column": c.header,
                    "metric": c.metric,
                    "ours_mean": _csvnum(cell.mean),
                    "ours_std": _csvnum(cell.std),
                    "ours_min": _csvnum(min(cell.values, default=None)),
                    "ours_max": _csvnum(max(cell.values, default=None)),
                    "n": len(cell.values),
                    "n_runs": cell.n_runs,
                    "seeds": ";".join(map(str, cell.seeds)),
                    "values": ";".join(repr(v) for v in cell.values),
                    "status": ";".join(f"{k}={n}" for k, n in cell.other.items()),
                    "cell": cell.text(rep.digits[c.key]),
                    "paper": "" if p == "absent" else rep.paper_text(row, c),
                    "diff": _csvnum(rep.diff(row, c)),
                    "not_compared": (rep.not_comparable(c) or "") if p != "absent" else "",
                    **_grid_fields(rep.grid(row, c)),
                }
            )
    return buf.getvalue()


def _grid_fields(choice) -> dict:
    """A tuned cell's grid key, the value shown and every grid value's mean selection metric (``v=score;...``)."""
    if choice is None:
        return {"grid_key": "", "grid_value": "", "grid": ""}
    return {
        "grid_key": choice.key,
        "grid_value": "" if choice.chosen is None else choice.chosen,
        "grid": ";".join(f"{v}={'' if s is None else repr(s)}" for v, s in choice.scores.items()),
    }


def _csvnum(x) -> str:
    return "" if x is None else repr(float(x))


def print_rich(rep: Report, console=None) -> None:
    """The table on the terminal. When it is wider than the terminal it is printed in several parts (the row names
    repeated, a metric with its paper and Δ columns kept together), so that no number is ever cut or wrapped."""
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    console = console or Console(width=max(100, shutil.get_terminal_size((180, 40)).columns))
    lines = rep.lines()
    groups, i = [], 1  # per column: its cells' positions in a line
    for c in rep.columns:
        n = 3 if rep.has_paper(c) else 1
        groups.append((c, list(range(i, i + n))))
        i += n
    head = rep.header()

    def width(j):  # a column's text width + rich's padding (2) and border (1)
        return max(len(head[j]), *(len(line[j]) for line in lines)) + 3 if lines else len(head[j]) + 3

    parts, room = [[]], console.width - width(0) - 2
    for g in groups:
        w = sum(width(j) for j in g[1])
        if parts[-1] and sum(width(j) for _, js in parts[-1] for j in js) + w > room:
            parts.append([])
        parts[-1].append(g)
    if rep.protocol:  # what the accuracies are (docs/protocol.md), above the table
        console.print(Text.assemble(("protocol", "cyan"), f": {rep.protocol}"))
    for k, part in enumerate(parts):
        title = rep.table.title + (f" ({k + 1}/{len(parts)})" if len(parts) > 1 else "")
        rt = RichTable(title=Text(title), caption=Text(rep.seeds_note()) if k == len(parts) - 1 else None)
        rt.add_column(Text(head[0]), no_wrap=True)
        for c, js in part:
            rt.add_column(Text(head[js[0]]), justify="right", no_wrap=True)
            for j in js[1:]:
                rt.add_column(head[j], justify="right", style="dim", no_wrap=True)
        for row, line in zip(rep.row_keys, lines):
            styled = [Text(line[0])]
            for c, js in part:
                cell = rep.cells[(row, c.key)]
                style = "red" if "failed" in cell.other else "yellow" if cell.other or not cell.n_runs else ""
                styled += [Text(line[js[0]], style=style)] + [Text(line[j]) for j in js[1:]]
            rt.add_row(*styled)
        console.print(rt)
    for note in rep.comparison_notes():
        console.print(Text.assemble("  ", ("n/c", "yellow"), f" {note}"))
    for r in rep.incomplete():
        console.print(
            Text.assemble("  ", (r.status, "yellow"), f": {r.path or _job(r)}" + (f" — {r.error}" if r.error else ""))
        )
    for note in rep.grid_notes():
        console.print(Text.assemble("  ", ("best of grid", "cyan"), f": {note}"))
    for warning in rep.warnings():
        console.print(Text.assemble("  ", ("warning", "red"), f": {warning}"))


# ---- W&B --------------------------------------------------------------------------------------------------------


def wandb_mode(requested: str | None, rep: Report) -> str:
    """``--wandb MODE`` wins; otherwise the runs' own ``logger.wandb.mode`` (auto = online with an API key)."""
    from ..loggers import wandb_mode as resolve

    if requested is None:
        modes = [_select(r.config, "logger.wandb.mode") for r, _ in rep.members if r.status == "complete"]
        requested = next((m for m in modes if m and m != "disabled"), "disabled")
    return "disabled" if requested == "disabled" else resolve(requested)


def log_wandb(rep: Report, pictures: list[Path], out: Path, mode: str, group: str) -> str:
    """One W&B run (job_type ``report``) with the table as a ``wandb.Table`` and the pictures."""
    import wandb

    run0 = next((r for r, _ in rep.members if r.status == "complete"), rep.members[0][0])
    w = _select(run0.config, "logger.wandb") or {}
    run = wandb.init(
        project=w.get("project") or "fedbench",
        entity=w.get("entity"),
        group=group,
        job_type="report",
        name=f"report-{rep.table.stem}",
        dir=str(out),
        mode=mode,
        config={"table": rep.table.spec},
        reinit="finish_previous",
        settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
    )
    rows = list(csv.reader(io.StringIO(to_csv(rep))))
    run.log(
        {
            f"report/{rep.table.stem}": wandb.Table(columns=rows[0], data=rows[1:]),
            **{f"report/{p.stem}": wandb.Image(str(p)) for p in pictures},
        }
    )
    run.finish()
    return run.id
