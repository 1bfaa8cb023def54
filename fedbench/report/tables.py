"""A table laid out as the paper's (:class:`Report`): one cell per row and column over seeds, rows and columns in the
paper's order, the paper's numbers beside them with the difference. Which runs make a table is grouping.py's; how a
number or a metric is written is words.py's."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .grid import GridChoice, choose, tune_spec
from .grouping import DERIVED, Table
from .runs import RunRecord, _number, canon
from .words import decimals, fmt, path_words, window_words

__all__ = ["DERIVED", "Cell", "Column", "Report", "Table", "fmt", "path_words"]  # what other modules import from here

# columns shown beside the paper's number without a difference: seconds measure this machine (the paper's measure its
# GPU); counts of rounds (and FedKA's speedup, a ratio of them) depend on how many rounds ran, so they are compared
# only when the runs ran the paper's rounds (scale 1, rounds not overridden)
MACHINE_BOUND = ("wall_time", "time_per_round")
ROUND_BOUND = ("ccp_rounds", "rounds_to_target", "speedup")


@dataclass
class Cell:
    values: list = field(default_factory=list)  # one per run with a value (displayed units)
    seeds: list = field(default_factory=list)
    other: Counter = field(
        default_factory=Counter
    )  # runs without a value, by reason: failed, running, missing, never, ...

    @property
    def n_runs(self) -> int:
        return len(self.values) + sum(self.other.values())

    @property
    def mean(self):
        return float(np.mean(self.values)) if self.values else None

    @property
    def std(self):
        return float(np.std(self.values)) if self.values else None  # population std over seeds (ddof=0)

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


@dataclass
class Column:
    key: str  # canon of the column value (cols set) or the metric name (cols null)
    header: str
    metric: str  # metric name in the table's ``metrics``


class Report:
    """A table's cells (row x column over seeds), its rows and columns in the paper's order, and the paper's numbers."""

    def __init__(self, table: Table):
        self.table = t = table
        self.protocol: str | None = None  # the runs' evaluation protocol in one line (fedbench-report sets it)
        self.members = list(t.members)
        self._tune, self._grid = tune_spec(t.spec), {}  # best of a grid per tuned row (grid.py)
        self.row_keys, self.row_names = self._order(
            t.rows, [r.key(t.rows) for r, _ in self.members], list(t.reference), t.labels
        )
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
        self.digits = {
            c.key: decimals([x for r in self.row_keys for x in self._numbers(r, c)], t.percent(c.metric))
            for c in self.columns
        }

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
        """The cell's runs; for a row tuned over a grid (``tune:``), only those of its best grid value."""
        t = self.table
        runs = [
            (r, s)
            for r, s in self.members
            if canon(r.key(t.rows)) == row
            and (canon(r.key(t.cols)) == col.key if t.cols else col.metric in _metric_names(s))
        ]
        choice = self.grid(row, col)
        return runs if choice is None else [(r, s) for r, s in runs if canon(r.key(choice.key)) == choice.chosen]

    def grid(self, row: str, col: Column) -> GridChoice | None:
        """The best-of-grid choice of a tuned row (per column value, or once per row when the columns are metrics)."""
        t, spec = self.table, self._tune
        if spec is None or row not in spec["rows"]:
            return None
        at = col.key if t.cols else None
        if (row, at) not in self._grid:
            by = spec["by"] or next(iter(t.metrics.values()))
            runs = [
                r for r, _ in self.members if canon(r.key(t.rows)) == row and (not t.cols or canon(r.key(t.cols)) == at)
            ]
            self._grid[(row, at)] = choose(runs, spec["rows"][row], by, lambda r: self.value(r, by, col), spec["mode"])
        return self._grid[(row, at)]

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
        """A run's number for a metric path, or why there is none (``no value``, ``non-finite``, ``never``,
        ``no target``)."""
        if path in DERIVED:
            return self._to_target(run, path, col)
        if (
            "@reach:" in path
        ):  # <metric>@reach:<acc>>=<x>: its value at the first round <acc> reached x (never: "never")
            name, goal = path.split("@reach:", 1)
            acc, x = goal.rsplit(">=", 1)
            first = next((r for r, v in run.series(acc) if r >= 1 and v >= float(x)), None)
            v = "never" if first is None else run.rounds().get(first, {}).get(name)
            if v == "never":
                return v
        elif "@" in path:  # <metric>@<round>: the value logged at that round; <metric>@mean: mean over rounds
            name, at = path.rsplit("@", 1)
            if at == "mean":
                pts = [x for _, x in run.series(name)]
                v = float(np.mean(pts)) if pts else None
            else:
                v = run.rounds().get(int(at), {}).get(name)
        else:
            s = run.summary
            v = s.get(path)
            if v is None and "." in path:  # <metric>.<stat> in metrics, or <key>.<field>
                name, stat = path.rsplit(".", 1)
                node = s.get("metrics", {}).get(name, s.get(name))
                v = node.get(stat) if isinstance(node, dict) else None
        if isinstance(v, float) and not math.isfinite(v):
            return "non-finite"  # (a diverged value: the claims count it as an outcome)
        v = _number(v)
        return "no value" if v is None else v

    def _to_target(self, run: RunRecord, path: str, col: Column):
        """FedKA Table 2: the first round whose ``target.metric`` ≥ the target row's value at round ``target.at``
        (``last`` = its last logged round) — same seed, same column; speedup = that target round / rounds."""
        found = self._target(run, col)
        if found is None:
            return "no target"
        (target_round, target), ref, metric = found
        if run is ref:  # the target row needs its target round by definition (the paper's "FedAvg 100 1x")
            return float(target_round) if path == "rounds_to_target" else 1.0
        reached = next((r for r, v in run.series(metric) if r >= 1 and v >= target), None)
        if reached is None:
            return "never"
        return float(reached) if path == "rounds_to_target" else float(target_round) / reached

    def never_bound(self, run: RunRecord, path: str, col: Column) -> float | None:
        """A run that never reached the target in its R rounds would reach it at round R + 1 at the earliest: its
        rounds-to-target is ≥ R + 1 and its speedup ≤ target round / (R + 1) — the censored value's bound on the side
        most favourable to the run (issue #52: counting it as speedup 0 made it the worst possible)."""
        found = self._target(run, col)
        pts = run.series(found[2]) if found else []
        if not pts:
            return None
        last = max(r for r, _ in pts)
        return float(last + 1) if path == "rounds_to_target" else float(found[0][0]) / (last + 1)

    def _target(self, run: RunRecord, col: Column):
        """((target round, target value), the target row's run, the metric) for ``run``'s seed and column, or None."""
        t = self.table
        metric, row, at = t.target.get("metric", "global/acc"), canon(t.target.get("row")), t.target.get("at", "last")
        ref = next(
            (
                r
                for r, _ in self.members
                if r.status == "complete"
                and canon(r.key(t.rows)) == row
                and r.seed == run.seed
                and (not t.cols or canon(r.key(t.cols)) == col.key)
            ),
            None,
        )
        pts = ref.series(metric) if ref else []
        if str(at) != "last":
            pts = [p for p in pts if p[0] == int(at)]
        return (pts[-1], ref, metric) if pts else None

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
        if p is None:  # the paper prints no number: "\" for rounds-to-target (never reached), "—" otherwise
            return "\\" if self.table.metrics[col.metric] in DERIVED else "—"
        return fmt(p, self.digits[col.key]) if _number(p) is not None else str(p)

    def diff(self, row: str, col: Column):
        p, m = _number(self.paper(row, col)), self.cells[(row, col.key)].mean
        return None if p is None or m is None or self.not_comparable(col) else m - p

    def not_comparable(self, col: Column) -> str | None:
        """Why this column's numbers are shown beside the paper's without a difference (None: they are compared)."""
        path = self.table.metrics[col.metric]
        if path in MACHINE_BOUND:
            return "seconds on this machine, not on the paper's hardware"
        if path in ROUND_BOUND or path.endswith(".best_round"):
            short = sorted({_reduced(r) for r, _ in self.members if r.status == "complete"} - {None})
            if short:
                return f"counts rounds; these runs ran {', '.join(short)}"
        return None

    def comparison_notes(self) -> list[str]:
        """One line per column with the paper's numbers but no Δ, and why."""
        return [
            f"{c.header}: no Δ — {why}" for c in self.columns if self.has_paper(c) and (why := self.not_comparable(c))
        ]

    # ---- what is not complete ---------------------------------------------------------------------------------
    def incomplete(self) -> list[RunRecord]:
        return [r for r, _ in self.members if r.status != "complete"]

    def seeds_note(self) -> str:
        ns = {self.cells[k].n_runs for k in self.cells if self.cells[k].n_runs}
        clean = not any(c.other for c in self.cells.values())
        done = [r for r, _ in self.members if r.status == "complete"]
        rounds = {r.config.get("rounds") for r in done}
        head = (
            f"{len(done)}/{len(self.members)} runs complete"
            + (f" ({rounds.pop()} rounds each)" if len(rounds) == 1 else "")
            + ". Mean ± std over seeds (population std)"
        )
        if clean and len(ns) == 1:
            return f"{head}; n = {ns.pop()} seed(s) per cell."
        return f"{head}; (k/n, ...) = k of the cell's n runs have a value, the others are listed."

    def warnings(self) -> list[str]:
        """Cells holding two runs of the same seed (runs that differ in a key the table does not show); target-row
        runs of rounds_to_target that touched their own target before the target round."""
        out = self._early_targets()
        for (row, col), cell in self.cells.items():
            twice = sorted(str(s) for s, n in Counter(cell.seeds).items() if n > 1)
            if twice:
                out.append(
                    f"cell ({self.row_names[row]}, {col}) has several runs with seed {', '.join(twice)}: "
                    "they differ in a key that is neither the table's rows nor its columns"
                )
        return out

    def _early_targets(self) -> list[str]:
        t = self.table
        if not t.target or "rounds_to_target" not in t.metrics.values():
            return []
        out, row = [], canon(t.target.get("row"))
        for run, _ in self.members:
            pts = (
                run.series(t.target.get("metric", "global/acc"))
                if run.status == "complete" and canon(run.key(t.rows)) == row
                else []
            )
            at = t.target.get("at", "last")
            own = [p for p in pts if str(at) == "last" or p[0] == int(at)]
            if own:
                first = next((r for r, v in pts if r >= 1 and v >= own[-1][1]), own[-1][0])
                if first < own[-1][0]:
                    out.append(
                        f"{self.row_names.get(row, row)} (seed {run.seed}) already reached its round-{own[-1][0]} "
                        f"value at round {first}; its row shows {own[-1][0]} by definition, as the paper's"
                    )
        return out

    def grid_notes(self) -> list[str]:
        """One line per tuned row and column: the grid, the value shown and every value's mean selection metric."""
        if self._tune is None:
            return []
        out = [str(self._tune["note"])] if self._tune.get("note") else []
        for row in self.row_keys:
            for c in self.columns if self.table.cols else self.columns[:1]:
                choice = self.grid(row, c)
                if choice and choice.scores:
                    scale = 100.0 if self.table.percent(c.metric) and "acc" in choice.by.lower() else 1.0
                    where = f" ({c.header})" if self.table.cols else ""
                    out.append(f"{self.row_names[row]}{where}: {choice.describe(scale)}")
        return out

    def header(self) -> list[str]:
        """The printed header (terminal, Markdown): a default table's Final says the evaluations it averaged (issue
        #53: ``Final (all 3 evals)`` on a run shorter than ``eval.final_window``, which is no end-of-training value);
        the CSV's ``column`` stays the column's name."""
        out = [self.row_title()]
        for c in self.columns:
            words = window_words(self.members, self.table.metrics[c.metric]) if self.table.paper == "runs" else None
            head = f"{c.header} ({words})" if words and c.metric == "Final" and not self.table.cols else c.header
            out += [head] + (["paper", "Δ"] if self.has_paper(c) else [])
        return out

    def row_title(self) -> str:
        key = self.table.rows
        return "Method" if key == "choice:algorithm" else key.split(":")[-1].split(".")[-1]

    def lines(self) -> list[list[str]]:
        out = []
        for row in self.row_keys:
            line = [self.row_names[row]]
            for c in self.columns:
                choice = self.grid(row, c)
                line.append(
                    self.cells[(row, c.key)].text(self.digits[c.key]) + (f" {choice.label()}" if choice else "")
                )
                if self.has_paper(c):
                    blank = self.not_comparable(c) and _number(self.paper(row, c)) is not None
                    line += [
                        self.paper_text(row, c),
                        "n/c" if blank else fmt(self.diff(row, c), self.digits[c.key], sign=True),
                    ]
            out.append(line)
        return out


def _reduced(run: RunRecord) -> str | None:
    """``20 of 100 rounds`` for a run below the paper's rounds (``scale`` < 1, or ``rounds`` set on the command line:
    ``8 rounds (set)``), else None."""
    rounds, scale = run.config.get("rounds"), _number(run.config.get("scale", 1.0))
    if "rounds" in run.overrides:
        return f"{rounds} rounds (set on the command line)"
    if scale is not None and scale != 1.0:
        return (
            f"{rounds} of {round(rounds / scale)} rounds (scale={scale:g})" if _number(rounds) else f"scale={scale:g}"
        )
    return None


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
