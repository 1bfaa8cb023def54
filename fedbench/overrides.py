"""The command line's overrides checked against the config tree before anything runs: the first bad one is refused
with one line (the key, the value, what is allowed, a did-you-mean) and exit code 2 — for every value of a multirun
sweep too, and for the files of ``--config-dir`` / ``--config-name``.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path

import yaml
from hydra.core.override_parser.types import ValueType
from omegaconf import OmegaConf

from .confdir import CONF_DIR, CONFIG_DIRS, GROUPS, experiments, options
from .errors import ConfigError


def fail(msg: str, code: int = 2):
    print(f"fedbench: {msg}", file=sys.stderr)
    sys.exit(code)


def searchpath() -> list[str]:
    """The override that lets the precheck's compose see --config-dir's files, as Hydra's run will."""
    if not CONFIG_DIRS:
        return []
    return ["hydra.searchpath=[" + ",".join(f"file://{d.resolve()}" for d in CONFIG_DIRS) + "]"]


# top-level keys a run reads that conf/ does not define, so `+key=...` adds them (the only keys `+` may add):
# data_schedule (fedbench/data/schedule.py, docs/fedka.md)
EXTENSIONS = ("data_schedule",)


VALUED_FLAGS = {"--config-path", "-cp", "--config-dir", "-cd", "--config-name", "-cn", "--experimental-rerun", "--cfg",
                "-c", "--package", "-p"}  # flags whose next word is their value  # fmt: skip


def check_config_files(args: list[str]) -> None:
    """The YAML files of a ``--config-path`` / ``--config-dir`` parse: one line naming the file, line and problem
    (Hydra would print a parser traceback). ``--config-dir``'s folders go into ``CONFIG_DIRS`` (the pre-check's
    compose and the option lists search them)."""
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
            cfg = _defaults(tuple(searchpath() + base))  # --config-dir's files too
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
                composed = compose("config", overrides=searchpath() + combo)
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
