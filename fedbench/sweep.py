"""A multirun's outcome in one line: each job appends its result to ``<sweep dir>/jobs.jsonl`` (from whatever process
the launcher runs it in), and :class:`SweepSummary` (a Hydra callback, in the launching process) ends the sweep with
``fedbench: 3 of 40 runs failed (...); see status.json in <sweep dir>/: <job dirs>`` and a non-zero exit."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback

SWEEP_FAILED: list[int] = []   # non-empty once a multirun of this process had a failed job (the exit code says so)


def journal(sweep: Path, row: dict) -> None:
    """Append one job's outcome (a short append: atomic across processes)."""
    try:
        with open(Path(sweep) / "jobs.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as e:
        print(f"fedbench: cannot write {Path(sweep) / 'jobs.jsonl'}: {e.strerror}", file=sys.stderr)


class SweepSummary(Callback):
    """Registered in conf/config.yaml (hydra.callbacks.sweep_summary)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        os.environ["FEDBENCH_LAUNCH"] = f"{os.getpid()}-{time.time_ns()}"   # inherited by the launcher's workers

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep = Path(config.hydra.sweep.dir)
        summarize(sweep, _rows(sweep, os.environ.get("FEDBENCH_LAUNCH")))


def _rows(sweep: Path, launch: str | None) -> list[dict]:
    """The journal rows of one launch."""
    try:
        lines = (sweep / "jobs.jsonl").read_text().splitlines()
    except OSError:
        lines = []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("launch") == launch:
            rows.append(row)
    return rows


def lost_jobs(sweep: Path, launch: str) -> None:
    """The launcher stopped the sweep because a job gave it no result (killed, out of memory, preempted and not
    requeued): the summary line, with the jobs of this launch that never reported counted as ``lost`` (their run dir
    was written after the launch began, but they have no journal row)."""
    rows = _rows(sweep, launch)
    seen = {Path(r["dir"]).resolve() for r in rows if r.get("dir")}
    since = int(launch.rsplit("-", 1)[-1]) / 1e9
    for path in sweep.glob("*/status.json"):
        d = path.parent.resolve()
        if d not in seen and path.stat().st_mtime >= since:
            try:
                state = json.loads(path.read_text()).get("status")
            except (OSError, ValueError, AttributeError):
                state = None
            rows.append({"job": None, "dir": str(d), "status": state if state not in (None, "running") else "lost",
                         "error": "no result reached the launcher"})
    if not summarize(sweep, rows):
        print(f"fedbench: the launcher stopped the sweep early; see {sweep}/", file=sys.stderr, flush=True)


def summarize(sweep: Path, rows: list[dict]) -> bool:
    """Print the sweep's summary line if a job failed (and remember it for the exit code); True if it did."""
    bad = sorted((r for r in rows if r.get("status") != "complete"), key=lambda r: r.get("job") or 0)
    if not bad:
        return False
    kinds: dict[str, int] = {}
    for r in bad:
        kinds[r.get("status")] = kinds.get(r.get("status"), 0) + 1
    names = [os.path.relpath(r["dir"], sweep) for r in bad]
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    print(f"fedbench: {len(bad)} of {len(rows)} runs failed ({', '.join(f'{n} {k}' for k, n in kinds.items())}); "
          f"see status.json in {sweep}/: {shown}", file=sys.stderr, flush=True)
    SWEEP_FAILED.append(1)
    return True
