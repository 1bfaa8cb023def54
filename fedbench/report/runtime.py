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
import platform
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
    """Rewrite one top-level section of conf/runtimes.yaml, keeping the others and the file's header."""
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
    """``40 s``, ``12 min``, ``3.4 h``, ``210 h`` (two significant digits)."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    h = seconds / 3600
    return f"{h:.1f} h" if h < 10 else f"{h:,.0f} h"


# ---- measuring ----------------------------------------------------------------------------------------------------


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

    train = timed(step, 5) / batch
    xe = torch.randn(256, *x_shape, generator=g)
    xe = xe.to(memory_format=torch.channels_last) if channels_last and xe.dim() == 4 else xe
    net.eval()
    with torch.no_grad():
        evaluate = timed(lambda: net(xe), 3) / 256
    net.train()
    return train, evaluate


def _cell(cfg, costs: dict) -> dict:
    """One job's rounds and seconds per round (see the module docstring); ``costs`` caches per-sample costs."""
    from omegaconf import OmegaConf

    from ..models import build_model
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
        key = (str(cfg.model.name), tuple(data.input_shape), int(data.num_classes), int(cfg.batch_size))
        if key not in costs:
            import torch

            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                net = build_model(cfg.model, data.input_shape, data.num_classes)
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
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for k, v in params.items():
        [o] = OverridesParser.create().parse_overrides([f"{k}={v}"])
        out.append(f"{k}={next(iter(o.sweep_string_iterator())) if o.is_sweep_override() else v}")
    return out


def _values(k: str, v) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    [o] = OverridesParser.create().parse_overrides([f"{k}={v}"])
    return [str(x) for x in o.sweep_string_iterator()] if o.is_sweep_override() else [str(v)]


def estimate(entry: dict, scale: str, compose, costs: dict) -> dict | None:
    """{runs, rounds, s_per_round, seconds} of one table at ``scale`` (``paper`` or ``cpu``), or None when that scale
    has no command or its data is not here."""
    import shlex

    if scale == "cpu" and not entry.get("reduced"):
        return None
    given = shlex.split(entry["reduced"])[3:] if scale == "cpu" else []  # after "fedbench -m +experiment=..."
    return estimate_overrides([f"+experiment={entry['name']}", *given], compose, costs)


def estimate_overrides(given: list[str], compose, costs: dict) -> dict:
    """{runs, rounds, s_per_round, seconds} of the runs of a command line's overrides (``fedbench --estimate``): its
    sweep is the config's ``hydra.sweeper.params`` and the overrides with several values (``seed=0,1,2``)."""
    from omegaconf import OmegaConf

    from ..errors import ConfigError

    cfg = compose([*_first_values(dict(g.split("=", 1) for g in given)), "logger=none", "hardware=cpu"])
    params = OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.params is not None else {}
    given_keys = {g.split("=", 1)[0].lstrip("+~") for g in given}
    sweep = {k: v for k, v in params.items() if k.lstrip("+~") not in given_keys}
    sweep.update({g.split("=", 1)[0]: g.split("=", 1)[1] for g in given if len(_values(*g.split("=", 1))) > 1})
    runs = int(np.prod([len(_values(k, v)) for k, v in sweep.items()])) if sweep else 1
    plain = [g for g in given if g.split("=", 1)[0] not in sweep]
    first = _first_values(sweep)
    cell = _cell(compose([*plain, *first, "logger=none", "hardware=cpu"]), costs)
    cost = cell["rounds"] * cell["s_per_round"]
    factor, missing = 1.0, []
    for i, (k, v) in enumerate(sweep.items()):
        values = _values(k, v)
        if k == "seed" or len(values) < 2:
            continue
        variants = []
        for val in values:
            if val == values[0]:
                variants.append(cost)
                continue
            c = compose([*plain, *first[:i], f"{k}={val}", *first[i + 1 :], "logger=none", "hardware=cpu"])
            if all(OmegaConf.select(c, x) == OmegaConf.select(cfg, x) for x in COST_KEYS) and not k.startswith(
                ("experiment/", "+experiment/")
            ):
                variants.append(cost)  # nothing that changes the cost
                continue
            try:
                got = _cell(c, costs)
            except ConfigError as e:  # e.g. a dataset column whose data is not here: left out of the mean, named
                missing.append(f"{k}={val}: {e.allowed.split(';')[0][:80]}")
                continue
            variants.append(got["rounds"] * got["s_per_round"])
        factor *= float(np.mean(variants)) / cost if cost else 1.0
    out = {
        "runs": runs,
        "rounds": cell["rounds"],
        "s_per_round": float(f"{cell['s_per_round']:.4g}"),
        "seconds": float(f"{runs * cost * factor:.4g}"),
    }
    return {**out, "not_measured": missing} if missing else out


