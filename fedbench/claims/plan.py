"""``fedbench-claims plan``: the runs still to make at a scale (issue #51 item 2), what they cost on a GPU, and the
order in which they buy verdicts fastest.

Per paper and claim: the runs the claim reads (results.py's ``ClaimResult.run_ids``, the runs its verdict uses) that
the committed records (docs/results/<paper>/runs.jsonl) do not hold as an outcome (runner.py's ``OUTCOMES``), a run
shared by several claims counted once, under the first claim in the plan's order. Seeds follow the group-sequential
rule (predicates.py's ``LOOKS``): the scale's first ``LOOKS[0]`` seeds (and a tuned claim's tune seeds) are planned
for sure; the others only if the first look is not decisive, and not at all once the records give a claim a verdict
at look 1 (``Outcome.look == 1``, read through results.py as the pages read it). A tuned row (FedKA's β) needs, at
the judged seeds, only its grid value chosen on the tune seeds (:func:`tuned_runs`).

Order: each paper's headline comparison first (``HEADLINE``), then the claims on a single setting, then the sweeps
(a swept setting: α, participation, epochs, clients, IF, ...); within a tier, the claim whose runs not yet planned
cost the fewest GPU-minutes first (one verdict each: the most verdict per GPU-minute); within a claim, seed by seed.

Costs (fedbench/report/runtime.py, conf/runtimes.yaml): a run's GPU seconds are rounds x the GPU seconds per round of
its setting — measured (``gpu`` figures: device, date, source) for the same paper, scale, algorithm and setting, else
scaled from the nearest measured figure (:func:`gpu_cost` says the rule, and every run says which it got). Its CPU
estimate is the stored estimate of its experiment (``claims``: the mean run of the multirun, as ``fedbench-claims run
--estimate`` gives it) and it is CPU-sized when that estimate x the stated slowdown fits the stated hours.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..report.runs import canon
from ..report.runtime import hours
from ..report.stored_runtimes import claims_estimates, gpu_figures, gpu_scaled, plan_settings
from .predicates import LOOKS, NEEDS_DATA, NOT_RUN, Outcome
from .results import RunSet, evaluate_claim
from .runner import OUTCOMES
from .spec import ClaimsError, PaperClaims

# Issue #51: "each paper's headline comparison first (FedKA Table 1 FedKA vs FedAvg; FedReMa Table 1 CIFAR-10 vs its
# strongest baseline; ECL Table 1; CAFeMe Table 1; FedCOM Table 1)" — the claims that make that comparison.
HEADLINE = {
    "fedka": ("beats_fedavg",),
    "fedrema": ("beats_strongest_baseline",),
    "ecl": ("beats_fedavg_ft", "beats_strongest_baseline"),
    "cafeme": ("beats_fedavg", "beats_perfedavg", "beats_strongest_baseline"),
    "fedcom": ("beats_fedavg", "beats_strongest_baselines", "converges_faster"),
}
TIERS = ("headline", "setting", "sweep")
SAME = 2e-3  # two settings cost the same when their stored CPU estimates (4 significant digits) agree this closely
GPU_REPORT = "docs/results/gpu/2026-11-26-h200/report.txt"  # scripts/gpu_check.py on an H200, section 4
# report.txt §4 line label -> (paper, claims experiment, algorithm) of the setting it measured (fp32: hardware.tf32
# is false by default, so the claims' runs are fp32)
REPORT_FIGURES = {
    "FedKA Table 1, CIFAR-10, t-CNN [fedavg] fp32": ("fedka", "tuned", "fedavg"),
    "FedKA Table 1, CIFAR-10, t-CNN [fedka_0.01] fp32": ("fedka", "tuned", "fedka"),
    "FedReMa Table 1, CIFAR-10, AlexNet [fedavg] fp32": ("fedrema", "table1", "fedavg"),
    "FedReMa Table 1, CIFAR-10, AlexNet [fedrema] fp32": ("fedrema", "table1", "fedrema"),
}
# ECL's line ("... [ecl] fp32: 37.01 s training + 4.19 s evaluation per round (warm-up round 13.2 s)") timed round 2 of
# a 2-round run, which held ECL's one-off phase II and personalized evaluation (docs/gpu.md): not a phase-I round. Its
# warm-up round (round 1: a phase-I round, its evaluation and cuDNN's algorithm search) stands for a round instead, an
# upper bound of one.
WARMUP_FIGURES = {"ECL Table 1, CIFAR-10-LT, ResNet-32 [ecl] fp32": ("ecl", "table1", "ecl")}


def conf_dir() -> Path:
    from ..confdir import CONF_DIR

    return CONF_DIR


# ---- the measured GPU figures ---------------------------------------------------------------------------------------


def report_figures(text: str, source: str = GPU_REPORT) -> dict:
    """The figures of gpu_check's section 4 (``<label>: 2.95 s training + 0.05 s evaluation per round (warm-up round
    4.6 s)``) named in ``REPORT_FIGURES`` (the timed round) or ``WARMUP_FIGURES`` (the warm-up round, as training),
    with the device and date of the report's header."""
    device = re.search(r"^cuda: (.+?), [\d.]+ GiB", text, re.M)
    date = re.search(r"gpu_check (\d{4}-\d\d-\d\d)T", text)
    line = r"^(.+?): ([\d.]+) s training \+ ([\d.]+) s evaluation per round(?: \(warm-up round ([\d.]+) s\))?"
    out = {}
    for m in re.finditer(line, text, re.M):
        label = m.group(1)
        if label in REPORT_FIGURES:
            (paper, experiment, algorithm), train, evaluation, how = REPORT_FIGURES[label], m[2], m[3], ""
        elif label in WARMUP_FIGURES and m[4]:
            (paper, experiment, algorithm), train, evaluation = WARMUP_FIGURES[label], m[4], 0.0
            how = (
                ", its warm-up round (with its evaluation and cuDNN's algorithm search: an upper bound of a round; "
                "the timed round held phase II)"
            )
        else:
            continue
        out[f"{paper}/paper/{experiment}/{algorithm}"] = {
            "paper": paper,
            "scale": "paper",
            "experiment": experiment,
            "algorithm": algorithm,
            "train_s": float(train),
            "eval_s": float(evaluation),
            "device": device.group(1) if device else None,
            "date": date.group(1) if date else None,
            "source": f"{source} section 4: {label}{how}",
        }
    return out


