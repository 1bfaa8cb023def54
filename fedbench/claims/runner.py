"""``fedbench-claims run``: the multiruns a paper's claims need at one scale. Each experiment is one ``fedbench -m``
(its own process: the same pre-check, deterministic run dirs and Hydra launcher choice as on the command line), so
complete runs are skipped, interrupted ones resume from their checkpoints, and an experiment whose runs are all
complete is not launched at all. Every launch is logged (time, commit, machine) for the results page."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ..provenance import commit, machine  # noqa: F401  (re-exported: launches and records use them)
from ..report.runtime import ASSUMES, estimate_line, hours, left_line
from .results import LAUNCHES, RunSet, sweep_dir
from .spec import ClaimsError, PaperClaims

# A run that ended in one of these is never made again: a diverged run is an outcome (docs/claims.md; the same config
# and seed diverge again), a failed or interrupted one is made again.
OUTCOMES = ("complete", "diverged")


def launch(args: list[str]) -> int:
    """``fedbench <args>`` as its own process (exactly the command line: pre-check, Hydra, the launcher the overrides
    choose; a crash or a leak stays in it); its exit code (1: a job of the sweep failed, 2: a bad override)."""
    return subprocess.run([sys.executable, "-m", "fedbench.cli", *args]).returncode


def neutral_keys() -> list[str]:
    """The overrides that leave a run's results and run dir alone (conf/config.yaml's override_dirname exclude_keys)."""
    import yaml

    from ..confdir import CONF_DIR

    node = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    return list(node["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"])


def check_extra(extra: list[str]) -> None:
    """Extra overrides may only change how runs are made (Hydra's own settings, e.g. a launcher, and the results-neutral
    keys), never their results: the report must find the same runs from the claims file alone."""
    allowed = neutral_keys()
    for item in extra:
        key = item.split("=", 1)[0].lstrip("+~")
        if not (key.startswith(("hydra.", "hydra/")) or key in allowed):
            raise ClaimsError(
                f"override {item!r} would change the runs (their results or run dirs); put it in "
                f"conf/claims/<paper>.yaml (a scale's or an experiment's overrides). Allowed here: "
                f"hydra.*, hydra/*, {', '.join(allowed)}"
            )


def run(
    pc: PaperClaims,
    scale: str,
    runs_root: Path,
    extra: list[str] = (),
    dry_run: bool = False,
    invoked: str = "",
    records: Path | None = None,
    only: list[str] | None = None,
    seeds: list[int] | None = None,
    estimate: bool = False,
) -> int:
    """Launch every experiment the claims need at ``scale`` that still has runs to do; the worst exit code. A run
    that ``records`` (committed run records, fedbench/claims/records.py) holds as complete is not run again: when
    some are, only the other jobs are launched, one ``fedbench -m`` each. ``only``: these experiments; ``seeds``:
    these of the scale's seeds (a pilot: e.g. 0, 1 first, the rest later; the runs are the same jobs)."""
    if scale not in pc.scales:
        raise ClaimsError(f"{pc.path}: no '{scale}' scale (the file has {', '.join(pc.scales)})")
    check_extra(list(extra))
    sweep = sweep_dir(runs_root, scale, pc.paper)
    extra = list(extra) + ([] if any(e.startswith("logger") for e in extra) else ["logger=none"])
    worst = 0
    names = [e.name for e in pc.needed(scale)]
    for name in only or ():
        if name not in names:
            raise ClaimsError(f"--only {name!r} — an experiment of {pc.paper} at {scale}: one of {', '.join(names)}")
    for exp in pc.needed(scale):
        if only and exp.name not in only:
            continue
        if seeds is not None and not set(seeds) <= set(exp.seeds):
            raise ClaimsError(f"--seeds {seeds} — {pc.paper} {scale} {exp.name} runs seeds {exp.seeds}")
        runs, left = todo(pc, scale, exp, runs_root, records, seeds)  # read again: an earlier experiment may have
        done = len(runs) - len(left)  # made shared runs
        diverged = sum(r.status == "diverged" for r in runs)
        head = f"fedbench-claims: {pc.paper} {scale} {exp.name}: {done}/{len(runs)} runs complete" + (
            f" ({diverged} of them diverged: an outcome, not made again)" if diverged else ""
        )
        if done == len(runs):
            print(f"{head}; nothing to run", file=sys.stderr)
            continue
        if any(r.status in OUTCOMES and (r.path is None or r.status != "complete") for r in runs):  # only the others
            launches = [run_args(exp, j, extra, sweep) for j in left]  # (a multirun would redo a diverged one)
        else:  # one multirun (its complete run dirs are skipped at once)
            args = [f"seed={','.join(map(str, seeds))}" if a.startswith("seed=") and seeds else a for a in exp.args()]
            launches = [["-m", *args, *extra, f"hydra.sweep.dir={sweep}"]]
        command = "; ".join("fedbench " + " ".join(shlex.quote(a) for a in args) for args in launches)
        if estimate:  # the runs left x the measured cost of the experiment's runs (fedbench/report/runtime.py)
            got = estimate_runs(exp.args(), extra)
            left = len(runs) - done
            print(
                f"{head}; {left_line(got, left)} ({estimate_line(got)})",
                file=sys.stderr,
                flush=True,
            )
            continue
        print(f"{head}; running {'(dry run) ' if dry_run else ''}{command}", file=sys.stderr, flush=True)
        if dry_run:
            continue
        sweep.mkdir(parents=True, exist_ok=True)
        started, tic = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter()
        with Progress(exp.name, sweep, len(runs) - done):
            code = max(launch(args) for args in launches)
        seconds = time.perf_counter() - tic
        after = sum(r.status in OUTCOMES for r in RunSet(pc, scale, runs_root, records=records).runs(exp))
        record = {
            "experiment": exp.name,
            "scale": scale,
            "started": started,
            "seconds": round(seconds, 1),
            "exit": code,
            "runs": len(runs),
            "complete_before": done,
            "complete_after": after,
            "command": command,
            "invoked": invoked,
            "commit": commit(),
            "machine": machine(),
        }
        with (sweep / LAUNCHES).open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(
            f"fedbench-claims: {exp.name}: {after}/{len(runs)} complete after {seconds:.0f} s (exit {code})",
            file=sys.stderr,
            flush=True,
        )
        worst = max(worst, code)
    if estimate:
        print(f"fedbench-claims: the estimate {ASSUMES}", file=sys.stderr)
    return worst


