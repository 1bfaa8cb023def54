"""The ``fedbench`` command: Hydra's CLI plus one-line errors for bad input.

Before handing over to Hydra, overrides are checked against the config tree, so an unknown
group option, an unknown key or a bad value is reported as one line (key, value, what is
allowed) with exit code 2, before anything runs — for every value of a multirun sweep too.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.types import ValueType
from omegaconf import DictConfig, OmegaConf

from . import hydra_cache
from .confdir import CONF_DIR, CONFIG_DIRS, GROUPS, options  # noqa: F401  (re-exported: fedbench.cli's public names)
from .config import dirname
from .distributed import is_follower
from .errors import ConfigError, Diverged, RunDirBusy, RunFailed
from .preemption import Preempted, hand_over
from .sweep import SWEEP_FAILED, journal, lost_jobs


def _searchpath() -> list[str]:
    """The override that lets the precheck's compose see --config-dir's files, as Hydra's run will."""
    if not CONFIG_DIRS:
        return []
    return ["hydra.searchpath=[" + ",".join(f"file://{d.resolve()}" for d in CONFIG_DIRS) + "]"]


# top-level keys a run reads that conf/ does not define, so `+key=...` adds them (the only keys `+` may add):
# data_schedule (fedbench/data/schedule.py, docs/fedka.md)
EXTENSIONS = ("data_schedule",)


def experiments() -> list[str]:
    """The experiment configs a user runs (`+experiment=...`): the paper tables and figures, smoke. Not the parts the
    tables include or sweep over (``<paper>/setting``, ``<paper>/setting/*``, ``<paper>/column/*``,
    ``<paper>/arm/*``)."""
    return [o for o in options("experiment") if len(Path(o).parts) <= 2 and Path(o).name != "setting"]


def help_groups() -> str:
    """The config groups of ``fedbench --help`` (conf/hydra/help): the ones a user chooses, not fedbench's internal
    ones (claims, dataset_defaults, the tables' parts)."""
    return "\n".join(
        [
            *(f"{g}: {', '.join(options(g))}" for g in GROUPS if g != "experiment"),
            f"+experiment (paper tables and figures; add -m for the sweep): {', '.join(experiments())}",
        ]
    )


def _did_you_mean(word: str, candidates) -> str:
    """``did you mean X? `` for the closest candidates (difflib), or ''."""
    import difflib

    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"did you mean {close[0]}? " if close else ""


def _did_you_mean_key(key: str, paths: list[str]) -> str:
    """For an unknown dotted key: the keys that end like it (``delta`` -> ``algorithm.delta``), else the closest
    whole key, else the key whose last part is closest."""
    import difflib

    leaf = key.split(".")[-1]
    same = [p for p in paths if p.split(".")[-1] == leaf and p != key]
    if same:
        return f"did you mean {' or '.join(same[:3])}? "
    if "." not in key and (where := _option_keys(leaf)):  # a key of another option (delta: FedReMa's algorithm.delta)
        return "did you mean " + " or ".join(f"{g}.{leaf} (with {g}={', '.join(o[:3])})" for g, o in where) + "? "
    whole = _did_you_mean(key, paths)
    if whole:
        return whole
    leaves = {}
    for p in paths:
        leaves.setdefault(p.split(".")[-1], p)
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75)
    return f"did you mean {leaves[close[0]]}? " if close else ""


def _option_keys(leaf: str) -> list[tuple[str, list[str]]]:
    """(group, its options that have the top-level key ``leaf``) over the config groups but experiment."""
    found = []
    for group in GROUPS[:-1]:
        have = [name for name in options(group) if leaf in _option_yaml(group, name)]
        if have:
            found.append((group, have))
    return found


def fail(msg: str, code: int = 2):
    print(f"fedbench: {msg}", file=sys.stderr)
    sys.exit(code)


def _values(o) -> list[str]:
    if o.value_type == ValueType.GLOB_CHOICE_SWEEP:  # Hydra lists a group's options with its loader, not up yet here
        return o.value().filter(options(o.key_or_group))
    if o.is_sweep_override():
        return [str(v) for v in o.sweep_string_iterator()]
    return [o.input_line.split("=", 1)[1]]  # as typed, so quoting survives being composed again


def _key(o) -> str:
    """An override's left-hand side as typed: ``+`` (add) or ``++`` (add or override), the key or group,
    ``@<package>`` if given."""
    sign = "++" if o.is_force_add() else "+" if o.is_add() else ""
    return f"{sign}{o.key_or_group}{'@' + o.package if o.package else ''}"


