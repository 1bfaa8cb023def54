"""Claims as data: ``conf/claims/<paper>.yaml`` loaded, checked and turned into the multiruns that test them.

A file holds a paper's scales (``paper``, ``cpu``, ``smoke``: seeds, overrides for every run, what was cut and why),
its experiments (per scale: an ``+experiment=`` config, overrides, the swept values the claims compare) and its
claims (what the paper says, where, which experiment, which metric, the predicate). docs/claims.md has the schema.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..report.runs import canon, expand_jobs
from .predicates import Predicate, PredicateError, _is_number, parse

# cpu-bf16: the cpu scale's runs in bf16 autocast (hardware.precision=bf16): do its verdicts equal fp32's? (issue #32)
SCALES = ("paper", "medium", "cpu", "cpu-bf16", "smoke")
TOP_FIELDS = {"paper", "title", "reference", "defaults", "scales", "experiments", "claims"}
SCALE_FIELDS = {"note", "seeds", "tune_seeds", "overrides", "like", "skip"}
EXPERIMENT_FIELDS = {"experiment", "overrides", "sweep", "needs"}
CLAIM_FIELDS = {
    "id",
    "claim",
    "source",
    "quote",
    "ours",
    "tune",
    "experiment",
    "metric",
    "holds_if",
    "paper",
    "by",
    "over",
    "where",
    "tolerance",
    "tolerance_why",
    "percent",
    "target",
    "worst",
    "note",
    "diagnose",
}
# tolerance: τ, the smallest effect that matters (displayed units: accuracy points), below which a difference is "no
# difference"; worst: the value a diverged run counts as (default: 0 for a percentage, e.g. accuracy; other metrics
# must say)
DEFAULTS = {"tolerance": 0.5, "percent": True, "by": "choice:algorithm"}
# issue #52: every τ says where it comes from — a claim that sets ``tolerance`` says why in ``tolerance_why``; a claim
# on a metric that is not a percentage must set it (the default is in accuracy points)
DEFAULT_WHY = "fedbench's default for accuracy: half a point (fedbench-claims check keeps τ below the paper's own gap)"
SPREAD = 0.05  # check(): the paper's numbers as 5 seeds, this far apart (displayed units)
STATS = ("best", "final", "last", "best_round")


class ClaimsError(ValueError):
    """A claims file that cannot be used: the file, the claim and what is wrong, in one line."""


@dataclass
class Scale:
    name: str
    note: str
    seeds: list
    overrides: list
    tune_seeds: list = field(default_factory=list)  # the seeds a tuned method's grid value is chosen on (never judged)
    like: str = ""  # an experiment with no entry at this scale runs as at this other scale, with this scale's overrides
    skip: list = field(default_factory=list)  # experiments ``like`` does not bring to this scale (not run here)


@dataclass
class Experiment:
    """One experiment at one scale: ``fedbench -m +experiment=<experiment> <overrides> <sweep> seed=<seeds>``."""

    name: str
    scale: Scale
    experiment: str | None
    overrides: list
    sweep: dict
    tuned: bool = False  # a claim on it tunes a method over a grid: it also runs the scale's tune_seeds
    needs: str = ""  # data this machine lacks (its claims are "needs data" until runs exist)

    @property
    def seeds(self) -> list:
        return self.scale.seeds + (self.scale.tune_seeds if self.tuned else [])

    def args(self) -> list[str]:
        """Its overrides: the scale's, then the experiment's, then the sweep and the seeds (a later key replaces an
        earlier one, so an experiment can change a scale-wide value)."""
        merged: dict = {}
        items = (
            ([f"+experiment={self.experiment}"] if self.experiment else [])
            + list(self.scale.overrides)
            + list(self.overrides)
            + [f"{k}={_csv(v)}" for k, v in self.sweep.items()]
            + [f"seed={_csv(self.seeds)}"]
        )
        for item in items:
            merged[_key(item)] = item
        return list(merged.values())

    def command(self, sweep_dir: str | None = None) -> str:
        tail = [f"hydra.sweep.dir={sweep_dir}"] if sweep_dir else []
        return "fedbench -m " + " ".join(_quote(a) for a in [*self.args(), *tail])

    def compose(self, extra: list[str] = ()):
        """The composed config of its first job (Hydra's compose API), with the ``hydra`` node."""
        from hydra import compose

        with hydra_context():
            return compose(
                "config", overrides=[_first(item) for item in self.args() + list(extra)], return_hydra_config=True
            )

    def job_args(self, job: dict) -> list[str]:
        """The overrides of one job ({key: value} as :meth:`jobs` gives them): :meth:`args` with one value each."""
        return [f"{k}={job[k.lstrip('+~')]}" if (k := _key(a)).lstrip("+~") in job else _first(a) for a in self.args()]

    def compose_job(self, job: dict):
        """The composed config of one job ({key: value} as :meth:`jobs` gives them)."""
        from hydra import compose

        with hydra_context():
            return compose("config", overrides=self.job_args(job), return_hydra_config=True)

    def jobs(self, cfg=None) -> tuple[list[dict], set]:
        """Every job of the multirun ({key: value} as the run dirs record them) and the results-neutral keys."""
        from omegaconf import OmegaConf

        cfg = cfg if cfg is not None else self.compose()
        params = OmegaConf.to_container(cfg.hydra.sweeper.params) or {}
        neutral = set(cfg.hydra.job.config.override_dirname.exclude_keys)
        args = [a for a in self.args() if not _key(a).lstrip("+~").startswith(("hydra.", "hydra/"))]
        return expand_jobs([f"{k}={v}" for k, v in params.items()] + args, neutral), neutral


@dataclass
class Claim:
    id: str
    claim: str
    source: str
    experiment: str
    metric: str
    predicate: Predicate
    paper: dict  # {row: value} or {row: {col: value}}, keys canonical
    by: str
    over: str | None
    where: dict  # {key: canonical value}
    tolerance: float
    percent: bool
    worst: float  # the value a diverged run counts as
    target: dict | None = None  # rounds_to_target / speedup (fedbench/report)
    note: str = ""
    quote: str = ""  # the paper's own words (``source`` says where)
    ours: str = ""  # what is ours: the whole claim, or a bound or reading of the paper's words
    tune: dict = field(default_factory=dict)  # {row: grid key}: the row at its best grid value on the tune seeds
    diagnose: list = field(default_factory=list)  # metric paths shown per named method (the mechanism's own numbers)
    tolerance_why: str = DEFAULT_WHY  # where τ comes from: why it is the smallest effect that matters


@dataclass
class PaperClaims:
    paper: str
    title: str
    reference: str
    path: Path
    scales: dict  # {name: Scale}
    experiments: dict  # {name: {scale: Experiment}}
    claims: list = field(default_factory=list)

    def experiment(self, claim: Claim, scale: str) -> Experiment | None:
        return self.experiments[claim.experiment].get(scale)

    def needed(self, scale: str) -> list[Experiment]:
        """The experiments to run at a scale: those of the claims that can be decided there."""
        names = [c.experiment for c in self.claims if not (c.predicate.kind == "close" and scale != "paper")]
        return [self.experiments[n][scale] for n in dict.fromkeys(names) if scale in self.experiments[n]]


# ---- loading ---------------------------------------------------------------------------------------------------


def claims_dir() -> Path:
    from ..confdir import CONF_DIR

    return CONF_DIR / "claims"


def papers() -> list[str]:
    return sorted(p.stem for p in claims_dir().glob("*.yaml"))


def load(paper: str) -> PaperClaims:
    """``conf/claims/<paper>.yaml``, checked field by field (:class:`ClaimsError` names the file, claim and field)."""
    path = claims_dir() / f"{paper}.yaml"
    if not path.is_file():
        raise ClaimsError(f"no claims file {path} — one of: {', '.join(papers())}")
    return load_file(path)


def load_file(path: Path) -> PaperClaims:
    path, paper = Path(path), Path(path).stem
    try:
        node = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ClaimsError(f"{path}: not valid YAML: {e}") from None
    where = str(path)
    _fields(node, TOP_FIELDS, where)
    for key in ("paper", "scales", "experiments", "claims"):
        if key not in node:
            raise ClaimsError(f"{where}: missing '{key}'")
    if node["paper"] != paper:
        raise ClaimsError(f"{where}: paper: {node['paper']!r} — must be the file name, {paper!r}")
    defaults = {**DEFAULTS, **(node.get("defaults") or {})}
    _fields(defaults, set(DEFAULTS), f"{where}: defaults")
    scales = {name: _scale(name, s, defaults, f"{where}: scales.{name}") for name, s in node["scales"].items()}
    for name in scales:
        if name not in SCALES:
            raise ClaimsError(f"{where}: scales.{name} — a scale is one of {', '.join(SCALES)}")
    experiments = {}
    for name, per_scale in (node["experiments"] or {}).items():
        experiments[name] = {}
        for scale, e in (per_scale or {}).items():
            at = f"{where}: experiments.{name}.{scale}"
            if scale not in scales:
                raise ClaimsError(f"{at} — no such scale (the file has {', '.join(scales)})")
            _fields(e or {}, EXPERIMENT_FIELDS, at)
            sweep = {str(k): v if isinstance(v, list) else [v] for k, v in ((e or {}).get("sweep") or {}).items()}
            experiments[name][scale] = Experiment(
                name,
                scales[scale],
                (e or {}).get("experiment"),
                [str(o) for o in (e or {}).get("overrides") or []],
                sweep,
                needs=str((e or {}).get("needs", "")),
            )
        for scale in scales.values():  # `like: cpu`: the experiments this scale does not list, as at that scale
            if (
                scale.like
                and name not in scale.skip
                and scale.name not in experiments[name]
                and scale.like in experiments[name]
            ):
                e = experiments[name][scale.like]
                experiments[name][scale.name] = Experiment(
                    name, scale, e.experiment, e.overrides, e.sweep, needs=e.needs
                )
    pc = PaperClaims(paper, str(node.get("title", paper)), str(node.get("reference", "")), path, scales, experiments)
    seen = set()
    for i, c in enumerate(node["claims"] or []):
        claim = _claim(c, defaults, experiments, f"{where}: claims[{i}]")
        if claim.id in seen:
            raise ClaimsError(f"{where}: claims[{i}]: id {claim.id!r} used twice")
        seen.add(claim.id)
        pc.claims.append(claim)
        for exp in experiments[claim.experiment].values() if claim.tune else ():
            if not exp.scale.tune_seeds:
                raise ClaimsError(
                    f"{where}: claims[{i}] ({claim.id}): tune needs the {exp.scale.name} scale's tune_seeds (the seeds "
                    "the grid value is chosen on; the judged seeds never choose it)"
                )
            exp.tuned = True
    return pc


def _fields(node, allowed: set, where: str) -> None:
    if not isinstance(node, dict):
        raise ClaimsError(f"{where}: expected a mapping, got {type(node).__name__}")
    unknown = sorted(set(map(str, node)) - allowed)
    if unknown:
        raise ClaimsError(f"{where}: unknown field {unknown[0]!r} — allowed: {', '.join(sorted(allowed))}")


def _scale(name: str, s: dict, defaults: dict, where: str) -> Scale:
    _fields(s or {}, SCALE_FIELDS, where)
    seeds = (s or {}).get("seeds")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(x, int) and x >= 0 for x in seeds):
        raise ClaimsError(f"{where}.seeds: {seeds!r} — a non-empty list of integers >= 0")
    like = str((s or {}).get("like") or "")
    if like and (like == name or like not in SCALES):
        raise ClaimsError(f"{where}.like: {like!r} — another scale: one of {', '.join(x for x in SCALES if x != name)}")
    tune = (s or {}).get("tune_seeds") or []
    if not all(isinstance(x, int) and x >= 0 and x not in seeds for x in tune):
        raise ClaimsError(f"{where}.tune_seeds: {tune!r} — integers >= 0, none of them a judged seed")
    return Scale(
        name,
        str((s or {}).get("note", "")).strip(),
        seeds,
        [str(o) for o in (s or {}).get("overrides") or []],
        list(tune),
        like,
        [str(x) for x in (s or {}).get("skip") or []],
    )