def algorithm_of(run) -> str:
    """The algorithm a run trains: its ``algorithm`` config group's option (FedKA's arms choose it), else its name."""
    return str(run.choices.get("algorithm") or (run.config.get("algorithm") or {}).get("name"))


def record_figures(pc: PaperClaims, scale: str, records: Path, device: str) -> dict:
    """Per claims experiment and algorithm, the mean GPU seconds per round (``time/round``; ``time/eval`` summed over
    the run's evaluations / its rounds) of the complete runs ``records`` holds at ``scale`` made on ``device``."""
    rs = RunSet(pc, scale, Path("."), found=[], records=records)
    started = {}
    for line in Path(records).read_text().splitlines() if Path(records).exists() else []:
        rec = json.loads(line)
        started[frozenset(rec["overrides"].items())] = (rec.get("started") or "")[:10]
    out, seen = {}, set()
    for exp in pc.needed(scale):
        per: dict = {}
        for r in rs.runs(exp):
            key = frozenset(r.overrides.items())
            if r.status != "complete" or device not in (r.made_on() or "") or key in seen:
                continue
            seen.add(key)
            rows = r.rounds().values()
            train = [row["time/round"] for row in rows if "time/round" in row]
            evals = sum(row.get("time/eval", 0.0) for row in rows)
            if train:
                per.setdefault(algorithm_of(r), []).append((sum(train) / len(train), evals / len(train), r))
        for alg, got in sorted(per.items()):
            dates = sorted({started.get(frozenset(r.overrides.items()), "") for *_, r in got} - {""})
            out[f"{pc.paper}/{scale}/{exp.name}/{alg}"] = {
                "paper": pc.paper,
                "scale": scale,
                "experiment": exp.name,
                "algorithm": alg,
                "train_s": round(sum(t for t, _, _ in got) / len(got), 4),
                "eval_s": round(sum(e for _, e, _ in got) / len(got), 4),
                "device": device,
                "date": ", ".join(dates) or None,
                "source": f"docs/results/{pc.paper}/runs.jsonl: {len(got)} complete {scale}-scale {exp.name} run(s)",
            }
    return out


