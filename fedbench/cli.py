"""The ``fedbench`` command, from the words typed to the Hydra task that runs each job: flags put first, a sweep's dir
named after its command line and quoted, ``--estimate``, shell completion; fedbench/overrides.py checks the overrides
before anything runs.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from . import hydra_cache
from .confdir import CONF_DIR, CONFIG_DIRS, GROUPS, experiments, help_groups, options  # noqa: F401  (re-exported: fedbench.cli's public names)
from .config import dirname
from .distributed import is_follower
from .errors import ConfigError, Diverged, RunDirBusy, RunFailed
from .overrides import (  # noqa: F401  (EXTENSIONS, RUN_DIR_ROOM: re-exported, fedbench.cli's public names)
    EXTENSIONS,
    RUN_DIR_ROOM,
    VALUED_FLAGS,
    check_config_files,
    fail,
    precheck,
    searchpath,
)
from .preemption import Preempted, hand_over
from .sweep import SWEEP_FAILED, journal, lost_jobs


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _task(cfg: DictConfig):
    from .errors import describe
    from .run import Run

    hc = HydraConfig.get()
    multirun = hc.mode is not None and hc.mode.name == "MULTIRUN"
    group = Path(hc.sweep.dir).name if multirun else None
    run_dir = Path(hc.runtime.output_dir)
    provenance = {"config.yaml": cfg, "hydra.yaml": HydraConfig.instance().cfg, "overrides.yaml": hc.overrides.task}
    outcome, error, code = "complete", None, 0
    started, skipped = time.time(), False
    try:
        run = Run(cfg, run_dir, group=group, provenance=provenance)
        summary = run.execute()
        skipped = run.skipped
    except Preempted as e:
        where = f"checkpoint saved in {run_dir}" if getattr(e, "checkpoint", None) else _not_saved(cfg, run_dir)
        print(f"fedbench: {e} received: {where}; re-run the same command to resume", file=sys.stderr, flush=True)
        hand_over(e.signum)  # e.g. submitit's USR2 handler: requeue this job (it resumes from the checkpoint)
        sys.exit(128 + e.signum)
    except Exception as e:  # one line, never a traceback; in a sweep the next job goes on
        e = _as_typed(e, cfg, hc)
        code = 2 if isinstance(e, ConfigError) else 1
        outcome = "busy" if isinstance(e, RunDirBusy) else "diverged" if isinstance(e, Diverged) else "failed"
        error = describe(e) if not isinstance(e, RunDirBusy) else str(e)
        if not isinstance(e, (ConfigError, RunFailed, RunDirBusy)):
            error = f"run failed: {error}"
            if getattr(e, "traceback_file", None):
                error += f" (traceback in {e.traceback_file})"
        if not multirun:
            fail(error, code)
        if not is_follower():  # (rank 0 of a run over several processes says it: fedbench/distributed.py)
            print(f"fedbench: job {hc.job.num} ({run_dir}): {error}", file=sys.stderr, flush=True)
        summary = None
    finally:
        gc.collect()  # a run's objects reference each other; free its data and models before the sweep's next job
    if multirun:  # one line per job in <sweep dir>/jobs.jsonl: the sweep's summary reads it (any launcher)
        journal(
            Path(hc.sweep.dir),
            {
                "launch": os.environ.get("FEDBENCH_LAUNCH"),
                "job": hc.job.num,
                "dir": str(run_dir),
                "status": outcome,
                "error": error,
                "overrides": list(hc.overrides.task),
                # a complete run found in place: the time it took then, not the moment it took to skip it
                "seconds": summary.get("wall_time") if skipped else round(time.time() - started, 1),
                "skipped": skipped,
            },
        )
    return summary.get("metrics") if summary else None


def _not_saved(cfg, run_dir: Path) -> str:
    """What a signal that saved nothing leaves to resume from: the newest periodic checkpoint, if any (with
    ``checkpoint.on_signal=false`` the rounds after it are not saved)."""
    from .checkpoint import directory

    saved = sorted(directory(run_dir).glob("round_*.pt"))
    if not saved:
        return f"nothing to save yet in {run_dir}"
    why = "checkpoint.on_signal=false" if not OmegaConf.select(cfg, "checkpoint.on_signal") else "nothing newer yet"
    return f"not saved now ({why}); the newest checkpoint is of round {int(saved[-1].stem[6:])}, in {run_dir}"


def _as_typed(e: Exception, cfg, hc) -> Exception:
    """A config error about a group names the option the user chose (``model=tiny_cnn``), not the model's internal
    name (``cnn``)."""
    from omegaconf import OmegaConf

    if isinstance(e, ConfigError) and e.key in GROUPS and isinstance(e.value, str):
        chosen = hc.runtime.choices.get(e.key)
        if chosen and e.value == OmegaConf.select(cfg, f"{e.key}.name") and chosen != e.value:
            return ConfigError(e.key, chosen, e.allowed)
    return e


def table_note(args: list[str]) -> str | None:
    """One line for a paper-table config run without -m: it runs ONE cell (the config's own values, with the first
    dataset and model of the table), not the table's sweep."""
    if any(a in ("-m", "--multirun") for a in args):
        return None
    exp = next((a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("experiment=")), None)
    path = CONF_DIR / "experiment" / f"{exp}.yaml"
    if exp is None or not path.is_file():
        return None
    import yaml

    params = (((yaml.safe_load(path.read_text()) or {}).get("hydra") or {}).get("sweeper") or {}).get("params")
    if not params:
        return None
    return (
        f"+experiment={exp} without -m is one run (one cell of the table); add -m to run its sweep over "
        f"{', '.join(params)}"
    )