def precheck(args: list[str]) -> None:
    """Check the command line's overrides; exit 2 with one line on the first bad one."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from .config import validate

    raw = [a for a in args if ("=" in a or a.startswith("~")) and not a.startswith("-")]
    for prev, a in zip(["", *args], args):
        if not a.startswith("-") and "=" not in a and not a.startswith("~") and prev not in VALUED_FLAGS:
            fail(f"invalid override {a!r} — key=value (e.g. {a}=...), ~{a} to remove it, or a flag such as -m")
    try:
        parsed = OverridesParser.create().parse_overrides(raw)
    except HydraException as e:
        fail(f"cannot parse overrides: {str(e).splitlines()[0]}")
    multirun = any(a in ("-m", "--multirun") for a in args)
    for o in parsed:
        if o.value_type == ValueType.INTERVAL_SWEEP:  # Hydra's basic sweeper cannot enumerate it: a traceback
            fail(
                f"invalid config: {o.input_line} — values to run, not a continuous range (interval() is for "
                f"optimizing sweepers): {_key(o)}=a,b,c, choice(a,b) or range(start,stop,step) with -m"
            )
        if o.value_type == ValueType.GLOB_CHOICE_SWEEP:  # (Hydra: a traceback, "ConfigLoader is not set")
            if o.key_or_group.split("/")[0] not in GROUPS:
                fail(f"invalid config: {o.input_line} — glob() picks a config group's options; a key takes its values: "
                     f"{_key(o)}=a,b,c")  # fmt: skip
            if not _values(o):
                fail(f"invalid config: {o.input_line} — a pattern matching options of {o.key_or_group}: one of "
                     f"{', '.join(options(o.key_or_group))}")  # fmt: skip
        if o.is_sweep_override() and not multirun:
            fail(
                f"invalid config: {o.input_line} — one value without -m: add -m to sweep over "
                f"{', '.join(_values(o))}, or quote a value that holds a comma ({_key(o)}='a,b')"
            )
        if (o.is_add() or o.is_force_add()) and o.key_or_group.split("/")[0] in GROUPS and "/" not in o.key_or_group:
            if o.key_or_group != "experiment":
                fail(f"invalid config: {o.input_line} — {o.key_or_group} is always chosen: {o.input_line.lstrip('+')}")
    _check_output_dir(parsed, multirun)
    groups, keys, deleted = [], [], []
    seen: dict = {}
    twice: list[str] = []  # said once the overrides passed, so that a refusal stays one line
    for o in parsed:  # `rounds=3 rounds=4`: Hydra keeps the last one; say so (scripts rely on it, so no refusal)
        name = o.key_or_group + (f"@{o.package}" if o.package else "")
        if o.is_delete():
            continue
        if name in seen:
            twice.append(f"fedbench: {name} is given twice ({seen[name]}, {o.input_line}); the last one is used")
        seen[name] = o.input_line
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra"):
            continue
        if o.is_delete():  # ~key / ~group: every key of the config is used by the run
            deleted.append(key)
            continue
        if key.split("/")[0] in GROUPS:  # a group, or a group nested in one (experiment/cafeme/column@_global_=...)
            allowed = experiments() if key == "experiment" else options(key)
            for v in _values(o):
                if v in options(key) and v not in allowed:
                    fail(
                        f"invalid config: {key}={v!r} — a part that the paper tables include, not an experiment of "
                        f"its own; one of {', '.join(allowed)}"
                    )
                if v not in allowed:
                    fail(f"invalid config: {key}={v!r} — {_did_you_mean(v, allowed)}one of {', '.join(allowed)}")
            groups.append(o)
        else:
            keys.append(o)
    base = [f"{_key(o)}={_values(o)[0]}" for o in groups]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            cfg = _defaults(tuple(_searchpath() + base))  # --config-dir's files too
        except HydraException:
            return  # let Hydra report what it cannot compose
        for key in deleted:
            if key.split("/")[0] in GROUPS:
                fail(f"invalid config: ~{key} removes a required group — choose one of {', '.join(options(key))}")
            if _node(cfg, key) is not None:
                fail(f"invalid config: {key}=<removed> — the run needs it: {_allowed(cfg, key)} (remove the ~)")
        for o in keys:  # with or without +: a key nothing reads would be ignored silently
            key = o.key_or_group
            if key.split(".")[0] in GROUPS and key.split(".", 1)[1:] == ["name"]:
                _check_group_name(cfg, key.split(".")[0], o)
            if _node(cfg, key) is None and key.split(".")[0] not in EXTENSIONS:
                added = f"{_key(o)}=... adds a key that nothing reads; " if o.is_add() or o.is_force_add() else ""
                fail(
                    f"invalid config: unknown key {key!r} — {added}{_did_you_mean_key(key, _paths(cfg))}"
                    "(`fedbench --cfg job` lists the keys)"
                )
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
                composed = compose("config", overrides=_searchpath() + combo)
                _resolve_all(composed, combo)
                _check_types(cfg, composed, [o.key_or_group for o in keys if _node(cfg, o.key_or_group) is not None])
                validate(composed)
                _check_threads(composed)
                if multirun:
                    _check_data(composed)
            except ConfigError as e:
                fail(str(e))
            except HydraException as e:
                fail(f"invalid config: {str(e).splitlines()[0]}")
    GlobalHydra.instance().clear()
    for line in twice:
        print(line, file=sys.stderr)


def _check_group_name(cfg, group: str, o) -> None:
    """``dataset.name=mnist``: a group's ``name`` comes with the option chosen (``dataset=mnist`` brings mnist's keys
    too); another name would run one option's keys with another's code (mnist's loader without its ``root``)."""
    chosen = OmegaConf.select(cfg, f"{group}.name", default=None)
    for v in (v.strip("'\"") for v in _values(o)):
        if v == chosen:
            continue  # the name it has: nothing changes
        named = [n for n in options(group) if _option_yaml(group, n).get("name", n) == v]
        use = (
            f"use {group}={named[0]} to choose it" if named else f"choose {group}=<one of {', '.join(options(group))}>"
        )
        fail(f"invalid config: {group}.name={v!r} — {use}; {group}.name is set by the group (now {chosen!r})")


def _option_yaml(group: str, name: str) -> dict:
    """The keys of option ``name`` of ``group`` as written (conf/ first, then --config-dir); {} if not a mapping."""
    for d in (CONF_DIR, *CONFIG_DIRS):
        f = d / group / f"{name}.yaml"
        if f.is_file():
            try:
                node = yaml.safe_load(f.read_text())
            except yaml.YAMLError:
                node = None
            return node if isinstance(node, dict) else {}
    return {}


@functools.lru_cache(maxsize=4)
def _defaults(groups: tuple):
    """The config of these group choices, before any key override (read only; composed once per process)."""
    from hydra import compose

    return compose("config", overrides=list(groups))


def _node(cfg, key: str):
    """The config node at a dotted key without resolving it (``???`` and interpolations count as present), or None."""
    from omegaconf import DictConfig

    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig):
            return None
        node = node._get_node(part, validate_access=False)
        if node is None:
            return None
    return node