def _claim(c: dict, defaults: dict, experiments: dict, where: str) -> Claim:
    _fields(c, CLAIM_FIELDS, where)
    for key in ("id", "claim", "source", "experiment", "metric", "holds_if"):
        if not c.get(key):
            raise ClaimsError(f"{where}: missing '{key}'")
    where = f"{where} ({c['id']})"
    if c["experiment"] not in experiments:
        raise ClaimsError(f"{where}: experiment {c['experiment']!r} — one of {', '.join(experiments)}")
    try:
        pred = parse(c["holds_if"])
    except PredicateError as e:
        raise ClaimsError(f"{where}: {e}") from None
    over = c.get("over")
    if pred.needs_sweep and not over:
        raise ClaimsError(f"{where}: '{pred.text}' is a trend: it needs 'over: <swept key>'")
    metric = str(c["metric"])
    _check_metric(metric, where)
    paper = {}
    for row, v in (c.get("paper") or {}).items():
        paper[canon(row)] = {canon(k): float(x) for k, x in v.items()} if isinstance(v, dict) else float(v)
    if pred.kind == "close" and not paper:
        raise ClaimsError(f"{where}: 'close within' needs the paper's numbers under 'paper:'")
    tol = c.get("tolerance", defaults["tolerance"])
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or tol < 0:
        raise ClaimsError(f"{where}: tolerance: {tol!r} — a number >= 0")
    if "tolerance" in c and not str(c.get("tolerance_why") or "").strip():
        raise ClaimsError(
            f"{where}: tolerance: {tol!r} without tolerance_why — say where this smallest effect that matters comes "
            "from (issue #52)"
        )
    if "tolerance" not in c and not c.get("percent", defaults["percent"]):
        raise ClaimsError(
            f"{where}: percent: false and no tolerance — the default τ ({defaults['tolerance']}) is in accuracy "
            "points; set tolerance and tolerance_why for this metric"
        )
    if not (c.get("quote") or c.get("ours")):
        raise ClaimsError(
            f"{where}: say whose claim it is — 'quote:' (the paper's words; 'source:' says where) and/or 'ours:' "
            "(what is our extension: the claim, or its bound)"
        )
    tune = {canon(k): str(v) for k, v in (c.get("tune") or {}).items()}
    if any(row not in map(canon, pred.names) for row in tune):
        raise ClaimsError(f"{where}: tune: a tuned row must be a name of the predicate ({pred.text!r})")
    percent = bool(c.get("percent", defaults["percent"]))
    worst = c.get("worst", 0.0 if percent else None)
    if isinstance(worst, bool) or not isinstance(worst, (int, float)):
        raise ClaimsError(
            f"{where}: worst: {worst!r} — the value a diverged run counts as (a number; needed when percent is false)"
        )
    return Claim(
        str(c["id"]),
        " ".join(str(c["claim"]).split()),
        " ".join(str(c["source"]).split()),
        str(c["experiment"]),
        metric,
        pred,
        paper,
        str(c.get("by", defaults["by"])),
        str(over) if over else None,
        {str(k): canon(v) for k, v in (c.get("where") or {}).items()},
        float(tol),
        percent,
        float(worst),
        c.get("target"),
        " ".join(str(c.get("note", "")).split()),
        " ".join(str(c.get("quote", "")).split()),
        " ".join(str(c.get("ours", "")).split()),
        tune,
        [str(m) for m in c.get("diagnose") or []],
        " ".join(str(c.get("tolerance_why") or DEFAULT_WHY).split()),
    )