NEUTRAL_PREFIXES = (
    "hydra.",
    "hydra/",
    "resume=",
    "logger",
    "hardware.threads=",
    "checkpoint.",
    "data_root=",
    "cache_dir=",
    "dataset.root=",
    "dataset.download=",
)


def sweep_dir(args: list[str]) -> str:
    """A multirun's dir, named after its command line: the same command finds the same dir again,
    so a re-launched sweep skips its complete runs and resumes the partial ones."""
    parts = [
        a.lstrip("+~")
        for a in args
        if "=" in a and not a.startswith("-") and not a.lstrip("+~").startswith(NEUTRAL_PREFIXES)
    ]
    return f"outputs/multirun/{dirname(','.join(parts), 'outputs/multirun')}"  # (an older cut name kept)


def complete_experiment(args: list[str]) -> bool:
    """Shell completion of ``+experiment=<TAB>``: the paper tables (Hydra's own lists only the configs directly in
    conf/experiment/, i.e. ``smoke``). True when the word being completed is an experiment choice (printed here)."""
    import re

    if not any(a.startswith("query=") for a in args) or "COMP_LINE" not in os.environ:
        return False
    line = os.environ["COMP_LINE"][: int(os.environ.get("COMP_POINT", 10**6))]
    m = re.fullmatch(r"(\+{0,2})experiment=(\S*)", line.split(" ")[-1])
    if m is None:
        return False
    print("\n".join(f"{m.group(1)}experiment={e}" for e in experiments() if e.startswith(m.group(2))))
    return True


DIR_KEYS = ("hydra.sweep.dir=", "hydra.run.dir=")


def quote_dirs(argv: list[str]) -> list[str]:
    """``hydra.sweep.dir=<a sweep's own dir>`` as fedbench printed it (``outputs/multirun/seed=0,1``): Hydra's override
    grammar reads ``=`` and ``,`` in a value as syntax, so an unquoted dir value is quoted for it."""

    def quoted(a: str) -> str:
        key, _, v = a.partition("=")
        if not v or v[0] in "'\"" or not any(c in v for c in "=,[]{}()' "):
            return a
        q = '"' if "'" in v else "'"
        return f"{key}={q}{v}{q}"

    return [quoted(a) if a.startswith(DIR_KEYS) else a for a in argv]


