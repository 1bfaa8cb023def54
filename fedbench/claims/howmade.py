"""The claims page's "How these numbers were made", scale by scale: the commands, the experiments' multiruns, and
where the runs were made (commit, dates, machine, compute time) as the committed records say, else as the
``fedbench-claims run`` launches do. It reads back what fedbench/provenance.py stamps on a run as it is made."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .plan import page_note
from .results import launches, sweep_dir
from .spec import PaperClaims
from .text import duration


def how_made(
    pc: PaperClaims, scale: str, runs_root: Path, commands: dict, records: Path | None = None, chances=None
) -> list[str]:
    """The scale's part of the page's "How these numbers were made" (``chances``: the plan note's chances to hold), an
    absolute ``--runs`` directory shown as ``<runs>``."""
    md = _provenance_lines(pc, scale, runs_root, commands, records, chances)
    if runs_root.is_absolute():
        md.insert(-1, "* `<runs>` = the `--runs` directory the runs were made in (default `outputs/claims`).")
    return [_shown(line, runs_root) for line in md]


def compute_time(pc: PaperClaims, scale: str, runs_root: Path, records: Path | None = None) -> float:
    """The compute time of a scale's runs, in seconds, for the page's summary: the records' own (the page rebuilds from
    them alone), else the wall time of the ``fedbench-claims run`` launches."""
    recorded = _recorded(records, scale)
    if recorded:
        return _wall(recorded)
    return sum(r.get("seconds", 0) for r in launches(sweep_dir(runs_root, scale, pc.paper)))


def _recorded(records: Path | None, scale: str) -> list[dict]:
    import json

    if records is None or not Path(records).exists():
        return []
    return [r for r in map(json.loads, Path(records).read_text().splitlines()) if r["scale"] == scale]


def _counted(values) -> str:
    return ", ".join(f"{v} ({n} run{'s' * (n > 1)})" for v, n in Counter(values).most_common())


def _wall(recs: list[dict]) -> float:
    """The compute time of recorded runs (their summaries' ``wall_time``), in seconds."""
    return sum(float((r.get("summary") or {}).get("wall_time") or 0) for r in recs)


def _from_records(recs: list[dict], path: Path) -> list[str]:
    """Where the recorded runs were made: from the records alone, so that the page is rebuilt byte for byte."""
    dates = sorted(r["started"][:10] for r in recs if r.get("started"))
    wall = _wall(recs)
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


def _shown(text: str, runs_root: Path) -> str:
    """A committed page names no machine's path: an absolute ``--runs`` directory is shown as ``<runs>``."""
    if not runs_root.is_absolute():
        return text
    return text.replace(str(runs_root.resolve()), "<runs>").replace(str(runs_root), "<runs>")


__all__ = ["compute_time", "how_made"]