def _paths(node, prefix: str = "") -> list[str]:
    """Every dotted key of a config, without resolving it (the candidates of a did-you-mean)."""
    from omegaconf import DictConfig

    out = []
    for k in node.keys():
        child = node._get_node(k, validate_access=False)
        out.append(f"{prefix}{k}")
        if isinstance(child, DictConfig) and not (child._is_none() or child._is_missing() or child._is_interpolation()):
            out += _paths(child, f"{prefix}{k}.")
    return out


def _allowed(cfg, key: str) -> str:
    """What a key takes: its check's wording if it has one, else a value like its default."""
    from omegaconf import OmegaConf

    from .config import CHECKS

    if key in CHECKS:
        return CHECKS[key][1]
    default = OmegaConf.select(cfg, key, throw_on_resolution_failure=False, throw_on_missing=False)
    return (
        f"{_kind(default)} like the default "
        f"{OmegaConf.to_container(default) if OmegaConf.is_config(default) else default!r}"
    )


def _kind(v) -> str:
    from omegaconf import DictConfig, ListConfig

    if isinstance(v, bool):
        return "true or false"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, ListConfig):
        return "a list"
    if isinstance(v, DictConfig):
        return "a mapping or null"
    return "a value"


def _check_types(defaults, cfg, keys: list[str]) -> None:
    """Each overridden key has the type of its default (number, true/false, string, list, mapping); keys with a
    check of their own (fedbench.config.CHECKS) are left to it, keys whose default is null take anything."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    from .config import CHECKS

    for key in keys:
        if key in CHECKS:
            continue
        d = OmegaConf.select(defaults, key, throw_on_resolution_failure=False, throw_on_missing=False)
        v = OmegaConf.select(cfg, key)
        if d is None:
            continue
        if isinstance(d, bool):
            ok = isinstance(v, bool)
        elif isinstance(d, (int, float)):  # ints and floats alike: integer-only keys have their own check
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        elif isinstance(d, str):
            ok = isinstance(v, str)
        elif isinstance(d, ListConfig):
            ok = isinstance(v, ListConfig)
        else:
            ok = v is None or isinstance(v, DictConfig) if isinstance(d, DictConfig) else True
        if not ok:
            shown = OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
            raise ConfigError(key, shown, _allowed(defaults, key))


def _resolve_all(cfg, combo: list[str]) -> None:
    """Every interpolation resolves and every required (``???``) value is given, or one line naming the key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", "?")
        raise ConfigError(key, "???", f"a value is required (add {key}=...)") from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "?")
        typed = next((c.split("=", 1)[1] for c in combo if c.lstrip("+~").split("=", 1)[0] == key), None)
        node = _node(cfg, key)
        value = typed if typed is not None else (node._value() if node is not None else "?")
        raise ConfigError(key, value, f"a value or an interpolation that resolves ({str(e).splitlines()[0]})") from None