INFO_CHOICES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def flags_first(argv: list[str]) -> list[str]:
    """The flags (with their values) before the overrides: Hydra's parser takes the overrides as one positional run,
    so ``rounds=1 --config-dir d algorithm=x`` would stop at ``algorithm=x`` ("unrecognized arguments")."""
    flags, overrides, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and not a.startswith("~"):
            takes = a in VALUED_FLAGS or (a in ("--info", "-i") and i + 1 < len(argv) and argv[i + 1] in INFO_CHOICES)
            flags += argv[i : i + 1 + takes]
            i += 1 + takes
        else:
            overrides.append(a)
            i += 1
    return flags + overrides


def main() -> None:
    """The ``fedbench`` command: :func:`_main`, quiet when its reader goes away (``fedbench --help | head -1``)."""
    try:
        _main()
        sys.stdout.flush()
    except BrokenPipeError:  # (a run's own failure is already recorded by its guard)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        sys.exit(141)  # 128 + SIGPIPE, as a shell tool killed by the signal


def estimate(args: list[str]) -> None:
    """``fedbench --estimate [-m] <overrides>``: how long the command's runs take here (fedbench/report/runtime.py: the
    estimator every command uses, from the per-sample costs stored in conf/runtimes.yaml, no training): the total as
    terms that multiply to it, one line per setting when several, what it assumes; stdout, exit 0."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from .report.runtime import costs_from, estimate_lines, estimate_overrides, stored_costs

    given = [a for a in args if ("=" in a or a.startswith("~")) and not a.startswith("-") and "hydra." not in a]
    GlobalHydra.instance().clear()
    try:  # e.g. the dataset is not where data_root points: one line, as for a run (the estimate builds the data)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            got = estimate_overrides(
                [*searchpath(), *given],
                lambda o: compose("config", overrides=o, return_hydra_config=True),
                stored_costs(CONF_DIR),
            )
    except ConfigError as e:
        fail(str(e))
    finally:
        GlobalHydra.instance().clear()
    for line in estimate_lines(got, costs_from(CONF_DIR)):
        print(f"fedbench: {line}")


def _main() -> None:
    hydra_cache.install()  # every compose of this process (pre-check, sweep, jobs) parses each config file once
    logging.raiseExceptions = False  # a full disk: a library's log handler (W&B's) prints no traceback per record
    wants_estimate = "--estimate" in sys.argv[1:]
    sys.argv[1:] = flags_first(quote_dirs([a for a in sys.argv[1:] if a != "--estimate"]))
    args = sys.argv[1:]
    SWEEP_FAILED.clear()  # a failed job of an earlier sweep run in this process (tests, notebooks) is not this one's
    if any(a in ("--shell-completion", "-sc") for a in args) and complete_experiment(args):
        return
    if not any(
        a in ("--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc") or a.startswith("--info")
        for a in args
    ):
        check_config_files(args)
        precheck(args)
        if wants_estimate:
            return estimate(args)
        if note := table_note(args):
            print(f"fedbench: {note}", file=sys.stderr)
        if any(a in ("-m", "--multirun") for a in args) and not any(a.startswith("hydra.sweep.dir=") for a in args):
            # next to the other overrides: argparse takes the overrides as one positional run
            pos = next((i for i, a in enumerate(sys.argv) if i and "=" in a and not a.startswith("-")), len(sys.argv))
            sys.argv.insert(pos, f"hydra.sweep.dir='{sweep_dir(args)}'")
    try:
        _task()
    except SystemExit as e:  # Hydra ended a multirun early: a launcher (submitit) got no result from a job
        multirun = any(a in ("-m", "--multirun") for a in args)
        if multirun and e.code not in (None, 0) and not SWEEP_FAILED and os.environ.get("FEDBENCH_LAUNCH"):
            lost_jobs(_given_sweep_dir(sys.argv), os.environ["FEDBENCH_LAUNCH"])
        raise
    if SWEEP_FAILED:  # the sweep's summary line was printed by SweepSummary
        sys.exit(1)


def _given_sweep_dir(argv: list[str]) -> Path:
    given = [a.split("=", 1)[1].strip("'\"") for a in argv if a.startswith("hydra.sweep.dir=")]
    return Path(given[-1]) if given else Path("outputs/multirun")


if __name__ == "__main__":
    main()
