"""How long a paper table's sweep takes here (``fedbench-tables``): estimates measured on this machine, kept as data in
``conf/runtimes.yaml`` and rewritten by ``fedbench-tables --estimate``.

Per table and scale (``paper``: the config as it is; ``cpu``: its reduced command) the estimate is

    jobs x rounds x (training sample-passes per round x s per training sample  +  evaluated samples per round x s per
    evaluated sample)

where the sample-passes come from the first cell of the grid composed and partitioned for real (participating clients
x local epochs x their mean train size; every client's test split and the global test set at each evaluation), and the
two per-sample costs are measured here on the cell's model, input size and batch size (one thread, CPU seconds:
``time.process_time`` of SGD steps and of forward passes of random inputs, so that other load on the machine does not
count). A swept key that changes the cost (dataset, model, local epochs, clients, participation, a column config)
is composed at each of its values and the job cost is scaled by the mean over them. Not counted: what a method does
beyond FedAvg's local training (a second model, phase II, fine-tuning new clients, peer matching), data loading, and
more than one thread; so the numbers are lower bounds of the order of magnitude, not promises.

The same file holds, for ``fedbench-claims plan`` (fedbench/claims/plan.py, issue #51): ``claims`` — this estimate of
each claims experiment at a scale (``fedbench-claims plan --measure``), and ``gpu`` — GPU seconds per round
(training + evaluation) measured on a named device, each with its date and the file it comes from. A setting without
a GPU figure is costed from a measured one by the ratio of their CPU estimates here (:func:`gpu_scaled`): samples x
CPU seconds per sample, the estimator's stand-in for FLOPs per sample x samples.
"""

from __future__ import annotations

import datetime
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

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


def runtimes_file(conf_dir: Path) -> Path:
    return Path(conf_dir) / "runtimes.yaml"


def load(conf_dir: Path) -> dict:
    """The stored estimates: {table name: {scale: {runs, rounds, s_per_round, hours}}} (empty when none)."""
    try:
        data = yaml.safe_load(runtimes_file(conf_dir).read_text()) or {}
    except OSError:
        return {}
    return data.get("tables") or {}


def _stored(conf_dir: Path) -> dict:
    try:
        return yaml.safe_load(runtimes_file(conf_dir).read_text()) or {}
    except OSError:
        return {}


def _stored_costs(conf_dir: Path) -> dict:
    return _stored(conf_dir).get("per_sample_cpu_seconds") or {}


def stored_costs(conf_dir: Path) -> dict:
    """The stored per-sample CPU costs as :func:`_cell` keys them: {(model, input shape, classes, batch): (train, eval)}
    (so that an estimate made from them is the same on every machine and in every process)."""
    out = {}
    for k, (t, v) in _stored_costs(conf_dir).items():
        model, rest = k.split("@", 1)
        shape, classes, batch = rest.split(",")
        out[(model, tuple(int(x) for x in shape.split("x")), int(classes.split()[0]), int(batch[2:]))] = (t, v)
    return out


def costs_from(conf_dir: Path) -> str:
    """Where the stored per-sample costs come from: ``conf/runtimes.yaml (measured 2026-11-28 on <machine>)``."""
    data = _stored(conf_dir)
    return f"conf/runtimes.yaml (measured {data.get('measured', '?')} on {data.get('machine', '?')})"


def claims_estimates(conf_dir: Path) -> dict:
    """{paper: {scale: {experiment: {runs, rounds, s_per_round, seconds}}}}: the stored CPU estimates of the claims
    experiments (:func:`estimate_overrides` of each experiment's multirun; ``fedbench-claims plan --measure``)."""
    return _stored(conf_dir).get("claims") or {}


def gpu_figures(conf_dir: Path) -> dict:
    """{name: figure}: the measured GPU seconds per round (``train_s`` + ``eval_s``) of settings named by paper,
    scale, claims experiment and algorithm, each with its ``device``, ``date`` and ``source``."""
    return (_stored(conf_dir).get("gpu") or {}).get("figures") or {}


def plan_settings(conf_dir: Path) -> dict:
    """The plan's stated constants (``plan:`` in conf/runtimes.yaml): what counts as CPU-sized."""
    return _stored(conf_dir).get("plan") or {}


def gpu_scaled(figure: dict, cpu_per_round: float, figure_cpu_per_round: float) -> float:
    """GPU seconds per round of a setting costed from a measured ``figure``: its training + evaluation seconds per
    round x the ratio of the two settings' CPU estimates per round (samples x CPU seconds per sample)."""
    return (float(figure["train_s"]) + float(figure["eval_s"])) * cpu_per_round / figure_cpu_per_round


def update(conf_dir: Path, section: str, value) -> Path:
    """Rewrite one top-level section of conf/runtimes.yaml, keeping the others and the file's header. The claims
    estimates (``fedbench-claims plan --measure``) are kept in :func:`stored_form`, as the tables' are."""
    if section == "claims":
        value = {p: {s: {e: stored_form(v) for e, v in es.items()} for s, es in ss.items()} for p, ss in value.items()}
    path = runtimes_file(conf_dir)
    text = path.read_text() if path.exists() else ""
    head = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        head.append(line + "\n")
    data = _stored(conf_dir)
    data[section] = value
    path.write_text("".join(head) + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120))
    return path


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


