"""Compact records of the runs a results page uses, committed beside the page (``docs/results/<paper>/runs.jsonl``):
the run dirs stay on the machine that made them, their records travel with the repository, so a later session (or a
reader) rebuilds the page from them and the next machine runs only what is missing.

One JSON line per run: the paper, the scale, how it ended (``status``, ``error``), its identity (the job's
``overrides``, the chosen config groups, the resolved ``config``), its ``summary`` and every numeric per-round value of
``metrics.jsonl`` (what trend, speed and time claims read), with where it was made (``commit``, ``machine``: from its
status.json, or for a run older than those fields, of the ``fedbench-claims run`` launch that started last before it,
else null — never the commit of the process writing the record; ``host``, ``started``, ``updated``: from its
status.json). No checkpoint, model or picture.

    fedbench-claims record <paper> --scale cpu [--runs DIR]     # add the finished runs under DIR to the records

This module is the records file: a run as a record (:func:`record_of`) and back (:func:`load`), :func:`add` to the
file, and where the repository keeps it. Which runs ``fedbench-claims record`` adds is ``fedbench.claims.record``'s:
it finds them as a page does, with fedbench/claims/results.py's ``RunSet`` (which reads this file).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..confdir import CONF_DIR
from ..report.runs import RunRecord
from .spec import SCALES

RECORDS = "runs.jsonl"
ENDED = ("complete", "diverged", "failed")  # a run still running or never started has no record


def records_path(out: Path, paper: str) -> Path:
    return Path(out) / paper / RECORDS


def default_out() -> Path:
    """Where the repository keeps the results pages and, beside each, its records (docs/results)."""
    return CONF_DIR.parent / "docs" / "results"


def committed_records(paper: str) -> Path:
    """The repository's records of a paper's runs (docs/results/<paper>/runs.jsonl)."""
    return records_path(default_out(), paper)


def _numbers(row: dict) -> dict:
    return {
        k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def record_of(run: RunRecord, paper: str, scale: str, launch: dict) -> dict:
    status = {}
    if run.path is not None:
        try:
            status = json.loads((run.path / "status.json").read_text())
        except (OSError, ValueError):
            status = {}
    rounds = {str(r): vals for r, row in sorted(run.rounds().items()) if (vals := _numbers(row))}
    return {
        "paper": paper,
        "scale": scale,
        "status": run.status,
        "error": run.error,
        "overrides": dict(sorted(run.overrides.items())),
        "choices": run.choices,
        "config": run.config,
        "summary": run.summary,
        "rounds": rounds,
        "commit": launch.get("commit"),
        "machine": launch.get("machine"),
        "host": status.get("host"),
        "started": status.get("started"),
        "updated": status.get("updated"),
    }


def _key(rec: dict) -> tuple:
    return rec["scale"], json.dumps(rec["overrides"], sort_keys=True)


def load(path: Path, scale: str | None = None) -> list[RunRecord]:
    """The records of a file (of one scale) as runs, in the file's order."""
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if scale is not None and rec["scale"] != scale:
            continue
        run = RunRecord(None, rec["status"], rec["config"], rec["choices"], rec["overrides"], (0, i), rec["summary"])
        run.error = rec.get("error")
        run.machine = rec.get("machine")
        run._rounds = {int(r): vals for r, vals in rec["rounds"].items()}
        out.append(run)
    return out


def _portable(rec: dict, runs_root: Path) -> dict:
    """A record as the repository may hold it, with no path of the machine that made it: the runs dir in a diverged
    run's error written as ``<runs>`` (the root of ``fedbench-claims run --runs``, default outputs/claims), an
    absolute data folder as ``$FEDBENCH_DATA`` (what it was is results-neutral)."""
    if rec.get("error"):
        error = rec["error"]
        for root in {str(Path(runs_root).resolve()), str(Path(runs_root).absolute())}:
            error = error.replace(root + "/", "<runs>/")
        scales = "|".join(re.escape(x) for x in SCALES)  # written under another --runs (e.g. on a borrowed GPU)
        where = rf"(?<![\w.<])/[^\s;,()]*?/({scales})/{re.escape(rec['paper'])}/"
        rec["error"] = re.sub(where, rf"<runs>/\1/{rec['paper']}/", error)
    config = rec.get("config") or {}
    for node, key in ((config, "data_root"), (config.get("dataset") or {}, "root")):
        if isinstance(node.get(key), str) and node[key].startswith("/"):
            node[key] = "$FEDBENCH_DATA"
    return rec


def add(path: Path, recs: list[dict], runs_root: Path) -> tuple[int, int]:
    """Add (or renew) ``recs`` (:func:`record_of`'s, of runs under ``runs_root``) in the records file ``path``; the
    others' records stay. Returns (records written from ``recs``, records in the file)."""
    existing = {}
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            existing[_key(rec)] = rec
    n, written = 0, set()
    for rec in recs:
        rec = _portable(rec, runs_root)
        n += _key(rec) not in written
        written.add(_key(rec))
        existing[_key(rec)] = rec
    path.parent.mkdir(parents=True, exist_ok=True)
    for rec in existing.values():  # records written before they were made portable
        _portable(rec, runs_root)
    lines = [json.dumps(existing[k], sort_keys=True) for k in sorted(existing)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.replace(path)
    return n, len(lines)


__all__ = ["ENDED", "RECORDS", "add", "committed_records", "default_out", "load", "record_of", "records_path"]