# ---- one paper's plan ---------------------------------------------------------------------------------------------


@dataclass
class Planned:
    """One run still to make."""

    key: frozenset  # its overrides (a run shared by claims: one key)
    seed: int
    experiment: str
    algorithm: str
    look: int  # 1: planned for sure; 2: only if the claim's first look is not decisive
    rounds: int | None
    gpu_s: float | None  # GPU seconds (None: no CPU estimate of its experiment to scale from)
    cpu_s: float | None  # the CPU estimator's seconds on one thread (a lower bound)
    cost: str  # where gpu_s comes from: "measured [fig]" or the scaling rule and its figures
    cpu_sized: bool = False


@dataclass
class ClaimPlan:
    paper: str
    claim: str
    experiment: str
    tier: str
    runs: list = field(default_factory=list)  # Planned, seed by seed (its own: not planned under an earlier claim)
    shared: int = 0  # runs it needs that an earlier claim plans
    outcome: Outcome | None = None
    needs: str = ""  # data this machine lacks: not planned
    hold: tuple | None = None  # (chance to hold at the paper's effects, the scale it was simulated at): hold_chances

    def gpu(self, look: int | None = None) -> float:
        return sum(r.gpu_s or 0.0 for r in self.runs if look is None or r.look == look)

    def count(self, look: int | None = None) -> int:
        return sum(look is None or r.look == look for r in self.runs)


def tier(pc: PaperClaims, claim, scale: str) -> str:
    """``headline``, ``sweep`` (its experiment sweeps a setting: a key other than the method's) or ``setting``."""
    if claim.id in HEADLINE.get(pc.paper, ()):
        return "headline"
    exp = pc.experiment(claim, scale)
    method = [k for k in (exp.sweep if exp else {}) if k == "algorithm" or "/arm@" in k]
    return "sweep" if exp is not None and len(exp.sweep) > len(method) else "setting"


def first_look(exp) -> set:
    """The seeds of the first look: the scale's first ``LOOKS[0]`` seeds, and a tuned experiment's tune seeds (the
    grid value is chosen on them before any judged seed counts)."""
    return set(exp.scale.seeds[: LOOKS[0]]) | (set(exp.scale.tune_seeds) if exp.tuned else set())


def decided_at_first_look(outcome: Outcome | None) -> bool:
    """A verdict the records already reached at the first look: the claim's later seeds are not planned."""
    return outcome is not None and outcome.look == 1 and outcome.verdict not in (NOT_RUN, NEEDS_DATA)


def plan_paper(
    pc: PaperClaims,
    scale: str,
    records: Path | None,
    conf: Path | None = None,
    runs_root: Path | None = None,
    outcomes: dict | None = None,
    chances: dict | None = None,
) -> list[ClaimPlan]:
    """The plan of one paper at ``scale``, in its order. ``records``: the committed records (runs with an outcome
    there are not planned); ``runs_root``: also the run dirs under it (default: the records only, so the plan is the
    repository's); ``outcomes``: {claim id: Outcome} instead of the verdicts the records give (tests); ``chances``:
    {claim id: (chance to hold, scale)} instead of the page CSV's (:func:`hold_chances`; a page being rendered passes
    its own, so that it never depends on its previous CSV)."""
    if scale not in pc.scales:
        raise ClaimsError(f"--scale {scale!r} — {pc.paper} has the scales {', '.join(pc.scales)}")
    conf = Path(conf) if conf else conf_dir()
    runset = RunSet(pc, scale, runs_root or Path("."), found=None if runs_root else [], records=records)
    figures, settings, est_all = gpu_figures(conf), plan_settings(conf), claims_estimates(conf)
    needed = {e.name for e in pc.needed(scale)}
    chances = hold_chances(pc.paper, records) if chances is None else chances
    plans = []
    for claim in pc.claims:
        exp = pc.experiment(claim, scale)
        if exp is None or exp.name not in needed:
            continue
        cp = ClaimPlan(pc.paper, claim.id, exp.name, tier(pc, claim, scale))
        if exp.needs:
            cp.needs = exp.needs
            plans.append(cp)
            continue
        res = evaluate_claim(pc, claim, runset)
        cp.outcome = (outcomes or {}).get(claim.id, res.outcome)
        later = not decided_at_first_look(cp.outcome)
        first = first_look(exp)
        by_key = {frozenset(r.overrides.items()): r for r in runset.runs(exp)}
        tuned = tuned_runs(claim, exp, [by_key[k] for k in res.run_ids], res.tuned)
        tune_first = {s: i for i, s in enumerate([*exp.scale.tune_seeds, *exp.scale.seeds])}
        for key in res.run_ids:
            r = by_key[key]
            if r.status in OUTCOMES or (r.seed not in first and not later) or tuned.get(key) is False:
                continue
            alg = algorithm_of(r)
            gpu_s, cpu_s, rounds, cost = run_cost(pc.paper, scale, exp.name, alg, figures, est_all)
            cost += tuned.get(key) or ""
            cp.runs.append(
                Planned(key, int(r.seed), exp.name, alg, 1 if r.seed in first else 2, rounds, gpu_s, cpu_s, cost)
            )
            cp.runs[-1].cpu_sized = cpu_sized(cpu_s, settings)
        cp.runs.sort(key=lambda p: (p.look, tune_first.get(p.seed, p.seed)))
        cp.hold = chances.get(claim.id)
        plans.append(cp)
    return order_plans(plans)


