"""Paper tables from multirun directories: collect the runs, build the table in the paper's layout next to the
paper's numbers, write Markdown/CSV, draw PNGs, log to W&B (docs/report.md).

    fedbench-report outputs/multirun/<sweep> [<more sweeps>] [--out DIR] [--wandb [MODE] | --no-wandb] [--no-plots]
    fedbench-tables [--markdown [PATH]]          # every paper table with its command (docs/tables.md)

Only the run dirs' own files are read (never W&B's servers): ``config.yaml`` (resolved; ``.hydra/config.yaml`` before
a run started), ``.hydra/hydra.yaml`` (chosen group options, job number, overrides), ``status.json``,
``summary.json``, ``metrics.jsonl``, and each sweep's ``multirun.yaml`` (which jobs the sweep should have, so that
never-started jobs are reported as missing). The table comes from the runs' ``table:`` node (docs/experiments.md).
"""
from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import math
import re
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

NOT_RUN_DIRS = {".hydra", "wandb", "checkpoints", "diagnostics", "previous", "report"}
DERIVED = ("rounds_to_target", "speedup")   # metrics computed from metrics.jsonl (FedKA Table 2)
PAPERS = {"fedrema": "FedReMa", "ecl": "ECL", "fedka": "FedKA", "fedcom": "FedCOM", "cafeme": "CAFeMe"}


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
    """How cell keys and reference keys are matched: as strings, numbers by value (``1`` == ``1.0``, ``0.10`` == ``0.1``)."""
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
        except Exception:   # noqa: BLE001  (an override Hydra's grammar cannot re-read: keep it as written)
            key, _, value = item.partition("=")
        key = key.lstrip("+~")
        if value is not None and not key.startswith("hydra.") and key.split("@")[0] not in neutral:
            out[key] = value
    return out


@dataclass
class RunRecord:
    """One run of a sweep: its config, chosen group options, status and records (or a placeholder when missing)."""
    path: Path | None
    status: str                  # complete | failed | running | preempted | pending (dir, no status) | missing (no dir)
    config: dict
    choices: dict
    overrides: dict
    order: tuple = (0, 0)        # (position of the directory argument, job number): sweep order
    summary: dict = field(default_factory=dict)
    error: str | None = None
    _rounds: dict | None = None

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
                    continue   # a line cut by a kill
                self._rounds.setdefault(int(row.get("round", -1)), {}).update(row)
        return self._rounds

    def series(self, metric: str) -> list[tuple[int, float]]:
        """(round, value) of a per-round metric, rounds where it was logged."""
        return [(r, v) for r, row in sorted(self.rounds().items()) if (v := _number(row.get(metric))) is not None]


def load_run(d: Path, position: int, neutral: set) -> RunRecord:
    hydra = (_yaml(d / ".hydra" / "hydra.yaml") or {}).get("hydra") or {}
    config = _yaml(d / "config.yaml") or _yaml(d / ".hydra" / "config.yaml") or {}   # resolved once the run started
    num = _select(hydra, "job.num")
    run = RunRecord(d, "pending", config, dict(_select(hydra, "runtime.choices") or {}),
                    _overrides(_select(hydra, "overrides.task"), neutral),
                    (position, int(num) if isinstance(num, int) else 0))
    status = _json(d / "status.json")
    if status:
        run.status, run.error = str(status.get("status", "pending")), status.get("error")
    if run.status == "complete":
        summary = _json(d / "summary.json")
        if isinstance(summary, dict):
            run.summary = summary
        else:
            run.status, run.error = "failed", "status.json says complete but summary.json is missing or unreadable"
    return run


