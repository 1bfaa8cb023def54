"""How long a paper table's sweep takes here (``fedbench-tables``): estimates measured on this machine, kept as data in
``conf/runtimes.yaml`` (stored_runtimes.py) and rewritten by ``fedbench-tables --estimate``.

Per table and scale (``paper``: the config as it is; ``cpu``: its reduced command) the estimate is

    jobs x rounds x (training sample-passes per round x s per training sample  +  evaluated samples per round x s per
    evaluated sample)

where the sample-passes come from the first cell of the grid composed and partitioned for real, and the two per-sample
costs are measured here on the cell's model, input size and batch size (job_cost.py). A swept key that changes the
cost (dataset, model, local epochs, clients, participation, a column config) is composed at each of its values and the
job cost is scaled by the mean over them. Not counted: what a method does beyond FedAvg's local training (a second
model, phase II, fine-tuning new clients, peer matching), data loading, and more than one thread; so the numbers are
lower bounds of the order of magnitude, not promises (estimate_check.py measures how far off they are).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import yaml

from .job_cost import _cell, _sig
from .stored_runtimes import (
    _stored,
    _stored_costs,
    cost_name,
    costs_from,
    load,
    runtimes_file,
    stored_costs,
    stored_form,
    update,
)

COST_KEYS = (
    "dataset",
    "model",
    "local_epochs",
    "clients",
    "participation",
    "rounds",
    "batch_size",
    "partition",
    "eval_every",
)


def hours(seconds: float) -> str:
    """``0.41 s``, ``40 s``, ``12 min``, ``3.4 h``, ``210 h`` (two significant digits)."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    h = seconds / 3600
    return f"{h:.1f} h" if h < 10 else f"{h:,.0f} h"


def _first_values(params: dict) -> list[str]:
    return [f"{k}={_values(k, v)[0]}" for k, v in params.items()]


def _values(k: str, v) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    [o] = OverridesParser.create().parse_overrides([f"{k}={v}"])
    return [str(x) for x in o.sweep_string_iterator()] if o.is_sweep_override() else [str(v)]


def estimate(entry: dict, scale: str, compose, costs: dict) -> dict | None:
    """{runs, rounds, s_per_round, seconds, ...} of one table at ``scale`` (``paper`` or ``cpu``), or None when that
    scale has no command (:func:`estimate_overrides` of the table's command line)."""
    import shlex

    if scale == "cpu" and not entry.get("reduced"):
        return None
    given = shlex.split(entry["reduced"])[3:] if scale == "cpu" else []  # after "fedbench -m +experiment=..."
    return estimate_overrides([f"+experiment={entry['name']}", *given], compose, costs)


def _short(key: str) -> str:
    """``+experiment/fedrema/setting@_global_`` -> ``setting``: a swept key as a setting's label shows it."""
    return key.lstrip("+~").split("@", 1)[0].rsplit("/", 1)[-1]


def _label(ats: list[dict]) -> str:
    """``setting=cifar10, algorithm=fedavg,fedprox``: the crossed keys' values of the settings on one line."""
    if not ats or not ats[0]:
        return "all runs"
    return ", ".join(f"{_short(k)}={','.join(dict.fromkeys(str(a[k]) for a in ats))}" for k in ats[0])


