"""Reading run directories into records: a sweep's run dirs (config, chosen options, status, summary, metrics) and
a placeholder for each job its ``multirun.yaml`` expects but no run dir holds."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..rundir import process_gone

NOT_RUN_DIRS = {".hydra", "wandb", "checkpoints", "diagnostics", "previous", "report"}


# ---- reading runs ---------------------------------------------------------------------------------------------


def _yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _select(d, dotted: str):
    """``d["a"]["b"]`` for ``"a.b"``; None when a part is missing."""
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def canon(v) -> str:
    """How cell keys and reference keys are matched: as strings, numbers by value
    (``1`` == ``1.0``, ``0.10`` == ``0.1``)."""
    if isinstance(v, bool) or v is None:
        return str(v)
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(x) or math.isinf(x):
        return str(v)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _overrides(items, neutral: set) -> dict:
    """Hydra override strings -> {key: value string}, without ``+``/``~`` prefixes and results-neutral keys."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), {}
    for item in map(str, items or []):
        try:
            [o] = parser.parse_overrides([item])
            key, value = o.get_key_element(), o.get_value_element_as_str() if not o.is_sweep_override() else None
        except Exception:  # noqa: BLE001  (an override Hydra's grammar cannot re-read: keep it as written)
            key, _, value = item.partition("=")
        key = key.lstrip("+~")
        if value is not None and not key.startswith("hydra.") and key.split("@")[0] not in neutral:
            out[key] = value
    return out


@dataclass
class RunRecord:
    """One run of a sweep: its config, chosen group options, status and records (or a placeholder when missing)."""

    path: Path | None
    status: str  # complete | failed | running | preempted | pending (dir, no status) | missing (no dir)
    config: dict
    choices: dict
    overrides: dict
    order: tuple = (0, 0)  # (position of the directory argument, job number): sweep order
    summary: dict = field(default_factory=dict)
    error: str | None = None
    job: dict | None = None  # the claims job this run was matched to by its config (fedbench/claims/results.py)
    lacking: list = field(default_factory=list)  # ... and the config keys it predates
    machine: str | None = None  # where it was made (a record's; a run dir's status.json: :meth:`made_on`)
    _rounds: dict | None = None

    def made_on(self) -> str | None:
        """The machine it was made on: its record's, else its status.json's (runs older than the field: None)."""
        if self.machine is None and self.path is not None:
            try:
                self.machine = json.loads((self.path / "status.json").read_text()).get("machine")
            except (OSError, ValueError):
                pass
        return self.machine

    @property
    def seed(self):
        return self.config.get("seed")

    def key(self, key: str):
        """A table key: ``choice:<group>`` = the chosen option of a config group, otherwise a dotted config key."""
        return self.choices.get(key[7:]) if key.startswith("choice:") else _select(self.config, key)

    def rounds(self) -> dict:
        """``metrics.jsonl`` merged by round (an evaluation round may be written as several lines)."""
        if self._rounds is None:
            self._rounds = {}
            try:
                lines = (self.path / "metrics.jsonl").read_text().splitlines() if self.path else []
            except OSError:
                lines = []
            for line in lines:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill
                self._rounds.setdefault(int(row.get("round", -1)), {}).update(row)
        return self._rounds

    def series(self, metric: str) -> list[tuple[int, float]]:
        """(round, value) of a per-round metric, rounds where it was logged."""
        return [(r, v) for r, row in sorted(self.rounds().items()) if (v := _number(row.get(metric))) is not None]


def load_run(d: Path, position: int, neutral: set) -> RunRecord:
    hydra = (_yaml(d / ".hydra" / "hydra.yaml") or {}).get("hydra") or {}
    config = _yaml(d / "config.yaml") or _yaml(d / ".hydra" / "config.yaml") or {}  # resolved once the run started
    num = _select(hydra, "job.num")
    run = RunRecord(
        d,
        "pending",
        config,
        dict(_select(hydra, "runtime.choices") or {}),
        _overrides(_select(hydra, "overrides.task"), neutral),
        (position, int(num) if isinstance(num, int) else 0),
    )
    status = _json(d / "status.json")
    if status:
        run.status, run.error = str(status.get("status", "pending")), status.get("error")
        if gone := process_gone(status):  # "running" with a dead process (kill -9, out of memory): not running
            run.status, run.error = "lost", gone
    if run.status == "complete":
        summary = _json(d / "summary.json")
        if isinstance(summary, dict):
            run.summary = summary
        else:
            run.status, run.error = "failed", "status.json says complete but summary.json is missing or unreadable"
    return run


