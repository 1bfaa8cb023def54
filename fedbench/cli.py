"""The ``fedbench`` command: Hydra's CLI plus one-line errors for bad input.

Before handing over to Hydra, overrides are checked against the config tree, so an unknown
group option, an unknown key or a bad value is reported as one line (key, value, what is
allowed) with exit code 2, before anything runs — for every value of a multirun sweep too.
"""
from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .config import dirname
from .errors import ConfigError, RunFailed
from .preemption import Preempted

FAILED_JOBS: list[int] = []   # exit codes of the jobs of a multirun that failed (the sweep goes on)
CONF_DIR = Path(os.environ.get("FEDBENCH_CONF", Path(__file__).resolve().parent.parent / "conf"))
GROUPS = ("algorithm", "dataset", "partition", "model", "hardware", "logger", "experiment")


def options(group: str) -> list[str]:
    """Options of a config group: yaml files under conf/<group>/, nested paths included."""
    root = CONF_DIR / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def fail(msg: str, code: int = 2):
    print(f"fedbench: {msg}", file=sys.stderr)
    sys.exit(code)


def _values(o) -> list[str]:
    if o.is_sweep_override():
        return [str(v) for v in o.sweep_string_iterator()]
    return [o.input_line.split("=", 1)[1]]   # as typed, so quoting survives being composed again


def _key(o) -> str:
    """An override's left-hand side as typed: ``+`` if it adds, the key or group, ``@<package>`` if given."""
    return f"{'+' if o.is_add() else ''}{o.key_or_group}{'@' + o.package if o.package else ''}"


def precheck(args: list[str]) -> None:
    """Check the command line's overrides; exit 2 with one line on the first bad one."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from .config import validate

    raw = [a for a in args if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(raw)
    except HydraException as e:
        fail(f"cannot parse overrides: {str(e).splitlines()[0]}")
    groups, keys = [], []
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra") or o.is_delete():
            continue
        if key.split("/")[0] in GROUPS:   # a group, or a group nested in one (experiment/cafeme/column@_global_=...)
            allowed = options(key)
            for v in _values(o):
                if v not in allowed:
                    fail(f"invalid config: {key}={v!r} — one of {', '.join(allowed)}")
            groups.append(o)
        else:
            keys.append(o)
    base = [f"{_key(o)}={_values(o)[0]}" for o in groups]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            cfg = compose("config", overrides=base)
        except HydraException:
            return  # let Hydra report what it cannot compose
        for o in keys:
            if not (o.is_add() or o.is_force_add()) and OmegaConf.select(cfg, o.key_or_group, default="<missing>") == "<missing>":
                fail(f"invalid config: unknown key {o.key_or_group!r} — see `fedbench --cfg job` for the keys "
                     f"(use +{o.key_or_group}=... to add a new one)")
        # vary one override at a time over its sweep values; every resulting config must validate
        singles = [f"{_key(o)}={_values(o)[0]}" for o in keys]
        todo = [base + singles]
        for i, o in enumerate(groups + keys):
            for v in _values(o)[1:]:
                combo = list(base + singles)
                combo[i] = f"{_key(o)}={v}"
                todo.append(combo)
        for combo in todo:
            try:
                validate(compose("config", overrides=combo))
            except ConfigError as e:
                fail(str(e))
            except HydraException as e:
                fail(f"invalid config: {str(e).splitlines()[0]}")
    GlobalHydra.instance().clear()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _task(cfg: DictConfig):
    from .run import Run

    hc = HydraConfig.get()
    multirun = hc.mode is not None and hc.mode.name == "MULTIRUN"
    group = Path(hc.sweep.dir).name if multirun else None
    try:
        summary = Run(cfg, hc.runtime.output_dir, group=group).execute()
    except ConfigError as e:
        if multirun:  # e.g. one dataset of a grid is missing: report it, mark the dir, run the other jobs
            print(f"fedbench: {e} (job {hc.job.num}: {hc.runtime.output_dir})", file=sys.stderr)
            status = Path(hc.runtime.output_dir) / "status.json"
            if not status.exists():
                status.write_text(json.dumps({"status": "failed", "error": str(e)}))
            FAILED_JOBS.append(2)
            return None
        fail(str(e), 2)
    except Preempted as e:
        print(f"fedbench: {e} received: checkpoint saved in {hc.runtime.output_dir}; re-run the same command to resume",
              file=sys.stderr, flush=True)
        sys.exit(128 + e.signum)
    except RunFailed as e:
        if multirun:  # one diverged run must not stop the sweep; it is marked failed in its dir
            print(f"fedbench: run failed: {e}", file=sys.stderr)
            FAILED_JOBS.append(1)
            return None
        fail(f"run failed: {e}", 1)
    finally:
        gc.collect()  # a run's objects reference each other; free its data and models before the sweep's next job
    return summary.get("metrics")


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
    return (f"+experiment={exp} without -m is one run (one cell of the table); add -m to run its sweep over "
            f"{', '.join(params)}")


NEUTRAL_PREFIXES = ("hydra.", "hydra/", "resume=", "logger", "hardware.threads=", "checkpoint.", "data_root=", "cache_dir=",
                    "dataset.root=", "dataset.download=")


def sweep_dir(args: list[str]) -> str:
    """A multirun's dir, named after its command line: the same command finds the same dir again,
    so a re-launched sweep skips its complete runs and resumes the partial ones."""
    parts = [a.lstrip("+~") for a in args if "=" in a and not a.startswith("-") and not a.lstrip("+~").startswith(NEUTRAL_PREFIXES)]
    return f"outputs/multirun/{dirname(','.join(parts))}"


def main() -> None:
    args = sys.argv[1:]
    if not any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc") or a.startswith("--info")
               for a in args):
        precheck(args)
        if note := table_note(args):
            print(f"fedbench: {note}", file=sys.stderr)
        if any(a in ("-m", "--multirun") for a in args) and not any(a.startswith("hydra.sweep.dir=") for a in args):
            # next to the other overrides: argparse takes the overrides as one positional run
            pos = next((i for i, a in enumerate(sys.argv) if i and "=" in a and not a.startswith("-")), len(sys.argv))
            sys.argv.insert(pos, f"hydra.sweep.dir='{sweep_dir(args)}'")
    _task()
    if FAILED_JOBS:
        print(f"fedbench: {len(FAILED_JOBS)} job(s) of the sweep failed (see the messages above and their status.json)",
              file=sys.stderr)
        sys.exit(max(FAILED_JOBS))


if __name__ == "__main__":
    main()