def estimate_overrides(given: list[str], compose, costs: dict) -> dict:
    """The estimate of the runs of a command line's overrides: its sweep is the config's ``hydra.sweeper.params`` and
    the overrides with several values (``seed=0,1,2``). The swept keys that change a run's cost (COST_KEYS, or a
    column config ``+experiment/...``) are crossed; each of their combinations is a *setting*, composed and measured
    (:func:`_cell`), holding runs / settings of the runs (the sweep is a grid). A setting whose data is not here is not
    measured and not counted: it is named with its share of the runs (every setting missing: its ConfigError).

    Returns ``runs`` (the runs counted), ``all_runs``, ``rounds`` (their mean: the rounds of every run unless swept),
    ``s_per_round`` (seconds / (runs x rounds): the mean setting's), ``seconds`` (the sum over the settings),
    ``settings`` ([{setting, runs, rounds, s_per_round, seconds}]), ``not_measured`` ([{setting, runs, why}], only
    when some is) and ``measured_now`` (per-sample cost keys that ``costs`` lacked, so measured here now)."""
    import itertools

    from omegaconf import OmegaConf

    from ..errors import ConfigError

    before = set(costs)
    cfg = compose([*_first_values(dict(g.split("=", 1) for g in given)), "logger=none", "hardware=cpu"])
    params = OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.params is not None else {}
    given_keys = {g.split("=", 1)[0].lstrip("+~") for g in given}
    sweep = {k: v for k, v in params.items() if k.lstrip("+~") not in given_keys}
    sweep.update({g.split("=", 1)[0]: g.split("=", 1)[1] for g in given if len(_values(*g.split("=", 1))) > 1})
    values = {k: _values(k, v) for k, v in sweep.items()}
    all_runs = int(np.prod([len(v) for v in values.values()])) if values else 1
    plain = [g for g in given if g.split("=", 1)[0] not in sweep]
    first = {k: v[0] for k, v in values.items()}

    def composed(at: dict):
        return compose([*plain, *(f"{k}={v}" for k, v in {**first, **at}.items()), "logger=none", "hardware=cpu"])

    base = composed({})

    def changes_cost(k: str) -> bool:
        if k.startswith(("experiment/", "+experiment/")):
            return True
        return any(
            any(OmegaConf.select(composed({k: val}), x) != OmegaConf.select(base, x) for x in COST_KEYS)
            for val in values[k][1:]
        )

    crossed = [k for k, v in values.items() if k != "seed" and len(v) > 1 and changes_cost(k)]
    combos = list(itertools.product(*(values[k] for k in crossed)))
    per = all_runs // len(combos)
    groups, missing, first_error = {}, [], None  # settings of the same cost (the same cell) are one line
    for combo in combos:
        at = dict(zip(crossed, combo))
        c = composed(at)
        try:
            got = _cell(c, costs)
        except ConfigError as e:  # e.g. a dataset column whose data is not here: not counted, named with its share
            first_error = first_error or e
            missing.append({"setting": _label([at]), "runs": per, "why": e.allowed.split(";")[0][:80]})
            continue
        groups.setdefault((got["rounds"], _sig(got["s_per_round"])), []).append(at)
    settings = [
        {
            "setting": _label(ats),
            "runs": per * len(ats),
            "rounds": r,
            "s_per_round": s,
            "seconds": _sig(per * len(ats) * r * s),
        }
        for (r, s), ats in groups.items()
    ]
    if not settings:
        raise first_error
    runs = sum(s["runs"] for s in settings)
    run_rounds = sum(s["runs"] * s["rounds"] for s in settings)
    seconds = sum(s["runs"] * s["rounds"] * s["s_per_round"] for s in settings)
    out = {
        "runs": runs,
        "all_runs": all_runs,
        "rounds": run_rounds // runs if run_rounds % runs == 0 else round(run_rounds / runs, 1),
        "s_per_round": _sig(seconds / run_rounds),
        "seconds": _sig(seconds),
        "settings": settings,
    }
    if missing:
        out["not_measured"] = missing
    if now := sorted(set(costs) - before, key=str):
        out["measured_now"] = [cost_name(k) for k in now]
    return out


ASSUMES = (
    "assumes an idle CPU core: one thread, FedAvg-equivalent local training and evaluation only (no data loading, "
    "no method's extra work), so a lower bound; on a loaded machine it is off by the load, and there the run's own "
    "ETA after round 1 is the better guide (docs/estimates.md gives its measured error)"
)


def _uniform(got: dict) -> bool:
    return len({s["rounds"] for s in got.get("settings") or [got]}) == 1


def estimate_line(got: dict) -> str:
    """``estimated 3.3 h here = 12 runs x 50 rounds x 20 s per round``: terms that multiply to the total (the mean
    setting's seconds per round), and the runs left out with their share."""
    runs = f"{got['runs']} run{'s' if got['runs'] != 1 else ''}"
    if _uniform(got):
        terms = f"{runs} x {got['rounds']} rounds x {got['s_per_round']:.4g} s per round"
    else:  # rounds swept: the runs x the mean run
        terms = f"{runs} x {got['seconds'] / got['runs']:.4g} s per run"
    n = len(got.get("settings") or [])
    line = f"estimated {hours(got['seconds'])} here = {terms}" + (
        f" (the mean over the {n} settings below)" if n > 1 else ""
    )
    if got.get("not_measured"):
        left = sum(m["runs"] for m in got["not_measured"])
        total = got.get("all_runs", got["runs"] + left)
        whys = "; ".join(f"{m['setting']}: {m['why']}" for m in got["not_measured"])
        line += f"; {left} of the {total} runs ({100 * left / total:.0f} %) not measured and not counted — {whys}"
    return line


def left_line(got: dict, left: int) -> str:
    """``the 3 to run: 3 x 1,200 s per run (the mean run) = 1.0 h``: runs left of a multirun x its mean run."""
    per_run = got["seconds"] / max(got["runs"], 1)
    return f"the {left} to run: {left} x {per_run:.4g} s per run (the mean run) = {hours(left * per_run)}"