HOLD_FROM = ("paper", "medium", "cpu")  # the scales whose chance to hold stands for the paper scale's, first first
UNLIKELY = 0.5  # a claim whose chance to hold at the paper's effects is below this waits behind the others of its tier


def hold_chances(paper: str, records: Path | None) -> dict:
    """{claim id: (chance, scale)}: each claim's chance to hold if the paper's effects are true (issue #52; the
    page's CSV column ``hold_chance``, render.hold) at the first scale of :data:`HOLD_FROM` that has one — the
    covariance a paper-scale run will most likely see. Read from ``<paper>.csv`` beside the records' directory."""
    import csv

    path = Path(records).parent.parent / f"{paper}.csv" if records else None
    if path is None or not path.exists():
        return {}
    found: dict = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if row.get("hold_chance"):
                found.setdefault(row["claim"], {})[row["scale"]] = float(row["hold_chance"])
    return first_chance(found)


def first_chance(found: dict) -> dict:
    """{claim: {scale: chance}} -> {claim: (chance, scale)} at the first scale of :data:`HOLD_FROM` that has one."""
    return {c: next((v[s], s) for s in HOLD_FROM if s in v) for c, v in found.items() if set(v) & set(HOLD_FROM)}


def tuned_runs(claim, exp, runs: list, choices: dict) -> dict:
    """A tuned row (FedKA's β) is judged at its grid value chosen on the tune seeds (results.tune), so at the judged
    seeds only that value's runs are needed: {run key: False} for the others. While the tune seeds' runs are not all
    in, the choice is not known: the grid's first value stands for it ({run key: " (stands for the <key> the tune
    seeds choose)"}; every grid value costs the same here), the others are False; a kept run's value says why."""
    out: dict = {}
    for r in runs:
        row = canon(r.key(claim.by))
        col = canon(r.key(claim.over)) if claim.over else None
        choice = choices.get((row, col))
        if choice is None or r.seed not in exp.scale.seeds:
            continue
        key = frozenset(r.overrides.items())
        if choice.chosen is not None:
            keep = canon(r.key(choice.key)) == choice.chosen
            out[key] = f" ({choice.short} = {choice.chosen}, chosen on the tune seeds)" if keep else False
            continue
        same = [x for x in runs if x.seed == r.seed and canon(x.key(claim.by)) == row]
        same = [x for x in same if not claim.over or canon(x.key(claim.over)) == col]
        grid = sorted({canon(x.key(choice.key)) for x in same} - {"None"}, key=float)
        first = bool(grid) and canon(r.key(choice.key)) == grid[0]
        out[key] = f" (stands for the {choice.short} the tune seeds choose)" if first else False
    return out