def _check_metric(metric: str, where: str) -> None:
    """A report metric path (docs/report.md): ``<metric>.<stat>``, ``<metric>@<round|mean>``, a derived metric
    (``rounds_to_target``, ``speedup``) or a top-level summary key."""
    if "@" in metric:
        at = metric.rsplit("@", 1)[1]
        if not (at == "mean" or at.isdigit()):
            raise ClaimsError(f"{where}: metric {metric!r} — after '@' a round number or 'mean'")
    elif "/" in metric and "." in metric and metric.rsplit(".", 1)[1] not in STATS:
        raise ClaimsError(f"{where}: metric {metric!r} — a per-round metric needs one of .{', .'.join(STATS)}")


# ---- small helpers -------------------------------------------------------------------------------------------------


@contextmanager
def hydra_context():
    """Hydra's compose API on conf/ (nested uses share one context, and with it Hydra's cache of config files)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ..confdir import CONF_DIR
    from ..hydra_cache import install

    install()  # each config file parsed once per process (a page composes once per missing job)
    if GlobalHydra.instance().is_initialized():
        yield
        return
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            yield
    finally:
        GlobalHydra.instance().clear()


def _key(item: str) -> str:
    return item.split("=", 1)[0]


def _first(item: str) -> str:
    """``key=a,b`` -> ``key=a`` (a sweep's first value, as Hydra's parser reads it); other overrides as they are."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    [o] = OverridesParser.create().parse_overrides([item])
    if not o.is_sweep_override():
        return item
    return f"{_key(item)}={next(iter(o.sweep_string_iterator()))}"