class Progress:
    """While an experiment's runs are made (issue #53: 8 one-round runs said nothing for minutes and looked hung): a
    line each time more of them have ended — k of n, the time so far and, from the mean time per ended run, about how
    long the rest take. A run has ended when its status.json in the sweep dir says an outcome or failed and was written
    after the launch began (experiments launch one after another, so those are this launch's). Polled every
    :attr:`every` seconds in a thread; a last line when the launch returns."""

    every = 5.0

    def __init__(self, name: str, sweep: Path, total: int):
        import threading

        self.name, self.sweep, self.total = name, sweep, total
        self.stop, self.shown = threading.Event(), 0
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def ended(self) -> int:
        n = 0
        for path in self.sweep.glob("*/status.json"):
            try:
                if path.stat().st_mtime >= self.start and json.loads(path.read_text()).get("status") in (
                    *OUTCOMES,
                    "failed",
                ):
                    n += 1
            except (OSError, ValueError):  # being written: the next poll reads it
                continue
        return min(n, self.total)

    def _show(self, n: int) -> None:
        spent = time.time() - self.start
        rest = f"; about {hours(spent / n * (self.total - n))} left" if 0 < n < self.total else ""
        print(
            f"fedbench-claims: {self.name}: {n} of {self.total} runs ended ({hours(spent)}{rest})",
            file=sys.stderr,
            flush=True,
        )
        self.shown = n

    def _watch(self) -> None:
        while not self.stop.wait(self.every):
            if (n := self.ended()) > self.shown:
                self._show(n)

    def __enter__(self):
        self.start = time.time() - 1.0  # status.json mtimes have a coarse clock on some filesystems
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        if (n := self.ended()) > self.shown:
            self._show(n)
        return False


def todo(
    pc: PaperClaims, scale: str, exp, runs_root: Path, records: Path | None = None, seeds: list[int] | None = None
) -> tuple[list, list[dict]]:
    """An experiment's runs (of ``seeds``: all by default) as they stand under ``runs_root`` and in ``records``, and
    the jobs among them still to make (no outcome yet: missing, failed, interrupted)."""
    runs = RunSet(pc, scale, runs_root, records=records).runs(exp)
    pairs = [(j, r) for j, r in zip(exp.jobs()[0], runs) if seeds is None or int(j["seed"]) in seeds]
    return [r for _, r in pairs], [j for j, r in pairs if r.status not in OUTCOMES]


def run_args(exp, job: dict, extra: list[str], sweep: Path) -> list[str]:
    """``fedbench`` arguments that make one job of an experiment in the paper's sweep dir (its run dir is the one the
    experiment's multirun gives it)."""
    return ["-m", *exp.job_args(job), *extra, f"hydra.sweep.dir={sweep}"]


def estimate_runs(args: list[str], extra: list[str]) -> dict:
    """:func:`fedbench.report.runtime.estimate_overrides` of one experiment's multirun arguments."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ..confdir import CONF_DIR
    from ..hydra_cache import install
    from ..report.runtime import estimate_overrides
    from ..report.stored_runtimes import stored_costs

    given = [a for a in [*args, *extra] if "=" in a and not a.startswith(("hydra.", "logger"))]
    install()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return estimate_overrides(
                given, lambda o: compose("config", overrides=o, return_hydra_config=True), stored_costs(CONF_DIR)
            )
    finally:
        GlobalHydra.instance().clear()


__all__ = ["launch", "run", "todo", "run_args", "check_extra", "neutral_keys", "commit", "machine", "estimate_runs"]