def expected_jobs(sweep: Path) -> list[dict] | None:
    """The jobs of the sweep's last launch ({key: value}), as Hydra's basic sweeper expands them; None if unknown."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hydra = (_yaml(sweep / "multirun.yaml") or {}).get("hydra") or {}
    if "BasicSweeper" not in str(_select(hydra, "sweeper._target_")):
        return None
    params = [f"{k}={v}" for k, v in (_select(hydra, "sweeper.params") or {}).items()]
    args = list(_select(hydra, "overrides.task") or [])
    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params + args), None)[0]
    return [_overrides(job, neutral_keys(sweep)) for job in jobs]


def neutral_keys(sweep: Path | None) -> set:
    """Override keys that do not change results (not part of a run's identity): the sweep's exclude_keys."""
    hydra = (_yaml(sweep / "multirun.yaml") or {}).get("hydra") or {} if sweep else {}
    return set(_select(hydra, "job.config.override_dirname.exclude_keys") or
               ["resume", "logger", "hardware.threads", "data_root", "cache_dir", "dataset.root", "dataset.download"])


def _placeholder(job: dict, order: tuple, runs: list[RunRecord], sweep: Path) -> RunRecord:
    """A never-started job: its cell comes from a sibling run (same overrides but the seed) or the sweep's config."""
    import copy

    sibling = next((r for r in runs if {k: v for k, v in r.overrides.items() if k != "seed"}
                    == {k: v for k, v in job.items() if k != "seed"}), None)
    if sibling:
        config, choices = copy.deepcopy(sibling.config), dict(sibling.choices)
    else:
        base = _yaml(sweep / "multirun.yaml") or {}
        choices = dict(_select(base, "hydra.runtime.choices") or {})
        config = {k: v for k, v in base.items() if k != "hydra"}
        for key, value in job.items():
            if key in choices or key.split("@")[0] in choices:
                choices[key.split("@")[0]] = value
            else:
                node = config
                *parents, last = key.split(".")
                for p in parents:
                    if not isinstance(node.get(p), dict):
                        node[p] = {}
                    node = node[p]
                node[last] = yaml.safe_load(value) if value else value
    if "seed" in job:
        config["seed"] = yaml.safe_load(job["seed"])
    return RunRecord(None, "missing", config, choices, job, order)


def collect(paths) -> list[RunRecord]:
    """Every run under the given directories (run dirs, multirun dirs or folders of them), plus a ``missing``
    placeholder for each job a sweep's ``multirun.yaml`` expects but no run dir holds."""
    runs, seen = [], set()
    for position, p in enumerate(map(Path, paths)):
        if not p.is_dir():
            raise FileNotFoundError(f"not a directory: {p}")
        sweeps = {d: neutral_keys(d) for d in _dirs(p) if (d / "multirun.yaml").exists()}
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
            found += [_placeholder(job, (position, i), mine, sweep) for i, job in enumerate(jobs or [])
                      if frozenset(job.items()) not in have]
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


# ---- tables -----------------------------------------------------------------------------------------------------

def default_table(runs: list[RunRecord], metric: str | None) -> dict:
    """For runs without a ``table:`` node: methods x best/final of one accuracy metric."""
    if metric is None:
        present = {m for r in runs for m in r.summary.get("metrics", {})}
        metric = next((m for m in ("pers/acc", "global/acc") if m in present), "pers/acc")
    return {"paper": "runs", "id": metric.replace("/", "_"), "title": f"{metric}: best and final (no table: node)",
            "rows": "choice:algorithm", "cols": None, "metrics": {"Best": f"{metric}.best", "Final": f"{metric}.final"},
            "percent": True}


@dataclass
class Table:
    spec: dict                        # the table node (merged when several configs make one paper table)
    members: list                     # [(run, its own table node)]
    stem: str = ""
    merged: bool = False              # several configs, one metric column each (FedKA Table 1's datasets)

    def __post_init__(self):
        s = self.spec
        self.paper, self.id, self.title = str(s.get("paper", "runs")), str(s.get("id", "table")), str(s.get("title", ""))
        self.rows, self.cols = s.get("rows") or "choice:algorithm", s.get("cols")
        self.metrics = {str(k): str(v) for k, v in (s.get("metrics") or {}).items()}
        self.target = s.get("target") or {}
        if "rounds_to_target" in self.metrics.values() and "speedup" not in self.metrics.values() and not self.cols:
            items = list(self.metrics.items())
            at = next(i for i, (_, p) in enumerate(items) if p == "rounds_to_target") + 1
            self.metrics = dict(items[:at] + [("Speedup", "speedup")] + items[at:])   # the paper's Table 2 column
        self.labels = {canon(k): str(v) for k, v in (s.get("labels") or {}).items()}
        self.reference = {canon(r): {canon(c): v for c, v in (cells or {}).items()}
                          for r, cells in (s.get("reference") or {}).items()}
        self._derive_reference_speedup()
        self.stem = self.stem or f"{self.paper}_{self.id}"

    def _derive_reference_speedup(self):
        """Paper speedup = paper rounds of the target row / paper rounds of the row (FedKA Table 2)."""
        name = next((n for n, p in self.metrics.items() if p == "rounds_to_target"), None)
        if name is None or "Speedup" not in self.metrics:
            return
        base = _number(self.reference.get(canon(self.target.get("row")), {}).get(canon(name)))
        for cells in self.reference.values():
            if canon(name) in cells and "Speedup" not in cells:
                r = _number(cells[canon(name)])
                cells["Speedup"] = base / r if base and r else None

    def percent(self, name: str) -> bool:
        """``percent: true`` shows accuracies x100 (metrics whose name contains ``acc``); a list names the columns."""
        p = self.spec.get("percent", False)
        if isinstance(p, (list, tuple)):
            return name in map(str, p)
        path = self.metrics.get(name, "")
        return bool(p) and "acc" in path.split("@")[0].lower() and path not in DERIVED


def group_tables(runs: list[RunRecord], metric: str | None = None) -> list[Table]:
    """Runs -> tables, one per (paper, id, title); configs that split one paper table into one metric column each
    (same paper and id, no ``cols``, disjoint metric names, e.g. FedKA Table 1's datasets) are merged."""
    plain = [r for r in runs if not isinstance(r.config.get("table"), dict)]
    fallback = default_table(plain, metric) if plain else None
    groups: dict = {}
    for r in runs:
        spec = r.config.get("table") if isinstance(r.config.get("table"), dict) else fallback
        groups.setdefault((str(spec.get("paper")), str(spec.get("id")), str(spec.get("title"))), []).append((r, spec))
    by_id: dict = {}
    for (paper, tid, _), members in groups.items():
        by_id.setdefault((paper, tid), []).append(members)
    tables = []
    for (paper, tid), parts in by_id.items():
        specs = [m[0][1] for m in parts]
        names = [set(map(str, s.get("metrics") or {})) for s in specs]
        if len(parts) > 1 and not any(s.get("cols") for s in specs) and sum(map(len, names)) == len(set().union(*names)):
            tables.append(Table(_merge(specs), [m for members in parts for m in members], merged=True))
        elif len(parts) > 1:   # same id, different tables: name the files after the experiment config
            for members in parts:
                exp = members[0][0].choices.get("experiment") or members[0][1].get("title")
                tables.append(Table(members[0][1], members, stem=f"{paper}_{_slug(str(exp).split('/')[-1])}"))
        else:
            tables.append(Table(specs[0], parts[0]))
    return tables


def _merge(specs: list[dict]) -> dict:
    out = dict(specs[0], metrics={}, labels={}, reference={})
    for s in specs:
        out["metrics"].update(s.get("metrics") or {})
        out["labels"].update(s.get("labels") or {})
        for row, cells in (s.get("reference") or {}).items():
            out["reference"].setdefault(row, {}).update(cells or {})
    titles = [str(s.get("title", "")) for s in specs]
    prefix = titles[0][:next((i for i, cs in enumerate(zip(*titles)) if len(set(cs)) > 1), min(map(len, titles)))]
    cut = max(prefix.rfind(" ("), prefix.rfind(" — "))
    out["title"] = (prefix[:cut] if cut > 0 else prefix).rstrip(" :—-(,") if len(set(titles)) > 1 else titles[0]
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_") or "x"


# ---- cells -----------------------------------------------------------------------------------------------------

@dataclass
class Cell:
    values: list = field(default_factory=list)     # one per run with a value (displayed units)
    seeds: list = field(default_factory=list)
    other: Counter = field(default_factory=Counter)  # runs without a value, by reason: failed, running, missing, never, ...

    @property
    def n_runs(self) -> int:
        return len(self.values) + sum(self.other.values())

    @property
    def mean(self):
        return float(np.mean(self.values)) if self.values else None

    @property
    def std(self):
        return float(np.std(self.values)) if self.values else None   # population std over seeds (ddof=0)

    def text(self, decimals: int = 2) -> str:
        """``61.20 ± 0.40``, ``61.20 ± 0.40 (2/3, 1 failed)``, ``failed``, ``\\`` (never reached), ``not run``."""
        if not self.n_runs:
            return "not run"
        if not self.values:
            if set(self.other) == {"never"}:
                return "\\"
            if set(self.other) == {"no value"}:
                return "—"
            return ", ".join(k if n == self.n_runs else f"{n} {k}" for k, n in self.other.items())
        s = fmt(self.mean, decimals) + (f" ± {fmt(self.std, decimals)}" if len(self.values) > 1 else "")
        if self.other:
            s += f" ({len(self.values)}/{self.n_runs}, " + ", ".join(f"{n} {k}" for k, n in self.other.items()) + ")"
        return s


def fmt(x, decimals: int = 2, sign: bool = False) -> str:
    if x is None:
        return ""
    s = f"{float(x):.{decimals}f}"
    return "+" + s if sign and float(x) > 0 else s


def decimals(numbers: list, percent: bool) -> int:
    """Digits of a column: 2 for percentages; 0 when every number is whole (rounds, CCP lengths); 4 for fractions."""
    if percent or not numbers:
        return 2
    if all(float(x).is_integer() for x in numbers):
        return 0
    return 4 if max(abs(x) for x in numbers) < 1 else 2


@dataclass
class Column:
    key: str          # canon of the column value (cols set) or the metric name (cols null)
    header: str
    metric: str       # metric name in the table's ``metrics``


class Report:
    """A table's cells (row x column over seeds), its rows and columns in the paper's order, and the paper's numbers."""

    def __init__(self, table: Table):
        self.table = t = table
        self.members = list(t.members)
        self.row_keys, self.row_names = self._order(t.rows, [r.key(t.rows) for r, _ in self.members],
                                                    list(t.reference), t.labels)
        if t.cols:
            metric = next(iter(t.metrics))
            ref_cols = [c for cells in t.reference.values() for c in cells]
            keys, names = self._order(t.cols, [r.key(t.cols) for r, _ in self.members], ref_cols, t.labels)
            short = t.cols.split(":")[-1].split(".")[-1]
            numeric = all(_is_num(k) for k in keys)
            self.columns = [Column(k, f"{short}={names[k]}" if numeric else names[k], metric) for k in keys]
        else:
            self.columns = [Column(canon(n), n, n) for n in t.metrics]
        self.cells = {(row, c.key): self._cell(row, c) for row in self.row_keys for c in self.columns}
        self.digits = {c.key: decimals([x for r in self.row_keys for x in self._numbers(r, c)], t.percent(c.metric))
                       for c in self.columns}

    def _numbers(self, row: str, col: Column) -> list:
        cell, paper = self.cells[(row, col.key)], _number(self.paper(row, col))
        return cell.values + ([cell.mean, cell.std] if cell.values else []) + ([paper] if paper is not None else [])

    def _order(self, key: str, values: list, ref: list, labels: dict) -> tuple[list, dict]:
        """Keys in the paper's order: numbers sorted; otherwise labels, then reference, then sweep order."""
        names: dict = {}
        for v in values:
            if v is not None:
                names.setdefault(canon(v), str(v))
        for r in ref:
            names.setdefault(r, r)
        keys = list(names)
        if keys and all(_is_num(k) for k in keys):
            keys.sort(key=float)
        else:
            rank = {k: i for i, k in enumerate(list(labels) + [r for r in ref if r not in labels])}
            first = {k: i for i, k in enumerate(keys)}
            keys.sort(key=lambda k: (rank.get(k, len(rank)), first[k]))
        return keys, {k: labels.get(k, names[k]) for k in keys}

    def _runs(self, row: str, col: Column) -> list:
        t = self.table
        return [(r, s) for r, s in self.members if canon(r.key(t.rows)) == row
                and (canon(r.key(t.cols)) == col.key if t.cols else col.metric in _metric_names(s))]

    def _cell(self, row: str, col: Column) -> Cell:
        t, cell = self.table, Cell()
        path = t.metrics[col.metric]
        scale = 100.0 if t.percent(col.metric) else 1.0
        for run, _ in self._runs(row, col):
            if run.status != "complete":
                cell.other[run.status] += 1
                continue
            v = self.value(run, path, col)
            if isinstance(v, float):
                cell.values.append(scale * v)
                cell.seeds.append(run.seed)
            else:
                cell.other[v] += 1
        return cell

    def value(self, run: RunRecord, path: str, col: Column):
        """A run's number for a metric path, or why there is none (``no value``, ``never``, ``no target``)."""
        if path in DERIVED:
            return self._to_target(run, path, col)
        if "@" in path:                                     # <metric>@<round>: the value logged at that round
            name, at = path.rsplit("@", 1)
            v = _number(run.rounds().get(int(at), {}).get(name))
        else:
            s = run.summary
            v = s.get(path)
            if v is None and "." in path:                   # <metric>.<stat> in metrics, or <key>.<field>
                name, stat = path.rsplit(".", 1)
                node = s.get("metrics", {}).get(name, s.get(name))
                v = node.get(stat) if isinstance(node, dict) else None
            v = _number(v)
        return "no value" if v is None else v

    def _to_target(self, run: RunRecord, path: str, col: Column):
        """FedKA Table 2: the first round whose ``target.metric`` ≥ the target row's value at round ``target.at``
        (``last`` = its last logged round) — same seed, same column; speedup = that target round / rounds."""
        t = self.table
        metric, row, at = t.target.get("metric", "global/acc"), canon(t.target.get("row")), t.target.get("at", "last")
        ref = next((r for r, _ in self.members if r.status == "complete" and canon(r.key(t.rows)) == row
                    and r.seed == run.seed and (not t.cols or canon(r.key(t.cols)) == col.key)), None)
        pts = ref.series(metric) if ref else []
        if str(at) != "last":
            pts = [p for p in pts if p[0] == int(at)]
        if not pts:
            return "no target"
        target_round, target = pts[-1]
        reached = next((r for r, v in run.series(metric) if r >= 1 and v >= target), None)
        if reached is None:
            return "never"
        return float(reached) if path == "rounds_to_target" else float(target_round) / reached

    # ---- the paper's numbers -------------------------------------------------------------------------------
    def paper(self, row: str, col: Column):
        cells = self.table.reference.get(row, {})
        return cells.get(col.key if self.table.cols else canon(col.metric), "absent")

    def has_paper(self, col: Column) -> bool:
        return any(self.paper(r, col) != "absent" for r in self.row_keys)

    def paper_text(self, row: str, col: Column) -> str:
        p = self.paper(row, col)
        if p == "absent":
            return ""
        if p is None:   # the paper prints no number: "\" for rounds-to-target (never reached), "—" otherwise
            return "\\" if self.table.metrics[col.metric] in DERIVED else "—"
        return fmt(p, self.digits[col.key]) if _number(p) is not None else str(p)

    def diff(self, row: str, col: Column):
        p, m = _number(self.paper(row, col)), self.cells[(row, col.key)].mean
        return None if p is None or m is None else m - p

    # ---- what is not complete ---------------------------------------------------------------------------------
    def incomplete(self) -> list[RunRecord]:
        return [r for r, _ in self.members if r.status != "complete"]

    def seeds_note(self) -> str:
        ns = {self.cells[k].n_runs for k in self.cells if self.cells[k].n_runs}
        clean = not any(c.other for c in self.cells.values())
        done = [r for r, _ in self.members if r.status == "complete"]
        rounds = {r.config.get("rounds") for r in done}
        head = f"{len(done)}/{len(self.members)} runs complete" + \
            (f" ({rounds.pop()} rounds each)" if len(rounds) == 1 else "") + ". Mean ± std over seeds (population std)"
        if clean and len(ns) == 1:
            return f"{head}; n = {ns.pop()} seed(s) per cell."
        return f"{head}; (k/n, ...) = k of the cell's n runs have a value, the others are listed."

    def warnings(self) -> list[str]:
        """Cells holding two runs of the same seed (runs that differ in a key the table does not show)."""
        out = []
        for (row, col), cell in self.cells.items():
            twice = sorted(str(s) for s, n in Counter(cell.seeds).items() if n > 1)
            if twice:
                out.append(f"cell ({self.row_names[row]}, {col}) has several runs with seed {', '.join(twice)}: "
                           "they differ in a key that is neither the table's rows nor its columns")
        return out

    def header(self) -> list[str]:
        out = [self.row_title()]
        for c in self.columns:
            out += [c.header] + (["paper", "Δ"] if self.has_paper(c) else [])
        return out

    def row_title(self) -> str:
        key = self.table.rows
        return "Method" if key == "choice:algorithm" else key.split(":")[-1].split(".")[-1]

    def lines(self) -> list[list[str]]:
        out = []
        for row in self.row_keys:
            line = [self.row_names[row]]
            for c in self.columns:
                line.append(self.cells[(row, c.key)].text(self.digits[c.key]))
                if self.has_paper(c):
                    line += [self.paper_text(row, c), fmt(self.diff(row, c), self.digits[c.key], sign=True)]
            out.append(line)
        return out


def _metric_names(spec: dict) -> set:
    """The columns a run's own table node asks for (with the Speedup that goes with rounds_to_target)."""
    paths = {str(k): str(v) for k, v in (spec.get("metrics") or {}).items()}
    derived = "rounds_to_target" in paths.values() and "speedup" not in paths.values()
    return set(paths) | ({"Speedup"} if derived else set())


def _is_num(k) -> bool:
    try:
        float(k)
        return True
    except (TypeError, ValueError):
        return False


# ---- output ----------------------------------------------------------------------------------------------------

def to_markdown(rep: Report, pictures: list[Path], sources: list[str]) -> str:
    t, head = rep.table, rep.header()
    md = [f"# {t.title}", "", f"Runs: {', '.join(f'`{s}`' for s in sources)}. {rep.seeds_note()}"
          + (" Accuracies in %." if any(t.percent(n) for n in t.metrics) else ""), "",
          "| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    md += ["| " + " | ".join(x.replace("|", "\\|") for x in line) + " |" for line in rep.lines()]
    if rep.warnings():
        md += [""] + [f"**Warning:** {w}" for w in rep.warnings()]
    if rep.incomplete():
        md += ["", "Runs without a result:", ""]
        md += [f"- {r.status}: `{r.path or _job(r)}`" + (f" — {r.error}" if r.error else "") for r in rep.incomplete()]
    if pictures:
        md += [""] + [f"![{p.stem}]({p.name})" for p in pictures]
    return "\n".join(md) + "\n"


def _job(r: RunRecord) -> str:
    return ",".join(f"{k}={v}" for k, v in r.overrides.items())


CSV_FIELDS = ["table", "row", "row_label", "column", "metric", "ours_mean", "ours_std", "ours_min", "ours_max", "n",
              "n_runs", "seeds", "values", "status", "cell", "paper", "diff"]


def to_csv(rep: Report) -> str:
    """One line per cell (tidy): our mean/std/min/max over the n runs with a value, why the others have none."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_FIELDS)
    w.writeheader()
    for row in rep.row_keys:
        for c in rep.columns:
            cell, p = rep.cells[(row, c.key)], rep.paper(row, c)
            w.writerow({"table": rep.table.stem, "row": row, "row_label": rep.row_names[row], "column": c.header,
                        "metric": c.metric, "ours_mean": _csvnum(cell.mean), "ours_std": _csvnum(cell.std),
                        "ours_min": _csvnum(min(cell.values, default=None)), "ours_max": _csvnum(max(cell.values, default=None)),
                        "n": len(cell.values), "n_runs": cell.n_runs, "seeds": ";".join(map(str, cell.seeds)),
                        "values": ";".join(repr(v) for v in cell.values),
                        "status": ";".join(f"{k}={n}" for k, n in cell.other.items()), "cell": cell.text(rep.digits[c.key]),
                        "paper": "" if p == "absent" else rep.paper_text(row, c), "diff": _csvnum(rep.diff(row, c))})
    return buf.getvalue()


def _csvnum(x) -> str:
    return "" if x is None else repr(float(x))


def print_rich(rep: Report, console=None) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    console = console or Console(width=max(100, shutil.get_terminal_size((180, 40)).columns))
    rt = RichTable(title=Text(rep.table.title), caption=Text(rep.seeds_note()))
    rt.add_column(Text(rep.row_title()))
    for c in rep.columns:
        rt.add_column(Text(c.header), justify="right")
        if rep.has_paper(c):
            rt.add_column("paper", justify="right", style="dim")
            rt.add_column("Δ", justify="right", style="dim")
    for row, line in zip(rep.row_keys, rep.lines()):
        styled, i = [Text(line[0])], 1
        for c in rep.columns:
            cell = rep.cells[(row, c.key)]
            style = "red" if "failed" in cell.other else "yellow" if cell.other or not cell.n_runs else ""
            n = 3 if rep.has_paper(c) else 1
            styled += [Text(line[i], style=style)] + [Text(x) for x in line[i + 1:i + n]]
            i += n
        rt.add_row(*styled)
    console.print(rt)
    for r in rep.incomplete():
        console.print(Text.assemble("  ", (r.status, "yellow"), f": {r.path or _job(r)}" + (f" — {r.error}" if r.error else "")))
    for warning in rep.warnings():
        console.print(Text.assemble("  ", ("warning", "red"), f": {warning}"))


# ---- plots -------------------------------------------------------------------------------------------------------

def _plt():
    from . import plots  # noqa: F401  (selects the Agg backend)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _curve_metric(t: Table, path: str) -> str:
    """The per-round metric behind a column: ``pers/acc`` for ``pers/acc.best``, ``global/acc`` for ``global/acc@10``."""
    if path in DERIVED:
        return t.target.get("metric", "global/acc")
    return path.split("@")[0] if "@" in path else path.rsplit(".", 1)[0] if "." in path else path


def curve_metrics(rep: Report) -> list[str]:
    """The per-round metrics behind the table's columns that the runs logged at two rounds or more."""
    names = []
    for path in rep.table.metrics.values():
        name = _curve_metric(rep.table, path)
        if name not in names and any(r.series(name)[1:2] for r, _ in rep.members if r.status == "complete"):
            names.append(name)
    return names


def plot_curves(rep: Report, out: Path, band: str = "minmax") -> list[Path]:
    """Per method, accuracy vs round: the mean over seeds and a band (min–max or ± std); one panel per column value
    (or per merged config's column), complete runs only."""
    plt, t, pngs = _plt(), rep.table, []
    for metric in curve_metrics(rep):
        panels = [c for c in rep.columns if t.cols or (t.merged and _curve_metric(t, t.metrics[c.metric]) == metric)]
        n = max(1, len(panels))
        scale = 100.0 if t.spec.get("percent") and "acc" in metric else 1.0
        fig, axes = plt.subplots(math.ceil(n / 3), min(n, 3), figsize=(5.2 * min(n, 3), 3.6 * math.ceil(n / 3)),
                                 squeeze=False)
        for ax, col in zip(axes.flat, panels or [None]):
            for i, row in enumerate(rep.row_keys):
                runs = [r for r, _ in (rep._runs(row, col) if col else rep.members)
                        if r.status == "complete" and canon(r.key(t.rows)) == row]
                series = [dict(r.series(metric)) for r in runs]
                common = sorted(set.intersection(*(set(s) for s in series))) if series else []
                if len(common) < 2:
                    continue
                y = scale * np.array([[s[x] for x in common] for s in series])
                mean = y.mean(0)
                lo, hi = (y.min(0), y.max(0)) if band == "minmax" else (mean - y.std(0), mean + y.std(0))
                color = f"C{i % 10}"
                ax.plot(common, mean, color=color, label=f"{rep.row_names[row]} (n={len(runs)})")
                if len(runs) > 1:
                    ax.fill_between(common, lo, hi, color=color, alpha=0.2, linewidth=0)
            ax.set_title(col.header if col else metric, fontsize=9)
            ax.set_xlabel("round")
            ax.set_ylabel(metric + (" (%)" if scale == 100 else ""))
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.suptitle(f"{t.title}\nmean over seeds, band = {'min–max' if band == 'minmax' else '± std'}", fontsize=9)
        pngs.append(_save(fig, out / f"{t.stem}_curves_{_slug(metric)}.png"))
    return pngs


def plot_vs_keys(rep: Report, out: Path) -> list[Path]:
    """Metric vs a numeric row/column key, one line per other key, the paper's numbers dashed (δ, α, IF, ...)."""
    plt, t, pngs = _plt(), rep.table, []
    numeric_rows = len(rep.row_keys) > 1 and all(_is_num(k) for k in rep.row_keys)
    numeric_cols = len(rep.columns) > 1 and all(_is_num(c.key) for c in rep.columns)
    if numeric_cols:   # x = column value, one line per row (accuracy vs α per method, vs IF per expert count)
        xlabel = t.cols.split(":")[-1].split(".")[-1] if t.cols else "column"   # cols null: numeric metric names
        ylabel = rep.columns[0].metric if t.cols else "value"
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [float(c.key) for c in rep.columns]
        for i, row in enumerate(rep.row_keys):
            name = f"{rep.row_title()}={rep.row_names[row]}" if _is_num(row) and row not in t.labels else rep.row_names[row]
            _line(ax, xs, [rep.cells[(row, c.key)] for c in rep.columns], [rep.paper(row, c) for c in rep.columns],
                  f"C{i % 10}", name)
        _axes(ax, xs, xlabel, ylabel + (" (%)" if all(t.percent(c.metric) for c in rep.columns) else ""))
        ax.set_title(t.title, fontsize=9)
        pngs.append(_save(fig, out / f"{t.stem}_vs_{_slug(xlabel)}.png"))
    if numeric_rows:   # x = row value; one line per column (cols set) or one panel per kind of metric (δ table)
        xs = [float(k) for k in rep.row_keys]
        xlabel = rep.row_title()
        if t.cols:
            groups = [(rep.columns[0].metric, rep.columns)]
        else:
            acc = [c for c in rep.columns if t.percent(c.metric) or "acc" in t.metrics[c.metric]]
            groups = ([("accuracy", acc)] if acc else []) + [(c.metric, [c]) for c in rep.columns if c not in acc]
        fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.8), squeeze=False)
        for ax, (name, cols) in zip(axes.flat, groups):
            for i, c in enumerate(cols):
                _line(ax, xs, [rep.cells[(r, c.key)] for r in rep.row_keys], [rep.paper(r, c) for r in rep.row_keys],
                      f"C{i % 10}", c.header)
            _axes(ax, xs, xlabel, name + (" (%)" if any(t.percent(c.metric) for c in cols) else ""))
        fig.suptitle(t.title, fontsize=9)
        pngs.append(_save(fig, out / f"{t.stem}_vs_{_slug(xlabel)}.png"))
    return pngs