def _csv(values) -> str:
    return ",".join(str(v) for v in (values if isinstance(values, list) else [values]))


def _quote(arg: str) -> str:
    """A shell word: quoted when it holds characters the shell would read (``@``, ``$``, spaces, ...)."""
    import shlex

    return shlex.quote(arg)


# ---- checks that need Hydra (fedbench-claims check, the tests) ---------------------------------------------------


def key_values(jobs: list[dict], cfg, key: str, exp: Experiment | None = None) -> set:
    """The values (canonical) a row/column key takes over an experiment's jobs. When no job sets it, the composed
    config's value — for each value of each swept config group when ``exp`` is given (a sweep arm that chooses the
    algorithm, e.g. FedKA's ``experiment/fedka/arm@_global_``)."""
    from omegaconf import OmegaConf

    name = key[7:] if key.startswith("choice:") else key
    vals = {
        canon(yaml.safe_load(v) if v else v)
        for j in jobs
        for k, v in j.items()
        if k == name or (key.startswith("choice:") and k.split("@")[0] == name)
    }
    if vals:
        return vals
    path = f"hydra.runtime.choices.{name}" if key.startswith("choice:") else name
    configs = [cfg]
    if exp is not None:
        configs += [exp.compose([f"{k}={v}"]) for k, values in exp.sweep.items() if "/" in k for v in values]
    return {canon(v) for c in configs if (v := OmegaConf.select(c, path, default=None)) is not None}