# ---- measuring ----------------------------------------------------------------------------------------------------


def _sig3(x: float) -> float:
    """Three significant digits: as conf/runtimes.yaml stores a per-sample cost (an estimate from a cost measured now
    is the one from the same cost stored)."""
    return float(f"{x:.3g}")


def _per_sample(net, x_shape, num_classes: int, batch: int, channels_last: bool) -> tuple[float, float]:
    """CPU seconds per training sample (forward, backward, SGD step at ``batch``) and per evaluated sample (256)."""
    import torch

    net = net.to(memory_format=torch.channels_last) if channels_last else net
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *x_shape, generator=g)
    y = torch.randint(0, num_classes, (batch,), generator=g)
    x = x.to(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    def timed(fn, n):
        fn()  # warm-up
        t = time.process_time()
        for _ in range(n):
            fn()
        return (time.process_time() - t) / n

    train = _sig3(timed(step, 5) / batch)
    xe = torch.randn(256, *x_shape, generator=g)
    xe = xe.to(memory_format=torch.channels_last) if channels_last and xe.dim() == 4 else xe
    net.eval()
    with torch.no_grad():
        evaluate = _sig3(timed(lambda: net(xe), 3) / 256)
    net.train()
    return train, evaluate


def cost_key(cfg, input_shape, num_classes: int) -> tuple:
    """The per-sample cost's key: the model's name and parameter count (two configs of one name, e.g. ``model=cnn``
    and ``model=tiny_cnn``, cost differently), the input shape, the classes and the batch size."""
    from ..models import build_model

    net = build_model(cfg.model, input_shape, num_classes)
    params = sum(p.numel() for p in net.parameters())
    return (f"{cfg.model.name}/{params}", tuple(input_shape), int(num_classes), int(cfg.batch_size)), net


def _cell(cfg, costs: dict) -> dict:
    """One job's rounds and seconds per round (see the module docstring); ``costs`` caches per-sample costs."""
    from omegaconf import OmegaConf

    from ..run import Run

    with tempfile.TemporaryDirectory() as tmp:
        run = Run(cfg, Path(tmp) / "run")
        run.setup()
        data = run.data
        k = len(data.train_idx)
        nc = getattr(run, "new_clients", None)  # CAFeMe's held-out new clients never train
        train_clients = [int(i) for i in nc.participants] if nc is not None else list(range(k))
        m = max(1, int(round(float(cfg.participation) * len(train_clients))))
        n_train = float(np.mean([len(data.train_idx[i]) for i in train_clients]))
        evaluated = sum(len(t) for t in data.test_idx) * bool(cfg.eval.personalized) + (  # what one evaluation scores
            len(data.global_test_idx) if cfg.eval.global_model else 0
        )
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            key, net = cost_key(cfg, data.input_shape, data.num_classes)
            if key not in costs:
                costs[key] = _per_sample(
                    net, tuple(data.input_shape), int(data.num_classes), int(cfg.batch_size), len(data.input_shape) == 3
                )
        finally:
            torch.set_num_threads(threads)
        c_train, c_eval = costs[key]
        epochs = OmegaConf.select(cfg, "local_epochs", default=1) or 1
        per_round = m * float(epochs) * n_train * c_train + evaluated * c_eval / max(1, int(cfg.eval_every))
        del run
    return {"rounds": int(cfg.rounds), "s_per_round": per_round}


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


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


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


def cost_name(key: tuple) -> str:
    """``cnn/545098@3x32x32,10 classes,B=128``: a per-sample cost's key as conf/runtimes.yaml writes it."""
    m, s, c, b = key
    return f"{m}@{'x'.join(map(str, s))},{c} classes,B={b}"


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


# ---- checked against measured runs (docs/estimates.md) ------------------------------------------------------------

FEDAVG_LIKE = ("fedavg", "local")  # what the estimate counts: FedAvg-equivalent local training and evaluation


def measured(record: dict) -> tuple[float, int] | None:
    """(seconds, rounds) a recorded run spent in its rounds: the sum of each round's ``time/round`` (the algorithm's
    round) and ``time/eval`` (its evaluation) — what the estimate counts, without setup, data loading or pauses (a
    resumed run's wall time holds the time it waited); None when the record has no round times."""
    rows = [v for v in (record.get("rounds") or {}).values() if "time/round" in v]
    if not rows:
        return None
    return sum(float(v["time/round"]) + float(v.get("time/eval", 0.0)) for v in rows), len(rows)


def checked_setting(rec: dict) -> str | None:
    """The setting a record is checked under (``fedrema cpu table2 fedavg @ <machine>``), or None: a complete run made
    on a CPU (no GPU in its machine) with one thread (``hardware.threads=1``, the estimate's assumption), of FedAvg or
    Local (what the estimate counts) or of its paper's own method (what it leaves out), with its round times."""
    cfg = rec.get("config") or {}
    alg, m = (cfg.get("algorithm") or {}).get("name"), rec.get("machine") or ""
    if rec.get("status") != "complete" or not m or "NVIDIA" in m or (cfg.get("hardware") or {}).get("threads") != 1:
        return None
    if alg not in (*FEDAVG_LIKE, rec.get("paper")) or measured(rec) is None:
        return None
    return f"{rec['paper']} {rec['scale']} {(rec['choices'].get('experiment') or '').split('/')[-1]} {alg} @ {m}"


def checked_estimates(records: list[dict], costs: dict, compose, data_root: str | None = None) -> dict:
    """{setting: the estimate's seconds per round}: per :func:`checked_setting` setting, the median over its runs of
    :func:`_cell` of each run's own config (the per-sample costs ``costs``). A record's config is laid over today's
    defaults of its dataset, model and partition (``compose``: Hydra's, on conf/) with FedAvg as its algorithm: keys
    added since it ran get their defaults, and the estimate counts FedAvg-equivalent work whatever the method."""
    import json

    from omegaconf import OmegaConf

    cells, groups = {}, {}
    for rec in records:
        if (setting := checked_setting(rec)) is None:
            continue
        cfg = {k: v for k, v in rec["config"].items() if k not in ("algorithm", "table")}
        if data_root:
            cfg["data_root"] = cfg["dataset"]["root"] = data_root
        key = json.dumps({k: v for k, v in cfg.items() if k != "seed"}, sort_keys=True)
        if key not in cells:
            chosen = {g: (rec.get("choices") or {}).get(g) for g in ("dataset", "model", "partition")}
            base = compose(["algorithm=fedavg", *(f"{g}={c}" for g, c in chosen.items() if c)])
            base = OmegaConf.create(OmegaConf.to_container(base))  # not struct: the record's keys laid over it
            cells[key] = _cell(OmegaConf.merge(base, cfg), costs)["s_per_round"]
        groups.setdefault(setting, []).append(cells[key])
    return {k: _sig(float(np.median(v))) for k, v in sorted(groups.items())}


def checked_rows(records: list[dict], estimates: dict) -> list[dict]:
    """The estimate against measured runs, per :func:`checked_setting` setting: the estimate's seconds per round
    (``estimates``: :func:`checked_estimates`, stored in conf/runtimes.yaml's ``checked``), the median over its runs
    of the measured ones (:func:`measured` / its rounds: a run slowed by other work on the machine counts once) and
    their ratio."""
    groups = {}
    for rec in records:
        if (setting := checked_setting(rec)) is not None and setting in estimates:
            seconds, rounds = measured(rec)
            groups.setdefault(setting, []).append(seconds / rounds)
    rows = []
    for setting, got in sorted(groups.items()):
        name, machine = setting.split(" @ ", 1)
        meas, est = _sig(float(np.median(got))), estimates[setting]
        rows.append(
            {"setting": name, "machine": machine, "runs": len(got), "estimate": est, "measured": meas,
             "ratio": float(f"{meas / est:.3g}")}
        )  # fmt: skip
    return rows


def error_table(rows: list[dict]) -> str:
    """The Markdown table of :func:`checked_rows` with the ratios' range (FedAvg-like, and the papers' methods)."""
    out = [
        "| setting (paper scale experiment algorithm) | machine | runs | estimate (s per round) "
        "| measured (s per round, median of the runs) | measured / estimate |",
        "|---|---|---:|---:|---:|---:|",
    ]
    out += [
        f"| {r['setting']} | {r['machine']} | {r['runs']} | {r['estimate']:.4g} | {r['measured']:.4g} | "
        f"{r['ratio']:.3g} |"
        for r in rows
    ]
    for name, sel in (("FedAvg and Local", True), ("the papers' own methods", False)):
        ratios = sorted(r["ratio"] for r in rows if (r["setting"].split()[-1] in FEDAVG_LIKE) == sel)
        if ratios:
            out.append(
                f"\n{name}: measured / estimate from {ratios[0]:.3g} to {ratios[-1]:.3g}, median "
                f"{float(np.median(ratios)):.3g} ({len(ratios)} settings)."
            )
    return "\n".join(out) + "\n"


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


def stored_form(got: dict) -> dict:
    """An estimate as conf/runtimes.yaml keeps it: without the per-setting breakdown and the cost keys measured now."""
    return {k: v for k, v in got.items() if k not in ("settings", "measured_now")}


__all__ = [
    "ASSUMES",
    "brief",
    "checked_estimates",
    "checked_rows",
    "checked_setting",
    "claims_estimates",
    "cost_key",
    "cost_name",
    "costs_from",
    "estimate",
    "estimate_line",
    "estimate_lines",
    "estimate_overrides",
    "error_table",
    "measured",
    "gpu_figures",
    "gpu_scaled",
    "hours",
    "left_line",
    "load",
    "plan_settings",
    "runtimes_file",
    "setting_lines",
    "stored_costs",
    "stored_form",
    "update",
    "write_estimates",
]
