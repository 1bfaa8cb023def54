"""A multirun says where it is and what it found: each job appends its result to ``<sweep dir>/jobs.jsonl`` (from
whatever process the launcher runs it in), and :class:`SweepSummary` (a Hydra callback) prints the sweep's dir and
its number of jobs first, ``job k/N`` with an ETA for the whole sweep as each job starts, and at the end a table of
its jobs (overrides, status, best, final, time) and the ``fedbench-report <sweep dir>`` line on stdout; if a job
failed, it ends with ``fedbench: 3 of 40 runs failed (...); see status.json in <sweep dir>/: <job dirs>`` on stderr
and a non-zero exit."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback

from . import rundir
from .console import HEADLINE, clock
from .distributed import is_follower
from .loggers import SWEPT, log_sweep_table, swept_keys

SWEEP_FAILED: list[int] = []  # non-empty once a multirun of this process had a failed job (the exit code says so)


def journal(sweep: Path, row: dict) -> None:
    """Append one job's outcome (a short append: atomic across processes); rank 0's alone in a run of several
    processes (fedbench/distributed.py)."""
    if is_follower():
        return
    try:
        with open(Path(sweep) / "jobs.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as e:
        print(f"fedbench: cannot write {Path(sweep) / 'jobs.jsonl'}: {e.strerror}", file=sys.stderr)


class SweepSummary(Callback):
    """Registered in conf/config.yaml (hydra.callbacks.sweep_summary). Silent in ranks > 0 of a run launched over
    several processes (they run the same jobs; rank 0 writes and says everything)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        if is_follower():
            return
        os.environ["FEDBENCH_LAUNCH"] = f"{os.getpid()}-{time.time_ns()}"  # inherited by the launcher's workers
        n = job_count(config)
        os.environ["FEDBENCH_SWEEP_JOBS"] = str(n or "")
        os.environ[SWEPT] = ",".join(swept_keys(config))  # the jobs' W&B run names show these (fedbench.loggers)
        print(f"fedbench: sweep {config.hydra.sweep.dir}" + (f": {n} jobs" if n else ""), flush=True)

    def on_job_start(self, config, **kwargs) -> None:
        launch = os.environ.get("FEDBENCH_LAUNCH")
        if launch and not is_follower() and config.hydra.mode is not None and config.hydra.mode.name == "MULTIRUN":
            print(
                job_line(
                    Path(config.hydra.sweep.dir),
                    launch,
                    int(config.hydra.job.num),
                    int(os.environ.get("FEDBENCH_SWEEP_JOBS") or 0),
                    list(config.hydra.overrides.task),
                ),
                flush=True,
            )

    def on_multirun_end(self, config, **kwargs) -> None:
        if is_follower():
            return
        sweep = Path(config.hydra.sweep.dir)
        rows = _rows(sweep, os.environ.get("FEDBENCH_LAUNCH"))
        summarize(sweep, rows)
        log_sweep_table(config, sweep, *job_table(sweep, rows))
        for key in ("FEDBENCH_LAUNCH", "FEDBENCH_SWEEP_JOBS", SWEPT):  # a later run of this process is not a job
            os.environ.pop(key, None)


def job_count(config) -> int | None:
    """How many jobs Hydra's basic sweeper makes of the config's sweep params and the command line (None for another
    sweeper)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    try:
        parsed = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
        return sum(len(batch) for batch in BasicSweeper.split_arguments(parsed, None))
    except Exception:  # Hydra reports a bad sweep itself
        return None


def job_line(sweep: Path, launch: str, num: int, total: int, overrides: list[str]) -> str:
    """``fedbench: job 3/6 (seed=1,algorithm=fedavg); sweep 0:01:10 so far, eta 0:02:20`` — the ETA from the jobs of
    this launch that have finished (whatever the launcher runs in parallel)."""
    done = len(_rows(sweep, launch))
    elapsed = time.time() - int(launch.rsplit("-", 1)[-1]) / 1e9
    of = f"/{total}" if total else ""
    eta = f", eta {clock(elapsed / done * (total - done))}" if done and total else ""
    return f"fedbench: job {num + 1}{of} ({' '.join(overrides)}); sweep {clock(elapsed)} so far{eta}"


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
            job = _hydra_job(d)
            rows.append(
                {
                    "job": (job.get("job") or {}).get("num"),
                    "dir": str(d),
                    "status": state if state not in (None, "running") else "lost",
                    "error": "no result reached the launcher",
                    "overrides": (job.get("overrides") or {}).get("task"),
                }
            )
    if not summarize(sweep, rows):
        print(f"fedbench: the launcher stopped the sweep early; see {sweep}/", file=sys.stderr, flush=True)


def _hydra_job(run_dir: Path) -> dict:
    """The ``hydra`` node of a run dir's ``.hydra/hydra.yaml`` (its job number, overrides), or {}."""
    import yaml

    try:
        node = yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return node.get("hydra") or {} if isinstance(node, dict) else {}