def setting_lines(got: dict) -> list[str]:
    """One line per setting when there are several: ``setting=cifar10: 55 runs x 500 rounds x 147.5 s = 1,127 h``
    (their hours sum to the total)."""
    out = []
    if len(got.get("settings") or []) > 1:
        for s in got["settings"]:
            out.append(
                f"  {s['setting']}: {s['runs']} runs x {s['rounds']} rounds x {s['s_per_round']:.4g} s = "
                f"{hours(s['seconds'])}"
            )
    return out


def estimate_lines(got: dict, costs_from: str = "") -> list[str]:
    """What ``fedbench --estimate`` prints: :func:`estimate_line`, :func:`setting_lines`, and what it assumes (with
    where the per-sample costs come from)."""
    now = got.get("measured_now") or []
    source = costs_from + (f"; measured here now: {', '.join(now)}" if now else "")
    return [estimate_line(got), *setting_lines(got), ASSUMES + (f"; CPU seconds per sample: {source}" * bool(source))]


def brief(got: dict) -> str:
    """``~1,512 h here (110 of 165 runs; not measured: setting=fashionmnist)``: the stored estimate as fedbench-tables
    lists it — the same total as ``fedbench --estimate`` of the table's command."""
    text = f"~{hours(got['seconds'])} here"
    if got.get("not_measured"):
        names = ", ".join(m["setting"] if isinstance(m, dict) else str(m) for m in got["not_measured"])
        text += f" ({got['runs']} of {got.get('all_runs', '?')} runs; not measured: {names})"
    return text


def write_estimates(
    entries: list[dict], conf_dir: Path, data_root: str | None, log=print, measure: bool = True
) -> Path:
    """Estimate ``entries`` at both scales and write them into ``conf/runtimes.yaml``; the other tables' stored
    estimates are kept (``fedbench-tables --estimate fedrema`` re-measures FedReMa's only), and so are those of tables
    whose data is absent here. ``measure``: the per-sample costs are measured here now (else the stored ones are used
    and only the missing ones measured); what is measured is stored with the machine and date."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ..errors import ConfigError
    from ..provenance import machine

    extra = [f"data_root={data_root}"] if data_root else []
    costs, tables = ({} if measure else stored_costs(conf_dir)), dict(load(conf_dir))
    before = set(costs)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):

        def compose(overrides):
            return hydra_compose("config", overrides=[*overrides, *extra], return_hydra_config=True)

        for e in entries:
            for scale in ("cpu", "paper"):
                try:
                    got = estimate(e, scale, compose, costs)
                except ConfigError as err:  # the table's data is not here
                    log(f"{e['name']} ({scale}): not estimated — {err}")
                    continue
                if got:
                    tables.setdefault(e["name"], {})[scale] = stored_form(got)
                    log(f"{e['name']} ({scale}): {estimate_line(got)}")
    GlobalHydra.instance().clear()
    header = (
        "# Estimated time of each paper table's sweep on one idle CPU thread, from the CPU seconds per sample\n"
        "# measured on the machine named below, written by `fedbench-tables --estimate` (fedbench/report/runtime.py\n"
        "# says how; docs/estimates.md gives the measured error; lower bounds: FedAvg-equivalent local training and\n"
        "# evaluation only). cpu = the table's reduced command, paper = the config as it is.\n"
        "# claims, gpu, plan: `fedbench-claims plan --measure` (docs/paper_scale.md): the claims experiments'\n"
        "# estimates, the measured GPU seconds per round (device, date, source of each), what counts as CPU-sized.\n"
    )
    old = _stored(conf_dir)
    new = set(costs) - before
    kept = {k: v for k, v in _stored_costs(conf_dir).items() if "/" in k.split("@", 1)[0]}  # keys of today's form
    body = {
        "machine": f"{machine()}, 1 thread" if new or "machine" not in old else old["machine"],
        "measured": datetime.date.today().isoformat() if new or "measured" not in old else old["measured"],
        "per_sample_cpu_seconds": {**kept, **{cost_name(k): list(costs[k]) for k in sorted(new, key=str)}},
        "tables": dict(sorted(tables.items())),
        **{k: v for k, v in old.items() if k in ("claims", "gpu", "plan", "checked")},  # fedbench-claims plan's
    }
    path = runtimes_file(conf_dir)
    path.write_text(header + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=120))
    return path


# costs_from, stored_costs and update live in stored_runtimes.py; cli.py and claims/__init__.py import them from here
__all__ = [
    "ASSUMES",
    "COST_KEYS",
    "brief",
    "costs_from",
    "estimate",
    "estimate_line",
    "estimate_lines",
    "estimate_overrides",
    "hours",
    "left_line",
    "setting_lines",
    "stored_costs",
    "update",
    "write_estimates",
]
