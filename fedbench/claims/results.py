"""A claim's runs and verdict: the runs of its experiment (read by fedbench/report's ``collect``), their cells over
seeds (fedbench/report's ``Report``), and the predicate evaluated seed-paired on them."""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from ..report.grid import GridChoice
from ..report.runs import RunRecord, _number, canon, collect, missing_run
from ..report.tables import DERIVED, Report, Table
from .predicates import NEEDS_DATA, NOT_COMPARABLE, NOT_RUN, Outcome, evaluate
from .records import load as load_records
from .spec import Claim, Experiment, PaperClaims

LAUNCHES = "claims_launches.jsonl"  # one line per `fedbench-claims run` launch of an experiment (time, commit, machine)


def sweep_dir(runs_root: Path, scale: str, paper: str) -> Path:
    """All runs of one paper at one scale share one multirun dir: a job two experiments have in common is run once."""
    return Path(runs_root) / scale / paper


def run_seconds(run: RunRecord) -> float:
    """Compute time of a run from its records: training rounds, evaluations, new-client fine-tuning (``time/*``);
    start-up and data loading are not in it."""
    return float(
        sum(
            v
            for row in run.rounds().values()
            for k, x in row.items()
            if k.startswith("time/") and (v := _number(x)) is not None
        )
    )


def launches(sweep: Path) -> list[dict]:
    try:
        lines = (sweep / LAUNCHES).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


class RunSet:
    """The runs of one paper at one scale, matched to each experiment's jobs (a job without a run dir is a
    ``missing`` record, so that a claim says how many of its runs exist)."""

    def __init__(
        self,
        pc: PaperClaims,
        scale: str,
        runs_root: Path,
        found: list[RunRecord] | None = None,
        records: Path | None = None,
    ):
        """``found``: the runs (e.g. committed records, fedbench/claims/records.py) instead of those under
        ``runs_root``; ``records``: a records file whose runs of this scale join those found (a run dir wins)."""
        self.pc, self.scale, self.sweep = pc, scale, sweep_dir(runs_root, scale, pc.paper)
        self.unrecorded: list[str] = []  # run dirs on this machine that the records file lacks (pages can't be rebuilt)
        if found is None:
            found = collect([self.sweep]) if self.sweep.is_dir() else []
        if records is not None:
            have = {frozenset(r.overrides.items()) for r in found if r.status != "missing"}
            recorded = load_records(records, scale)
            keys = {frozenset(r.overrides.items()) for r in recorded}
            self.unrecorded = sorted(
                str(r.path) for r in found if r.path is not None and frozenset(r.overrides.items()) not in keys
            )
            found = [*found, *(r for r in recorded if frozenset(r.overrides.items()) not in have)]
        self.by_overrides = {}
        for r in found:
            if r.status != "missing":
                self.by_overrides.setdefault(frozenset(r.overrides.items()), r)
        self._cache: dict = {}

    def runs(self, exp: Experiment) -> list[RunRecord]:
        if exp.name not in self._cache:
            jobs, neutral = exp.jobs()
            taken = {frozenset(j.items()) for j in jobs}
            out, bases = [], {}
            for i, job in enumerate(jobs):
                run = self.by_overrides.get(frozenset(job.items())) or self._same_config(exp, job, neutral, taken)
                if run is None:  # its config: the experiment composed with this job's swept values (an arm may
                    swept = tuple(f"{k}={job[k.lstrip('+~')]}" for k in exp.sweep)  # choose the algorithm)
                    if swept not in bases:
                        bases[swept] = _base(exp.compose(list(swept)))
                    run = missing_run(job, *bases[swept], (0, i))
                out.append(run)
            self._cache[exp.name] = out
        return self._cache[exp.name]

    def _same_config(self, exp: Experiment, job: dict, neutral: set, taken: set) -> RunRecord | None:
        """A run made by another command than the job's (e.g. a single run with ``hydra.run.dir``, or without an
        override that selects what the experiment's defaults select anyway) is the job's run if its resolved
        ``config.yaml`` has the job's values: every key it records equals the job's (results-neutral keys aside);
        keys it lacks were added to fedbench after it was made and are listed in ``run.lacking``. Only runs no job
        claims by its overrides, whose own overrides are a subset of the job's, and only one per job."""
        cands = [
            r
            for key, r in self.by_overrides.items()
            if key not in taken
            and r.job is None
            and all(job.get(k) == v for k, v in r.overrides.items() if k not in neutral)
        ]
        if not cands:
            return None
        want = _flat(OmegaConf.to_container(exp.compose_job(job), resolve=True), neutral)
        fits = []
        for r in cands:
            have = _flat(r.config, neutral)
            if have and all(k in want and want[k] == v for k, v in have.items()):
                fits.append((r, sorted(set(want) - set(have))))
        if len(fits) != 1:
            return None
        run, run.lacking = fits[0]
        run.job = dict(job)
        return run