def _check_data(cfg) -> None:
    """A sweep's real dataset has a root to read (or a decoded copy in the cache, or download=true): checked once
    before the jobs start, instead of every job failing with the same line."""
    from .data.datasets import _GENERATED, _cache_file

    d = cfg.dataset
    if d.name in _GENERATED or d.get("download") or (d.get("cache") and _cache_file(d, cfg.cache_dir).is_file()):
        return
    if not Path(str(d.root)).is_dir():
        raise ConfigError(
            "dataset.root",
            str(d.root),
            f"a folder holding {d.name} ({Path(str(d.root)).resolve()} does "
            "not exist): add data_root=<folder> (e.g. data_root=../shared/data) or export FEDBENCH_DATA",
        )


RUN_DIR_ROOM = 256  # bytes kept below the system's path limit: a sweep's job dir (<= 121, config.dirname) and the
# longest file a run writes in its dir (previous/<time>/diagnostics/head_similarity/round_00001.npz.tmp...: < 128)


def _check_threads(cfg) -> None:
    """``hardware.threads`` and ``hardware.workers`` threads can be started here (a limit on processes, the cgroup's
    pids.max, or the address space for their stacks): else OpenMP ends the run mid-way ("Thread creation failed")."""
    from .checks import is_int

    for key in ("hardware.threads", "hardware.workers"):
        n = OmegaConf.select(cfg, key, default=None)
        if is_int(n) and (got := _threads_startable(n)) < n:
            raise ConfigError(
                key, n, f"at most {got}: only {got} threads can be started here (ulimit -u, the cgroup's pids.max or "
                f"memory for their stacks); this machine has {os.cpu_count()} CPUs"
            )  # fmt: skip


@functools.lru_cache(maxsize=8)
def _threads_startable(n: int) -> int:
    """How many of ``n`` threads can be started at once (each waits until all are stopped and joined)."""
    import threading

    stop, started = threading.Event(), []
    try:
        for _ in range(n):
            started.append(threading.Thread(target=stop.wait, daemon=True))
            started[-1].start()
    except RuntimeError:  # "can't start new thread"
        started.pop()
    finally:
        stop.set()
        for t in started:
            t.join()
    return len(started)