def estimate_line(got: dict) -> str:
    """``12 runs x 50 rounds x 20 s = 3.3 h`` and what the number counts."""
    runs = f"{got['runs']} runs x " if got["runs"] > 1 else ""
    return (
        f"estimated {hours(got['seconds'])} here: {runs}{got['rounds']} rounds x {got['s_per_round']:.3g} s per round "
        "on one CPU thread (FedAvg-equivalent local training and evaluation only, so a lower bound: "
        "fedbench/report/runtime.py)"
        + (f"; not measured: {'; '.join(got['not_measured'])}" if got.get("not_measured") else "")
    )


def write_estimates(entries: list[dict], conf_dir: Path, data_root: str | None, log=print) -> Path:
    """Measure ``entries`` at both scales and write them into ``conf/runtimes.yaml``; the other tables' stored estimates
    are kept (``fedbench-tables --estimate fedrema`` re-measures FedReMa's only), and so are those of tables whose data
    is absent here."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ..errors import ConfigError

    extra = [f"data_root={data_root}"] if data_root else []
    costs, tables = {}, dict(load(conf_dir))
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
                    tables.setdefault(e["name"], {})[scale] = got
                    log(
                        f"{e['name']} ({scale}): {got['runs']} runs x {got['rounds']} rounds x "
                        f"{got['s_per_round']:.3g} s = {hours(got['seconds'])}"
                    )
    GlobalHydra.instance().clear()
    header = (
        "# Estimated time of each paper table's sweep on one CPU thread of the machine named below, written by\n"
        "# `fedbench-tables --estimate` (fedbench/report/runtime.py says how; lower bounds: FedAvg-equivalent\n"
        "# local training and evaluation only). cpu = the table's reduced command, paper = the config as it is.\n"
        "# claims, gpu, plan: `fedbench-claims plan --measure` (docs/paper_scale.md): the claims experiments'\n"
        "# estimates, the measured GPU seconds per round (device, date, source of each), what counts as CPU-sized.\n"
    )
    body = {
        "machine": f"{platform.machine()}, {platform.processor() or platform.system()}, 1 thread",
        "measured": datetime.date.today().isoformat(),
        "per_sample_cpu_seconds": {
            **_stored_costs(conf_dir),
            **{
                f"{m}@{'x'.join(map(str, s))},{c} classes,B={b}": [float(f"{t:.3g}"), float(f"{v:.3g}")]
                for (m, s, c, b), (t, v) in sorted(costs.items())
            },
        },
        "tables": dict(sorted(tables.items())),
        **{k: v for k, v in _stored(conf_dir).items() if k in ("claims", "gpu", "plan")},  # fedbench-claims plan's
    }
    path = runtimes_file(conf_dir)
    path.write_text(header + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=120))
    return path


__all__ = [
    "claims_estimates",
    "estimate",
    "gpu_figures",
    "gpu_scaled",
    "hours",
    "load",
    "plan_settings",
    "runtimes_file",
    "stored_costs",
    "update",
    "write_estimates",
]