def _flat(d: dict, neutral: set, prefix: str = "") -> dict:
    """Dotted keys of a resolved config but Hydra's node and the results-neutral keys (``neutral`` and the
    checkpoint fingerprint's)."""
    from ..checkpoint import NEUTRAL, NEUTRAL_HARDWARE

    out: dict = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if key in neutral or key in NEUTRAL or key in ("dataset.root", *(f"hardware.{k}" for k in NEUTRAL_HARDWARE)):
            continue
        if isinstance(v, dict) and v:
            out.update(_flat(v, neutral, key + "."))
        else:
            out[key] = v
    return out


def _base(cfg) -> tuple[dict, dict]:
    base = OmegaConf.to_container(cfg, resolve=False)
    base.pop("hydra", None)
    return base, dict(OmegaConf.to_container(cfg.hydra.runtime.choices))


@dataclass
class ClaimResult:
    claim: Claim
    scale: str
    outcome: Outcome
    experiment: Experiment | None = None
    data: dict = field(default_factory=dict)  # {row: {col: {seed: value}}}
    cols: list = field(default_factory=lambda: [None])
    status: Counter = field(default_factory=Counter)  # runs of the named rows without a value, by reason
    n_runs: int = 0  # runs of the named rows the experiment has (any status)
    n_complete: int = 0
    run_ids: dict = field(default_factory=dict)  # {their overrides: complete?} (runs shared between claims once)
    seconds: float = 0.0  # compute time of those runs
    labels: dict = field(default_factory=dict)  # row -> display name (the experiment's table labels)
    adopted: dict = field(default_factory=dict)  # run dir name -> keys it lacks (runs matched by their config)
    digits: int = 2
    unit: str = ""
    tuned: dict = field(
        default_factory=dict
    )  # {(row, col): GridChoice}: a tuned row's grid value, chosen on tune seeds
    pilot: Outcome | None = None  # not run yet: the rule on the seeds that have every run (>= 2), for its sds
    diagnostics: dict = field(default_factory=dict)  # {metric path: {row: [value per complete run]}} (claim.diagnose)
    series: dict = field(default_factory=dict)  # {row: {col: {seed: [(round, value)]}}}: the metric's per-round series
    hold: dict | None = None  # render.hold's cache: the chance to hold at the paper's effects ({} = none)

    @property
    def rows(self) -> list[str]:
        """The rows the claim names (predicate, then the paper's), in that order."""
        names = self.claim.predicate.names if self.claim.predicate.kind != "close" else []
        return list(dict.fromkeys([*names, *self.claim.paper]))

    def label(self, row: str) -> str:
        return self.labels.get(row, row)

    def cell(self, row: str, col) -> dict:
        return self.data.get(row, {}).get(col, {})


def labels(pc: PaperClaims, claim: Claim) -> dict:
    """Display names of the rows: the ``table.labels`` of the claim's experiment configs (at any scale), then of the
    paper's other experiments."""
    out: dict = {}
    others = [e for name, per in pc.experiments.items() if name != claim.experiment for e in per.values()]
    for exp in [*pc.experiments[claim.experiment].values(), *others]:
        for k, v in _table_labels(exp.experiment):
            out.setdefault(k, v)
    return out