def order_plans(plans: list[ClaimPlan]) -> list[ClaimPlan]:
    """Headline first (in the claims file's order), then the single-setting claims, then the sweeps; within those two
    tiers the claims that could hold if the paper is right first (a chance to hold under :data:`UNLIKELY` at another
    scale's covariance waits: its GPU time buys little — issue #52), then the claim whose runs not yet planned cost the
    fewest GPU seconds (one verdict per claim: the most verdict per GPU-minute; greedy, a shared run counted once:
    under the first claim that plans it), a claim with a run of unknown cost after those without; ties in the claims
    file's order."""
    out, planned = [], set()
    for t in TIERS:
        left = [p for p in plans if p.tier == t]
        while left:

            def marginal(p):
                runs = [r for r in p.runs if r.key not in planned]
                if t == "headline":
                    return (False, False, 0.0)
                unlikely = p.hold is not None and p.hold[0] < UNLIKELY
                return (unlikely, any(r.gpu_s is None for r in runs), sum(r.gpu_s or 0.0 for r in runs))

            best = min(left, key=lambda p: (marginal(p), left.index(p)))
            left.remove(best)
            own = [r for r in best.runs if r.key not in planned]
            best.shared, best.runs = len(best.runs) - len(own), own
            planned |= {r.key for r in own}
            out.append(best)
    return out


def cpu_sized(cpu_s: float | None, settings: dict) -> bool:
    """CPU-sized: the CPU estimate (a lower bound) x ``slowdown`` (what measured runs took over their estimate on the
    loaded 2-core VM) is at most ``cpu_sized_hours`` on one thread (conf/runtimes.yaml ``plan``)."""
    if cpu_s is None:
        return False
    return cpu_s * float(settings.get("slowdown", 4)) <= 3600 * float(settings.get("cpu_sized_hours", 6))


def _per_round(est: dict) -> float:
    """The CPU seconds per round of an experiment's mean run (its multirun's estimate / runs / rounds)."""
    return float(est["seconds"]) / max(int(est["runs"]), 1) / max(int(est["rounds"]), 1)


def _family(alg: str) -> str:
    return alg.split("_")[0]


def gpu_cost(paper: str, scale: str, experiment: str, alg: str, figures: dict, est_all: dict) -> tuple:
    """(GPU seconds per round, how) of a run, from the measured figures. In order:

    1. measured: a figure of the same paper, scale and algorithm whose setting costs the same on the CPU estimator
       (the same experiment, or one whose estimate per round is equal);
    2. the same paper and scale, the algorithm's figure (or its family's: ``fedka_m`` -> ``fedka``, ``fedavg_ft`` ->
       ``fedavg``), else FedAvg's, else the first — x the ratio of the two settings' CPU estimates per round, and x the
       algorithm's cost relative to that figure's algorithm where GPU records of another scale of the paper measured
       both on one experiment (else costed as the figure's algorithm, said so);
    3. no figure of the paper at this scale: the FedAvg figure (any paper, any scale: the CPU estimator counts
       FedAvg-equivalent work, so its ratio transfers best between FedAvg settings; any figure when none is FedAvg's)
       whose setting's CPU estimate per round is nearest (log ratio), x the ratio of the CPU estimates. Rough: a GPU
       round of a small model is bound by per-step overheads, not by FLOPs.
    """
    mine = est_all.get(paper, {}).get(scale, {}).get(experiment)
    if mine is None:
        return None, f"no CPU estimate of {paper} {scale} {experiment} (`fedbench-claims plan --measure`)"
    c = _per_round(mine)

    def cpu_of(f):
        e = est_all.get(f["paper"], {}).get(f["scale"], {}).get(f["experiment"])
        return _per_round(e) if e else None

    here = {k: f for k, f in figures.items() if f["paper"] == paper and f["scale"] == scale and cpu_of(f)}
    same = {}
    for want in (alg, _family(alg), "fedavg"):
        same = {k: f for k, f in here.items() if f["algorithm"] == want}
        if same:
            break
    same = same or dict(list(here.items())[:1])
    if same:
        name, fig = next(iter(same.items()))
        ratio = c / cpu_of(fig)
        if fig["algorithm"] == alg and math.isclose(ratio, 1.0, rel_tol=SAME):
            return float(fig["train_s"]) + float(fig["eval_s"]), f"measured [{name}]"
        factor, why = algorithm_factor(paper, scale, alg, fig["algorithm"], figures)
        how = f"[{name}]" + ("" if math.isclose(ratio, 1.0, rel_tol=SAME) else f" x {ratio:.3g} (CPU est.)") + why
        return gpu_scaled(fig, c, cpu_of(fig)) * factor, how
    others = [kv for kv in figures.items() if cpu_of(kv[1])]
    others = [kv for kv in others if kv[1]["algorithm"] == "fedavg"] or others  # the estimator counts FedAvg's work
    if not others:
        return None, f"no GPU figure with a CPU estimate to scale {paper} {scale} from"
    name, fig = min(others, key=lambda kv: (abs(math.log(c / cpu_of(kv[1]))), kv[0]))
    return gpu_scaled(fig, c, cpu_of(fig)), f"[{name}] x {c / cpu_of(fig):.3g} (nearest FedAvg setting by CPU est.)"