def check(pc: PaperClaims) -> list[str]:
    """Everything that can be wrong before a run, one line each: every experiment composes at every scale (its first
    job, Hydra's compose API) and passes fedbench's config checks, its other swept values are options or keys that
    exist (``fedbench`` composes each before it runs anything); each claim's names are values its runs take, its
    ``over`` key varies and its ``where`` values occur; and the rule finds it true of the paper's own numbers
    (:func:`paper_problems`)."""
    from ..confdir import GROUPS, options

    problems, options_of = [], {g: set(options(g)) for g in GROUPS}
    with hydra_context():
        for name, per_scale in pc.experiments.items():
            for scale, exp in per_scale.items():
                problems += _check_experiment(pc, name, scale, exp, options_of)
    for c in pc.claims:
        problems += paper_problems(pc, c)
    return problems


def paper_problems(pc: PaperClaims, c: Claim) -> list[str]:
    """The claim judged by the rule itself (its tolerance, α, Holm) on the paper's own numbers, taken as 5 seeds
    ``SPREAD`` apart: it must hold — a bound read on the wrong side, or a predicate that contradicts its own numbers,
    shows here. And each directional test's gap on the paper's numbers must exceed the tolerance τ: a claim whose
    paper effect is within τ would call the paper's own effect negligible."""
    from .predicates import HOLDS, evaluate, paper_data

    if not c.paper:
        return []
    cols = [None] if not c.over else list(dict.fromkeys(k for v in c.paper.values() if isinstance(v, dict) for k in v))
    paper = {row: v if isinstance(v, dict) else {None: v} for row, v in c.paper.items()}
    seeds = list(range(5))
    out = evaluate(c.predicate, paper_data(paper, cols, seeds, SPREAD), cols, seeds, c.tolerance, c.worst, paper)
    where = f"{pc.path.name}: {c.id}"
    problems = (
        []
        if out.verdict == HOLDS
        else [f"{where}: '{c.predicate.text}' is {out.verdict} on the paper's own numbers ({out.reason})"]
    )
    for t in out.tests:
        if t.op != "within" and t.gap is not None and t.gap <= c.tolerance:
            problems.append(
                f"{where}: {t.label}{f' at {t.at}' if t.at else ''}: the paper's gap {t.gap:.3g} is within the "
                f"tolerance {c.tolerance:g} (give the claim a smaller tolerance)"
            )
    return problems