def expected_jobs(sweep: Path) -> list[dict] | None:
    """The jobs of the sweep's last launch ({key: value}), as Hydra's basic sweeper expands them; None if unknown."""
    hydra = (_yaml(sweep / "multirun.yaml") or {}).get("hydra") or {}
    if "BasicSweeper" not in str(_select(hydra, "sweeper._target_")):
        return None
    params = [f"{k}={v}" for k, v in (_select(hydra, "sweeper.params") or {}).items()]
    return expand_jobs(params + list(_select(hydra, "overrides.task") or []), neutral_keys(sweep))


def expand_jobs(overrides: list[str], neutral: set) -> list[dict]:
    """The jobs of a multirun ({key: value}) from its sweeper params followed by its task overrides (later ones win),
    as Hydra's basic sweeper expands them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(list(overrides)), None)[0]
    return [_overrides(job, neutral) for job in jobs]


def neutral_keys(sweep: Path | None) -> set:
    """Override keys that do not change results (not part of a run's identity): the sweep's exclude_keys."""
    hydra = (_yaml(sweep / "multirun.yaml") or {}).get("hydra") or {} if sweep else {}
    return set(
        _select(hydra, "job.config.override_dirname.exclude_keys")
        or ["resume", "logger", "hardware.threads", "data_root", "cache_dir", "dataset.root", "dataset.download"]
    )


def _placeholder(job: dict, order: tuple, runs: list[RunRecord], sweep: Path) -> RunRecord:
    """A never-started job: its cell comes from a sibling run (same overrides but the seed) or the sweep's config."""
    sibling = next(
        (
            r
            for r in runs
            if {k: v for k, v in r.overrides.items() if k != "seed"} == {k: v for k, v in job.items() if k != "seed"}
        ),
        None,
    )
    if sibling:
        run = missing_run({k: v for k, v in job.items() if k == "seed"}, sibling.config, sibling.choices, order)
    else:
        base = _yaml(sweep / "multirun.yaml") or {}
        run = missing_run(
            job,
            {k: v for k, v in base.items() if k != "hydra"},
            dict(_select(base, "hydra.runtime.choices") or {}),
            order,
        )
    run.overrides = dict(job)
    return run


def missing_run(job: dict, config: dict, choices: dict, order: tuple = (0, 0)) -> RunRecord:
    """A job no run dir holds (status ``missing``): a base ``config`` and group ``choices`` with the job's own values
    (a config group's option when ``choices`` has that group, otherwise a dotted config key)."""
    import copy

    config, choices = copy.deepcopy(config), dict(choices)
    for key, value in job.items():
        if key in choices or key.split("@")[0] in choices:
            choices[key.split("@")[0]] = value
            continue
        node = config
        *parents, last = key.split(".")
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[last] = yaml.safe_load(value) if value else value
    return RunRecord(None, "missing", config, choices, dict(job), order)


def collect(paths) -> list[RunRecord]:
    """Every run under the given directories (run dirs, multirun dirs or folders of them), plus a ``missing``
    placeholder for each job a sweep's ``multirun.yaml`` expects but no run dir holds."""
    runs, seen = [], set()  # run dirs and sweep dirs read already (a dir given twice, or inside another, counts once)
    for position, p in enumerate(map(Path, paths)):
        if not p.is_dir():
            raise FileNotFoundError(f"not a directory: {p}")
        sweeps = {
            d: neutral_keys(d)
            for d in _dirs(p)
            if (d / "multirun.yaml").exists() and ("sweep", d.resolve()) not in seen
        }
        seen.update(("sweep", d.resolve()) for d in sweeps)
        found = []
        for d in _dirs(p):
            if (d / ".hydra" / "hydra.yaml").exists() and d.resolve() not in seen:
                seen.add(d.resolve())
                sweep = next((s for s in sweeps if s in d.parents), None)
                found.append(load_run(d, position, sweeps[sweep] if sweep else neutral_keys(None)))
        for sweep in sweeps:
            jobs = expected_jobs(sweep)
            mine = [r for r in found if sweep in r.path.parents]
            have = {frozenset(r.overrides.items()) for r in mine}
            found += [
                _placeholder(job, (position, i), mine, sweep)
                for i, job in enumerate(jobs or [])
                if frozenset(job.items()) not in have
            ]
        runs += sorted(found, key=lambda r: r.order)
    return runs


def _dirs(root: Path):
    """root and every directory below it, without descending into a run's own folders (wandb, checkpoints, ...)."""
    yield root
    try:
        children = sorted(c for c in root.iterdir() if c.is_dir() and c.name not in NOT_RUN_DIRS)
    except OSError:
        return
    for c in children:
        yield from _dirs(c)