def _check_output_dir(parsed, multirun: bool) -> None:
    """The run (or sweep) dir can be made: no existing file on its path, its nearest existing parent writable."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = next((o for o in reversed(parsed) if o.key_or_group == key and not o.is_delete()), None)  # the last
    template = _values(given)[0].strip("'\"") if given else ("outputs/multirun" if multirun else "outputs/runs/x")
    if not template.strip():
        fail(f"invalid config: {key}='' — a directory path (empty: the run would write into the current directory)")
    static = template.split("${", 1)[0]
    _check_path_length(key, template, static)
    path = Path(static if static == template else os.path.dirname(static) or ".")
    while not path.exists() and path != path.parent:
        path = path.parent
    if path.exists() and not path.is_dir():
        fail(f"invalid config: {key}={template!r} — a directory path ({path} is an existing file)")
    if path.exists() and not _can_make_dir_in(path):
        fail(f"invalid config: {key}={template!r} — a writable location ({path} is not writable)")


def _check_path_length(key: str, template: str, static: str) -> None:
    """The run dir's path fits the system's limits (checked before the path is first looked up: a name too long
    makes every lookup fail)."""
    name_max, path_max = os.pathconf(".", "PC_NAME_MAX"), os.pathconf(".", "PC_PATH_MAX")
    shown = template if len(template) <= 80 else f"{template[:60]}...({len(template)} characters)"
    for part in Path(static).parts:
        if len(os.fsencode(part)) > name_max:
            fail(
                f"invalid config: {key}={shown!r} — a path whose names have at most {name_max} bytes each "
                f"({part[:20]}... has {len(os.fsencode(part))})"
            )
    whole = len(os.fsencode(os.path.abspath(static)))
    if whole + RUN_DIR_ROOM > path_max:
        fail(
            f"invalid config: {key}={shown!r} — a path of at most {path_max - RUN_DIR_ROOM} bytes in all, from / "
            f"(it has {whole}; the system's limit is {path_max} and the run's own files need the rest)"
        )


def _can_make_dir_in(path: Path) -> bool:
    """Whether a directory can be made in ``path`` — tried (and removed): access() says yes to root for /proc."""
    if not os.access(path, os.W_OK | os.X_OK):
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fedbench-probe-", dir=path))
    except OSError:
        return False
    return True


OmegaConf.register_new_resolver("fb_help_groups", help_groups, replace=True)  # conf/hydra/help/fedbench.yaml


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


VALUED_FLAGS = {"--config-path", "-cp", "--config-dir", "-cd", "--config-name", "-cn", "--experimental-rerun", "--cfg",
                "-c", "--package", "-p"}  # flags whose next word is their value  # fmt: skip
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
                [*_searchpath(), *given],
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
        _check_config_files(args)
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


def _check_config_files(args: list[str]) -> None:
    """The YAML files of a ``--config-path`` / ``--config-dir`` parse: one line naming the file, line and problem
    (Hydra would print a parser traceback)."""
    given: dict[str, list[str]] = {"path": [], "name": []}
    for i, a in enumerate(args):
        for flag, kind in (("--config-path", "path"), ("-cp", "path"), ("--config-dir", "path"), ("-cd", "path"),
                           ("--config-name", "name"), ("-cn", "name")):  # fmt: skip
            if a == flag and i + 1 < len(args):
                given[kind].append(args[i + 1])
            elif a.startswith(flag + "="):
                given[kind].append(a.split("=", 1)[1])
    dirs = given["path"]
    CONFIG_DIRS[:] = [Path(a.split("=", 1)[1] if "=" in a else args[i + 1]) for i, a in enumerate(args)
                      if a.split("=", 1)[0] in ("--config-dir", "-cd") and ("=" in a or i + 1 < len(args))]  # fmt: skip
    for d in CONFIG_DIRS:  # Hydra: a warning naming its own source file, then exit 1
        if not d.is_dir():
            what = "is a file" if d.exists() else "does not exist"
            fail(f"invalid config: --config-dir={str(d)!r} — a directory of config groups ({d.resolve()} {what})")
    for name in given["name"]:
        where = [Path(d) for d in dirs] + [CONF_DIR]
        if not any((d / f"{name.removesuffix('.yaml')}.yaml").is_file() for d in where):
            have = sorted({f.stem for d in where if d.is_dir() for f in d.glob("*.yaml")})
            fail(f"invalid config: --config-name={name!r} — a config file in {', '.join(map(str, where))}: one of "
                 f"{', '.join(have)}")  # fmt: skip
    for d in dirs:
        for f in sorted(Path(d).rglob("*.yaml")) if Path(d).is_dir() else []:
            try:
                yaml.safe_load(f.read_text())
            except (yaml.YAMLError, UnicodeDecodeError) as e:
                mark = getattr(e, "problem_mark", None)
                where = f"{f}, line {mark.line + 1}" if mark else str(f)
                fail(f"invalid config: {where} is not valid YAML — {getattr(e, 'problem', None) or e}")


def _given_sweep_dir(argv: list[str]) -> Path:
    given = [a.split("=", 1)[1].strip("'\"") for a in argv if a.startswith("hydra.sweep.dir=")]
    return Path(given[-1]) if given else Path("outputs/multirun")


if __name__ == "__main__":
    main()