def _check_experiment(pc: PaperClaims, name: str, scale: str, exp: Experiment, options_of: dict) -> list[str]:
    from omegaconf import OmegaConf

    from ..config import validate

    at = f"{pc.path.name}: experiments.{name}.{scale}"
    try:
        cfg = exp.compose()
        validate(cfg)
        jobs, _ = exp.jobs(cfg)
    except Exception as e:  # noqa: BLE001  (reported, one line each)
        return [f"{at}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
    problems = []
    mine = {_key(a).lstrip("+~") for a in exp.args()}
    for k, v in (OmegaConf.to_container(cfg.hydra.sweeper.params) or {}).items():  # the config's own sweep
        if k.lstrip("+~") not in mine and len(str(v).split(",")) > 1:
            problems.append(
                f"{at}: {exp.experiment} sweeps {k} over {v} and no override of the claims file fixes it "
                "(the runs multiply): give it a value or a sweep"
            )
    for k, values in exp.sweep.items():
        group = k.lstrip("+~").split("@")[0]
        if group in options_of:
            problems += [
                f"{at}: sweep {k}={v}: no conf/{group}/{v}.yaml" for v in values if str(v) not in options_of[group]
            ]
        elif "/" not in group and OmegaConf.select(cfg, group, default="<missing>") == "<missing>":
            problems.append(f"{at}: sweep {k}: no such config key")
    for c in (c for c in pc.claims if c.experiment == name):
        where = f"{pc.path.name}: {c.id} at {scale}"
        rows = key_values(jobs, cfg, c.by, exp)
        for n in c.predicate.names:
            if canon(n) not in rows and not (c.predicate.kind == "order" and _is_number(n)):
                problems.append(f"{where}: '{n}' is not a value of {c.by} in its runs ({', '.join(sorted(rows))})")
        problems += [f"{where}: paper row '{n}' is not a value of {c.by} in its runs" for n in c.paper if n not in rows]
        if c.predicate.needs_sweep and len(key_values(jobs, cfg, c.over, exp)) < 2:
            problems.append(f"{where}: over: {c.over} takes fewer than 2 values in its runs (a trend needs 2 or more)")
        for k, v in c.where.items():
            if v not in (have := key_values(jobs, cfg, k)):
                problems.append(f"{where}: where {k}={v}: no run has it ({', '.join(sorted(have))})")
    return problems


__all__ = [
    "SCALES",
    "ClaimsError",
    "Scale",
    "Experiment",
    "Claim",
    "PaperClaims",
    "check",
    "claims_dir",
    "paper_problems",
    "key_values",
    "papers",
    "load",
    "load_file",
]