def algorithm_factor(paper: str, scale: str, alg: str, measured: str, figures: dict) -> tuple[float, str]:
    """How much more a round of ``alg`` costs than one of ``measured`` on the GPU, from figures of another scale of
    the same paper that measured both on one experiment (1 when none did, said so)."""
    if alg == measured:
        return 1.0, ""
    for own, f in figures.items():
        if f["paper"] != paper or f["scale"] == scale or f["algorithm"] != alg:
            continue
        for name, g in figures.items():
            same = (g["paper"], g["scale"], g["experiment"]) == (paper, f["scale"], f["experiment"])
            if same and g["algorithm"] == measured:
                x = (f["train_s"] + f["eval_s"]) / (g["train_s"] + g["eval_s"])
                return x, f" x {x:.3g} ([{own}] / [{name}])"
    return 1.0, f" ({alg} as {measured})"


def run_cost(paper: str, scale: str, experiment: str, alg: str, figures: dict, est_all: dict):
    """(GPU seconds, CPU seconds, rounds, how) of one run (:func:`gpu_cost` x rounds; the CPU estimate of its
    experiment's mean run)."""
    est = est_all.get(paper, {}).get(scale, {}).get(experiment)
    if est is None:
        return None, None, None, f"no CPU estimate of {paper} {scale} {experiment} (`fedbench-claims plan --measure`)"
    per_round, how = gpu_cost(paper, scale, experiment, alg, figures, est_all)
    rounds = int(est["rounds"])
    cpu_s = float(est["seconds"]) / max(int(est["runs"]), 1)
    return (None if per_round is None else per_round * rounds), cpu_s, rounds, how


# ---- measuring and writing (conf/runtimes.yaml) -------------------------------------------------------------------