def planned_jobs() -> int:
    """The number of jobs the running multirun was launched with (0 when not known)."""
    return int(os.environ.get("FEDBENCH_SWEEP_JOBS") or 0)


def summarize(sweep: Path, rows: list[dict]) -> bool:
    """Print the sweep's table of jobs and the report command (stdout), then the summary line if a job failed or never
    started (stderr; remembered for the exit code); True if one did."""
    print(jobs_table(sweep, rows), f"fedbench-report {sweep}", sep="\n", flush=True)
    bad = sorted((r for r in rows if r.get("status") != "complete"), key=lambda r: r.get("job") or 0)
    unstarted = max(0, planned_jobs() - len(rows))
    if not bad:
        if unstarted:
            print(f"fedbench: {not_started(unstarted)}", file=sys.stderr, flush=True)
            SWEEP_FAILED.append(1)
        return bool(unstarted)
    failed = [r for r in bad if r.get("status") != "preempted"]  # a stopped run (Ctrl-C, SIGTERM) is no failure:
    stopped = [os.path.relpath(r["dir"], sweep) for r in bad if r.get("status") == "preempted"]  # it resumes
    kinds: dict[str, int] = {}
    for r in failed:
        kinds[r.get("status")] = kinds.get(r.get("status"), 0) + 1
    names = [os.path.relpath(r["dir"], sweep) for r in failed]
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    why = ", ".join(f"{n} {k}" for k, n in kinds.items())
    total, parts = len(rows) + unstarted, []
    if failed:
        parts.append(f"{len(failed)} of {total} runs failed ({why}); see status.json in {sweep}/: {shown}")
    if stopped:
        them = "it" if len(stopped) == 1 else "them"
        stops = f"{len(stopped)} of {total} runs stopped by a signal"
        parts.append(f"{stops} ({', '.join(stopped)}): the same command resumes {them}")
    if unstarted:
        parts.append(not_started(unstarted))
    print("fedbench: " + "; ".join(parts), file=sys.stderr, flush=True)
    SWEEP_FAILED.append(1)
    return True


def not_started(n: int) -> str:
    return (
        f"{n} job{'s' * (n != 1)} never started: the same command runs them (complete jobs are skipped, "
        "a stopped one resumes)"
    )


def job_table(sweep: Path, rows: list[dict]) -> tuple[list[str], list[list]]:
    """The columns and one row per job: its number, the overrides that differ between the jobs, status, best and final
    of the headline accuracy (from its summary.json), and its seconds (None where a job has none)."""
    rows = sorted(rows, key=lambda r: (r.get("job") is None, r.get("job") or 0))
    summaries = [rundir.read_json(Path(r["dir"]) / "summary.json")[0] if r.get("dir") else None for r in rows]
    summaries = [s if isinstance(s, dict) else {} for s in summaries]
    metric = next((k for k in HEADLINE if any(k in s.get("metrics", {}) for s in summaries)), HEADLINE[0])
    given = [r.get("overrides") for r in rows]
    common = set.intersection(*(set(g) for g in given)) if len(rows) > 1 and all(given) else set()
    data = []
    for r, s, g in zip(rows, summaries, given):
        m = s.get("metrics", {}).get(metric, {})
        shown = " ".join(o for o in g if o not in common) if g else os.path.relpath(r["dir"], sweep)
        data.append(
            [
                None if r.get("job") is None else r["job"] + 1,
                shown or "-",
                str(r.get("status")) + (" (earlier run)" if r.get("skipped") else ""),
                m.get("best"),
                m.get("final"),
                r["seconds"] if isinstance(r.get("seconds"), (int, float)) else None,
            ]
        )
    return ["job", "overrides", "status", f"{metric} best", "final", "seconds"], data


def jobs_table(sweep: Path, rows: list[dict]) -> str:
    """The sweep's :func:`job_table` as text."""
    columns, data = job_table(sweep, rows)
    table = [[*columns[:-1], "time"]]
    for job, shown, status, best, final, seconds in data:
        table.append(
            [
                "?" if job is None else str(job),
                shown,
                status,
                "-" if best is None else f"{best:.4f}",
                "-" if final is None else f"{final:.4f}",
                "-" if seconds is None else clock(seconds),
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    done = sum(r.get("status") == "complete" for r in rows)
    unstarted = max(0, planned_jobs() - len(rows))
    tail = f", {unstarted} not started" if unstarted else ""
    lines = [f"fedbench: sweep {sweep}: {done} of {len(rows) + unstarted} jobs complete{tail}"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)