def _line(ax, xs, cells, papers, color, label):
    pts = [(x, c.mean, c.std) for x, c in zip(xs, cells) if c.mean is not None]
    if pts:
        x, m, s = zip(*pts)
        ax.errorbar(x, m, yerr=s, color=color, marker="o", capsize=3, label=f"{label} (ours)")
    ref = [(x, float(p)) for x, p in zip(xs, papers) if _number(p) is not None]
    if ref:
        x, p = zip(*ref)
        ax.plot(x, p, color=color, linestyle="--", marker="o", markerfacecolor="none", alpha=0.8, label=f"{label} (paper)")


def _axes(ax, xs, xlabel, ylabel):
    if min(xs) > 0 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([canon(x) for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)


# ---- W&B --------------------------------------------------------------------------------------------------------

def wandb_mode(requested: str | None, rep: Report) -> str:
    """``--wandb MODE`` wins; otherwise the runs' own ``logger.wandb.mode`` (auto = online with an API key)."""
    from .loggers import wandb_mode as resolve

    if requested is None:
        modes = [_select(r.config, "logger.wandb.mode") for r, _ in rep.members if r.status == "complete"]
        requested = next((m for m in modes if m and m != "disabled"), "disabled")
    return "disabled" if requested == "disabled" else resolve(requested)


def log_wandb(rep: Report, pictures: list[Path], out: Path, mode: str, group: str) -> str:
    """One W&B run (job_type ``report``) with the table as a ``wandb.Table`` and the pictures."""
    import wandb

    run0 = next((r for r, _ in rep.members if r.status == "complete"), rep.members[0][0])
    w = _select(run0.config, "logger.wandb") or {}
    run = wandb.init(project=w.get("project") or "fedbench", entity=w.get("entity"), group=group, job_type="report",
                     name=f"report-{rep.table.stem}", dir=str(out), mode=mode, config={"table": rep.table.spec},
                     reinit="finish_previous", settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
    rows = list(csv.reader(io.StringIO(to_csv(rep))))
    run.log({f"report/{rep.table.stem}": wandb.Table(columns=rows[0], data=rows[1:]),
             **{f"report/{p.stem}": wandb.Image(str(p)) for p in pictures}})
    run.finish()
    return run.id


# ---- entry points --------------------------------------------------------------------------------------------------

def report(dirs, out: Path | None = None, plots: bool = True, wandb: str | None = None, metric: str | None = None,
           band: str = "minmax", console=None) -> list[tuple[Report, list[Path]]]:
    """Every table found in ``dirs``: printed, written to ``out`` (default ``<first dir>/report``), plotted, logged."""
    runs = collect(dirs)
    if not runs:
        raise FileNotFoundError(f"no runs under {', '.join(map(str, dirs))}")
    out = Path(out) if out else Path(dirs[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for table in group_tables(runs, metric):
        rep = Report(table)
        print_rich(rep, console)
        pictures = (plot_curves(rep, out, band) + plot_vs_keys(rep, out)) if plots else []
        (out / f"{table.stem}.md").write_text(to_markdown(rep, pictures, [str(d) for d in dirs]))
        (out / f"{table.stem}.csv").write_text(to_csv(rep))
        mode = wandb_mode(wandb, rep)
        if mode != "disabled":
            try:
                log_wandb(rep, pictures, out, mode, group=Path(dirs[0]).resolve().name)
            except Exception as e:  # noqa: BLE001  (the files above are the report; W&B is a copy)
                print(f"fedbench-report: W&B logging ({mode}) failed: {type(e).__name__}: {e}", file=sys.stderr)
        done.append((rep, pictures))
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fedbench-report", description="Paper tables from multirun directories: "
                                 "mean ± std over seeds next to the paper's numbers, Markdown/CSV and PNGs (docs/report.md).")
    ap.add_argument("dirs", nargs="+", type=Path, help="multirun dirs (or run dirs, or folders holding them)")
    ap.add_argument("--out", type=Path, help="where report files go (default: <first dir>/report)")
    ap.add_argument("--no-plots", action="store_true", help="tables only")
    ap.add_argument("--wandb", nargs="?", const="auto", choices=["auto", "online", "offline", "disabled"],
                    help="log the table to W&B in this mode (default: as the runs' logger.wandb.mode)")
    ap.add_argument("--no-wandb", action="store_const", const="disabled", dest="wandb", help="never log to W&B")
    ap.add_argument("--metric", help="for runs without a table: node, the accuracy metric to show (default pers/acc)")
    ap.add_argument("--band", choices=["minmax", "std"], default="minmax", help="band of the accuracy curves over seeds")
    args = ap.parse_args(argv)
    try:
        done = report(args.dirs, args.out, not args.no_plots, args.wandb, args.metric, args.band)
    except FileNotFoundError as e:
        print(f"fedbench-report: {e}", file=sys.stderr)
        return 1
    out = args.out or args.dirs[0] / "report"
    print(f"fedbench-report: wrote {', '.join(r.table.stem for r, _ in done)} (.md, .csv"
          + (", .png" if any(p for _, p in done) else "") + f") to {out}", file=sys.stderr)
    return 0


# ---- the table -> command listing ------------------------------------------------------------------------------

def _natural(text: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def experiment_tables(conf_dir: Path | None = None) -> list[dict]:
    """Every config under conf/experiment with a ``table:`` node: name, paper, id, title, #runs, commands."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if conf_dir is None:
        from .cli import CONF_DIR as conf_dir
    root = Path(conf_dir) / "experiment"
    out = []
    for f in sorted(root.rglob("*.yaml"), key=lambda p: _natural(str(p.relative_to(root)))):
        text = f.read_text()
        node = yaml.safe_load(text) or {}
        t = node.get("table")
        if not isinstance(t, dict):
            continue
        name = str(f.relative_to(root).with_suffix(""))
        params = [f"{k}={v}" for k, v in (_select(node, "hydra.sweeper.params") or {}).items()]
        sizes = [len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
                 for o in OverridesParser.create().parse_overrides(params)]
        header = " ".join(ln.lstrip("#").strip() for ln in itertools.takewhile(lambda s: s.startswith("#"), text.splitlines())
                          if "@package" not in ln)
        command = f"fedbench -m +experiment={name}"
        cpu = re.search(r"CPU(?: \([^)]*\))?:\s*`([^`]+)`(\s*\([^)]*\))?", header)
        reduced = cpu.group(1).strip() if cpu else None
        if reduced and not reduced.startswith("fedbench"):   # the header gives only the overrides
            reduced = f"{command} {reduced}"
        out.append({"name": name, "paper": str(t.get("paper")), "id": str(t.get("id")), "title": str(t.get("title", "")),
                    "runs": int(np.prod(sizes)) if sizes else 1, "command": command, "reduced": reduced,
                    "note": (cpu.group(2) or "").strip(" ()") if cpu else ""})
    return out


def tables_markdown(entries: list[dict]) -> str:
    md = ["# Paper tables and their commands", "",
          "Generated by `fedbench-tables --markdown` from the `table:` nodes and header comments of "
          "`conf/experiment/**` (docs/experiments.md). Each line is one command for the whole grid at paper scale "
          "(\"runs\" = jobs of the sweep); the reduced command is the CPU-sized version stated in the config's header. "
          "Add `dataset.root=/work/shared/data` (or set `FEDBENCH_DATA`) for the real datasets, then "
          "`fedbench-report <sweep dir>` prints the table next to the paper's numbers (docs/report.md).", ""]
    for paper, group in itertools.groupby(sorted(entries, key=lambda e: e["paper"]), key=lambda e: e["paper"]):
        md += [f"## {PAPERS.get(paper, paper)}", "", "| config | title | runs | command | reduced (CPU) command |",
               "|---|---|---:|---|---|"]
        md += [f"| `{e['name']}` | {e['title'].replace('|', '/')} | {e['runs']} | `{e['command']}` | "
               + (f"`{e['reduced']}`" + (f" ({e['note']})" if e["note"] else "") if e["reduced"] else "—") + " |"
               for e in group]
        md.append("")
    return "\n".join(md)


def list_tables(argv=None) -> int:
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    from .cli import CONF_DIR

    ap = argparse.ArgumentParser(prog="fedbench-tables", description="Every paper table with its one command.")
    ap.add_argument("--markdown", nargs="?", const=CONF_DIR.parent / "docs" / "tables.md", type=Path,
                    help="also write the listing as Markdown (default path: the repository's docs/tables.md)")
    args = ap.parse_args(argv)
    entries = experiment_tables(CONF_DIR)
    console = Console(width=max(120, shutil.get_terminal_size((200, 40)).columns))
    rt = RichTable(title="fedbench paper tables", show_lines=True)
    for col in ("paper", "config", "title", "runs", "command / reduced (CPU)"):
        rt.add_column(col, overflow="fold")
    for e in entries:
        reduced = f"{e['reduced']}" + (f" ({e['note']})" if e["note"] else "") if e["reduced"] else ""
        rt.add_row(PAPERS.get(e["paper"], e["paper"]), e["name"], Text(e["title"]), str(e["runs"]),
                   Text.assemble(e["command"], ("\n" + reduced, "dim") if reduced else ""))
    console.print(rt)
    if args.markdown:
        args.markdown.write_text(tables_markdown(entries))
        print(f"fedbench-tables: wrote {args.markdown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