def measure(papers: list[str], scale: str, data_root: str | None, log=print) -> Path:
    """Store the CPU estimate of every experiment the claims need at ``scale`` (runtime.estimate_overrides on its
    multirun, per-sample costs from conf/runtimes.yaml so that it is the same on every machine) and the GPU figures
    (gpu_check's report and the GPU runs in the records)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ..errors import ConfigError
    from ..hydra_cache import install
    from ..report.runtime import estimate_overrides
    from ..report.stored_runtimes import stored_costs, update
    from .records import committed_records
    from .spec import load

    conf = conf_dir()
    est, costs = claims_estimates(conf), stored_costs(conf)
    extra = [f"data_root={data_root}"] if data_root else []
    install()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            figures = gpu_figures_now(committed_records)
            todo = [(paper, scale, exp.name) for paper in papers for exp in load(paper).needed(scale)]
            todo += [  # the settings of the GPU figures, so that a run can be scaled from any of them
                (f["paper"], f["scale"], f["experiment"])
                for f in figures.values()
                if f["scale"] != scale and f["experiment"] not in est.get(f["paper"], {}).get(f["scale"], {})
            ]
            for paper, at, name in dict.fromkeys(todo):
                pc = load(paper)
                exp = pc.experiments[name][at]
                given = [a for a in [*exp.args(), *extra] if "=" in a and not a.startswith(("hydra.", "logger"))]
                try:
                    got = estimate_overrides(
                        given, lambda o: compose("config", overrides=o, return_hydra_config=True), costs
                    )
                except ConfigError as e:  # its data is not here
                    log(f"{pc.paper} {at} {name}: not estimated — {str(e)[:160]}")
                    continue
                got.pop("not_measured", None)
                est.setdefault(pc.paper, {}).setdefault(at, {})[name] = got
                log(f"{pc.paper} {at} {name}: {got['runs']} runs, {hours(got['seconds'])} on one CPU thread")
    finally:
        GlobalHydra.instance().clear()
    update(conf, "claims", est)
    return update(conf, "gpu", {"figures": figures})


def gpu_figures_now(committed_records, device: str = "NVIDIA H200") -> dict:
    """The GPU figures as the repository gives them today: gpu_check's report, and every claims experiment's GPU runs
    made on ``device`` (the kind of machine lent now) in the committed records."""
    from .spec import load, papers

    root = conf_dir().parent
    out = report_figures((root / GPU_REPORT).read_text())
    for paper in papers():
        path = committed_records(paper)
        lines = path.read_text().splitlines() if path.exists() else []
        scales = {rec["scale"] for rec in map(json.loads, lines) if device in (rec.get("machine") or "")}
        for scale in sorted(scales):
            out.update(record_figures(load(paper), scale, path, device))
    return out


# ---- output -------------------------------------------------------------------------------------------------------


def _gpu_h(seconds: float) -> str:
    """GPU-hours, two significant digits (``0.024``, ``7.9``, ``713``)."""
    h = seconds / 3600
    return f"{h:.2g}" if h < 10 else f"{h:,.0f}"


def totals(plans: list[ClaimPlan]) -> dict:
    runs = [r for p in plans for r in p.runs]
    return {
        "runs1": sum(r.look == 1 for r in runs),
        "runs2": sum(r.look == 2 for r in runs),
        "gpu1": sum(r.gpu_s or 0 for r in runs if r.look == 1),
        "gpu2": sum(r.gpu_s or 0 for r in runs if r.look == 2),
        "unknown": sum(r.gpu_s is None for r in runs),
        "cpu_sized": sum(r.cpu_sized for r in runs),
        "needs": sum(bool(p.needs) for p in plans),
    }


def total_line(t: dict, scale: str) -> str:
    """``paper scale: N runs left, ~H GPU-hours at today's measured speed`` (the first look for sure; all seeds if
    no first look is decisive)."""
    return (
        f"{scale} scale: {t['runs1']} runs left for the first look, ~{_gpu_h(t['gpu1'])} GPU-hours at today's measured "
        f"speed; {t['runs1'] + t['runs2']} runs, ~{_gpu_h(t['gpu1'] + t['gpu2'])} GPU-hours if no first look is "
        "decisive"
        + (f" ({t['unknown']} runs without a cost)" if t["unknown"] else "")
        + (f"; {t['cpu_sized']} of them CPU-sized" if t["cpu_sized"] else "")
    )


def _minutes(seconds: float) -> str:
    """GPU-minutes, two significant digits below 100 (``0.067``, ``4.3``, ``1,301``): a FedCOM claim's minutes are
    not 0."""
    m = seconds / 60
    return f"{m:.2g}" if m < 100 else f"{m:,.0f}"


def claim_rows(plans: list[ClaimPlan]) -> list[list[str]]:
    rows = []
    for i, p in enumerate(plans, 1):
        costs = sorted({r.cost for r in p.runs})
        cpu = sorted({r.cpu_s for r in p.runs if r.cpu_s is not None})
        rows.append(
            [
                str(i),
                p.claim,
                p.experiment,
                p.tier,
                "needs " + p.needs
                if p.needs
                else f"{p.count(1)} + {p.count(2)}" + (f" ({p.shared} shared)" if p.shared else ""),
                f"{_minutes(p.gpu(1))} + {_minutes(p.gpu(2))}" if p.runs else "",
                "; ".join(costs),
                ", ".join(hours(c) for c in cpu),
                ("yes" if all(r.cpu_sized for r in p.runs) else "no") if p.runs else "",
                "" if p.hold is None else f"{100 * p.hold[0]:.0f} % ({p.hold[1]})",
            ]
        )
    return rows


HEAD = [
    "#",
    "claim",
    "experiment",
    "tier",
    "runs: look 1 + if not decisive",
    "GPU-min: look 1 + if not decisive",
    "GPU cost from",
    "CPU per run (1 thread)",
    "CPU-sized",
    "can hold (scale)",
]


def figure_lines(plans: list[ClaimPlan], conf: Path | None = None) -> list[str]:
    """The figures the costs name, with device, date and source."""
    figures = gpu_figures(Path(conf) if conf else conf_dir())
    used = sorted({n for p in plans for r in p.runs for n in re.findall(r"\[([^\]]+)\]", r.cost)})
    return [
        f"[{n}]: {figures[n]['train_s']:g} s training + {figures[n]['eval_s']:g} s evaluation per round, "
        f"{figures[n]['device']}, {figures[n]['date']} — {figures[n]['source']}"
        for n in used
        if n in figures
    ]


def markdown(plans_by_paper: dict, scale: str, conf: Path | None = None) -> str:
    """The README's block: per paper its runs and GPU-hours, the overall total line, and the figures' sources."""
    settings = plan_settings(Path(conf) if conf else conf_dir())
    md = [
        "| paper | runs left: look 1 + if not decisive | GPU time: look 1 + if not decisive | first in line | "
        "CPU-sized runs | claims needing data |",
        "|---|---:|---:|---|---:|---:|",
    ]
    every = []
    for paper, plans in plans_by_paper.items():
        t = totals(plans)
        every += plans
        first = next((f"{p.claim} ({p.experiment})" for p in plans if p.runs), "—")
        md.append(
            f"| {paper} | {t['runs1']} + {t['runs2']} | {hours(t['gpu1'])} + {hours(t['gpu2'])} | {first} | "
            f"{t['cpu_sized']} | {t['needs']} |"
        )
    md += ["", total_line(totals(every), scale) + ".", ""]
    md.append(
        f"CPU-sized: the CPU estimate of a run (one thread, a lower bound) x {settings.get('slowdown', 4)} is at most "
        f"{settings.get('cpu_sized_hours', 6)} h. GPU figures:"
    )
    md += [""] + [f"- {line}" for line in figure_lines(every, conf)]
    return "\n".join(md) + "\n"


def page_note(paper: str, scale: str = "paper", records: Path | None = None, chances: dict | None = None) -> str:
    """A paper's plan note (Markdown) for its results page: the total line and its claims in the plan's order."""
    from .records import committed_records
    from .spec import load

    plans = plan_paper(load(paper), scale, records or committed_records(paper), chances=chances)
    md = [total_line(totals(plans), scale) + " (`fedbench-claims plan " + paper + f" --scale {scale}`):", ""]
    md += ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    md += ["| " + " | ".join(row) + " |" for row in claim_rows(plans)]
    md += [""] + [f"- {line}" for line in figure_lines(plans)]
    return "\n".join(md) + "\n"


def print_plan(plans_by_paper: dict, scale: str, console=None, runs: bool = False) -> None:
    """The plan as rich tables: per paper its claims in order (with ``runs``: every run, seed by seed)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    every = []
    for paper, plans in plans_by_paper.items():
        every += plans
        table = Table(title=escape(f"{paper}: {total_line(totals(plans), scale)}"), title_justify="left")
        for h in HEAD:
            table.add_column(h)
        for row in claim_rows(plans):
            table.add_row(*map(escape, row))
        console.print(table)
        if runs:
            for i, p in enumerate(plans, 1):
                for r in p.runs:
                    console.print(
                        escape(
                            f"  {i}. {p.claim}: seed {r.seed} {r.algorithm} look {r.look}, "
                            f"{'?' if r.gpu_s is None else f'{r.gpu_s / 60:.1f}'} GPU-min, {r.cost}; CPU "
                            f"{'?' if r.cpu_s is None else hours(r.cpu_s)}{' (CPU-sized)' if r.cpu_sized else ''}: "
                            f"{json.dumps(dict(sorted(r.key)), sort_keys=True)}"
                        )
                    )
    console.print(escape(total_line(totals(every), scale)))
    for line in figure_lines(every):
        console.print(escape(f"  {line}"))


__all__ = [
    "HEADLINE",
    "LOOKS",
    "ClaimPlan",
    "Planned",
    "decided_at_first_look",
    "first_look",
    "gpu_cost",
    "markdown",
    "measure",
    "order_plans",
    "page_note",
    "plan_paper",
    "print_plan",
    "record_figures",
    "report_figures",
    "total_line",
    "totals",
]