@functools.lru_cache(maxsize=None)
def _table_labels(experiment: str) -> tuple:
    """An experiment config's ``table.labels`` as (canonical key, name) pairs (each file read once per process: a
    page asks for every claim at every scale)."""
    import yaml

    from ..confdir import CONF_DIR

    try:
        node = yaml.safe_load((CONF_DIR / "experiment" / f"{experiment}.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return ()
    return tuple((canon(k), str(v)) for k, v in ((node.get("table") or {}).get("labels") or {}).items())


def series_name(path: str) -> str | None:
    """The per-round metric behind a claim's metric path (``pers/acc.best`` -> ``pers/acc``, ``forgetting/missing@mean``
    -> ``forgetting/missing``), or None (a summary value: ``ccp_rounds``, a derived one: ``speedup``)."""
    if path in DERIVED or "@reach:" in path:
        return None
    if "@" in path:
        return path.rsplit("@", 1)[0]
    return path.rsplit(".", 1)[0] if "." in path else None


def evaluate_claim(pc: PaperClaims, claim: Claim, runset: RunSet) -> ClaimResult:
    scale = runset.scale
    exp = pc.experiment(claim, scale)
    if exp is None:
        verdict = NOT_COMPARABLE if claim.predicate.kind == "close" and scale != "paper" else NOT_RUN
        reason = f"no {scale}-scale setting of experiment '{claim.experiment}'"
        needs = [e for e in pc.experiments[claim.experiment].values() if e.needs]
        if needs and verdict == NOT_RUN:
            verdict, reason = NEEDS_DATA, needs_data(pc, needs[0])
        return ClaimResult(claim, scale, Outcome(verdict, reason), labels=labels(pc, claim))
    runs = [r for r in runset.runs(exp) if all(canon(r.key(k)) == v for k, v in claim.where.items())]
    spec = {
        "paper": pc.paper,
        "id": claim.id,
        "title": claim.claim,
        "rows": claim.by,
        "cols": claim.over,
        "metrics": {"value": claim.metric},
        "percent": claim.percent,
        **({"target": claim.target} if claim.target else {}),
    }
    rep = Report(Table(spec, [(r, spec) for r in runs]))
    res = ClaimResult(
        claim,
        scale,
        Outcome(NOT_RUN, ""),
        exp,
        cols=[c.key for c in rep.columns] if claim.over else [None],
        labels=labels(pc, claim),
    )
    res.digits = max(rep.digits.values(), default=2)
    res.unit = "%" if rep.table.percent("value") else ""
    named, columns = set(res.rows) or set(rep.row_keys), {c.key: c for c in rep.columns}
    scale_by = 100.0 if res.unit else 1.0
    for row, key in claim.tune.items():
        for col in res.cols:
            pool = [
                r for r in runs if canon(r.key(claim.by)) == row and (col is None or canon(r.key(claim.over)) == col)
            ]
            res.tuned[(row, col)] = tune(
                [r for r in pool if r.seed in exp.scale.tune_seeds],
                key,
                claim,
                lambda r, col=col: run_value(rep, r, columns.get(col) or rep.columns[0]),
                scale_by,
            )
    used = []
    for r in runs:
        row, col = canon(r.key(claim.by)), canon(r.key(claim.over)) if claim.over else None
        if row not in named or (claim.over and col not in columns):
            continue
        used.append(r)
        if (choice := res.tuned.get((row, col))) is not None and (
            r.seed not in exp.scale.seeds or choice.chosen is None or canon(r.key(choice.key)) != choice.chosen
        ):
            continue  # a tuned row: only its chosen grid value's runs at the judged seeds are judged
        v = run_value(rep, r, columns.get(col) or rep.columns[0])
        if isinstance(v, float):
            res.data.setdefault(row, {}).setdefault(col, {})[r.seed] = scale_by * v
            if (name := series_name(claim.metric)) and r.status == "complete":
                pts = [(rnd, scale_by * x) for rnd, x in r.series(name)]
                res.series.setdefault(row, {}).setdefault(col, {})[r.seed] = pts
        else:
            res.status[v] += 1
        if r.status == "diverged" or (isinstance(v, float) and not math.isfinite(v)):
            res.status["diverged"] += 1
    for path in claim.diagnose:  # the mechanism's own numbers (e.g. FedReMa's CCP length), per named method
        for r in used:
            col = canon(r.key(claim.over)) if claim.over else None
            v = rep.value(r, path, columns.get(col) or rep.columns[0]) if r.status == "complete" else None
            if isinstance(v, float) and math.isfinite(v):
                res.diagnostics.setdefault(path, {}).setdefault(canon(r.key(claim.by)), []).append(v)
    res.n_runs, res.n_complete = len(used), sum(r.status == "complete" for r in used)
    res.run_ids = {frozenset(r.overrides.items()): r.status == "complete" for r in used}
    res.seconds = sum(run_seconds(r) for r in used if r.status == "complete")
    res.adopted = {r.path.name: r.lacking for r in used if r.job is not None}
    paper = {row: {None: v} if not isinstance(v, dict) else v for row, v in claim.paper.items()}
    res.outcome = evaluate(
        claim.predicate,
        res.data,
        res.cols,
        exp.scale.seeds,
        claim.tolerance,
        claim.worst,
        paper=paper,
        paper_scale=scale == "paper",
    )
    if res.outcome.tests and (part := coverage(claim, res.cols)):
        res.outcome.reason += "; " + part
    machines = sorted({r.made_on() or "not recorded" for r in used if r.status == "complete"})
    if claim.metric.split(".")[0] in TIMES and len(machines) > 1 and res.outcome.verdict != NOT_RUN:
        res.outcome = Outcome(
            NOT_COMPARABLE,
            f"compute times from {len(machines)} machines ({'; '.join(machines)}): a time claim compares the runs "
            "of one machine",
        )
    if res.outcome.verdict == NOT_RUN and exp.needs and not res.data:
        res.outcome = Outcome(NEEDS_DATA, needs_data(pc, exp))
    elif res.outcome.verdict == NOT_RUN and res.n_runs:
        res.outcome.reason += _why(res.status)
        if not (claim.metric.split(".")[0] in TIMES and len(machines) > 1):
            res.pilot = pilot(claim, res, exp, paper, scale)
        if any(c.chosen is None for c in res.tuned.values()):
            res.outcome.reason += (
                "; the tuning runs (seeds " + ", ".join(map(str, exp.scale.tune_seeds)) + ") are not all in"
            )
    return res


TIMES = ("wall_time", "time_per_round")  # metrics measured in seconds: comparable only on one machine


def coverage(claim: Claim, cols: list) -> str:
    """What a verdict covers where the scale sweeps fewer values than the paper's numbers have (issue #52: ECL's "at
    every IF" judged at IF = 100 only on MNIST-LT): ``covers imbalance_factor = 100 of the paper's 10, 50, 100 — the
    verdict speaks for that value only``; "" where it covers them all."""
    paper_cols = list(dict.fromkeys(k for v in claim.paper.values() if isinstance(v, dict) for k in v))
    if not claim.over or not paper_cols or set(paper_cols) <= set(cols):
        return ""
    key = claim.over.split(":")[-1].split(".")[-1]
    return (
        f"covers {key} = {', '.join(map(str, cols))} of the paper's {', '.join(map(str, paper_cols))} — the verdict "
        f"speaks for {'that value' if len(cols) == 1 else 'these values'} only"
    )


def pilot(claim: Claim, res: ClaimResult, exp: Experiment, paper: dict, scale: str) -> Outcome | None:
    """Issue #31's pilot: while a claim's runs are not all in, the rule on the seeds that have all of them (at least
    2). Its tests' paired sds say what the full set of seeds could detect (:func:`pilot_mde`); never a verdict."""
    seeds = [
        s
        for s in exp.scale.seeds
        if evaluate(claim.predicate, res.data, res.cols, [s], claim.tolerance, claim.worst, paper=paper).verdict
        != NOT_RUN
    ]
    if len(seeds) < 2:
        return None
    out = evaluate(
        claim.predicate,
        res.data,
        res.cols,
        seeds,
        claim.tolerance,
        claim.worst,
        paper=paper,
        paper_scale=scale == "paper",
    )
    return out if out.tests else None


def pilot_mde(test, n: int, optimistic: bool = False) -> float | None:
    """The smallest gap ``n`` seeds would detect (80 % power) if σ were the pilot's 80 % upper confidence bound
    (predicates.sd_upper: a 2-seed sd understates σ 68 % of the time, issue #52) — or, ``optimistic``, its observed
    paired sd: in the two looks where ``n`` is their 5 seeds (predicates.seq_mde), else in one look at α = 0.05."""
    from .predicates import LOOKS, mde, sd_upper, seq_mde

    if test.n < 2 or not math.isfinite(test.sd) or not test.sd > 0:
        return None
    sd = test.sd if optimistic else sd_upper(test.sd, test.n)
    if n == LOOKS[-1]:
        return seq_mde(test.op, test.bound, test.paper, sd, test.tolerance)
    return mde(test.op, test.bound, test.paper, sd, n, tolerance=test.tolerance)


def tune(runs: list[RunRecord], key: str, claim: Claim, value, scale: float = 1.0) -> GridChoice:
    """A tuned row's grid value (FedKA's β): the one whose mean over the tuning seeds' runs is highest (a tuned metric
    is one where higher is better: accuracy, speedup), a diverged run counting as the claim's worst value; none unless
    every grid value has every tuning seed's run. The judged seeds never take part, so the choice does not bias their
    test. ``value(run)`` is :func:`run_value`; ``scale`` turns it into displayed units (×100 for a percentage)."""
    choice = GridChoice(key, claim.metric)
    by_value: dict = {}
    for r in runs:
        by_value.setdefault(canon(r.key(key)), []).append(value(r))
    if not runs or any(not isinstance(v, float) for vs in by_value.values() for v in vs):
        return choice
    for g, vs in sorted(by_value.items(), key=lambda kv: float(kv[0])):
        choice.scores[g] = float(np.mean([scale * v if math.isfinite(v) else claim.worst for v in vs]))
    choice.chosen = max(choice.scores, key=choice.scores.get)
    return choice


def needs_data(pc: PaperClaims, exp: Experiment) -> str:
    """Why a claim has no verdict here, and the command that gives it one on a machine with the data."""
    s = exp.scale.name
    return (
        f"{exp.needs} is not on this machine: on one that has it, `fedbench-claims run {pc.paper} --scale {s} "
        f"data_root=<its data folder>` then `fedbench-claims report {pc.paper} --scale {s}` (the runs: "
        f"`{exp.command()}`)"
    )


def run_value(rep: Report, run: RunRecord, col) -> float | str:
    """A run's value in a claim's table: its metric (a float); NaN when it diverged (status ``diverged``, or a
    non-finite metric) — an outcome the rule counts as the claim's worst value; a speed claim's run that never
    reached the target counts as its censored value's bound (Report.never_bound: speedup ≤ T/(R + 1)); or why it has
    none (its status: failed, running, preempted, missing; or ``no value``)."""
    if run.status == "diverged":
        return math.nan
    if run.status != "complete":
        return run.status
    path = rep.table.metrics["value"]
    v = rep.value(run, path, col)
    if v == "never":
        bound = rep.never_bound(run, path, col)
        return math.nan if bound is None else bound
    return math.nan if v == "non-finite" else v


def _why(status: Counter) -> str:
    return (" (" + ", ".join(f"{n} {k}" for k, n in status.items()) + ")") if status else ""


__all__ = [
    "LAUNCHES",
    "RunSet",
    "ClaimResult",
    "evaluate_claim",
    "launches",
    "needs_data",
    "run_seconds",
    "run_value",
    "sweep_dir",
    "tune",
]
