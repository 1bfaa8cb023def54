"""The stored runtimes, ``conf/runtimes.yaml``: read by section and rewritten one section at a time. It holds the
per-sample CPU costs the estimates are made from (job_cost.py measures them; keyed by :func:`cost_name`), each paper
table's estimate at both scales (``tables``, written by ``fedbench-tables --estimate``), and, for ``fedbench-claims
plan`` (fedbench/claims/plan.py, issue #51): ``claims`` — the estimate of each claims experiment at a scale
(``fedbench-claims plan --measure``), ``gpu`` — GPU seconds per round (training + evaluation) measured on a named
device, each with its date and the file it comes from, ``plan`` — what counts as CPU-sized, and ``checked`` — the
estimates checked against measured runs (estimate_check.py). A setting without a GPU figure is costed from a measured
one by the ratio of their CPU estimates (:func:`gpu_scaled`): samples x CPU seconds per sample, the estimator's
stand-in for FLOPs per sample x samples.
"""

from __future__ import annotations

from pathlib import Path

import yaml


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
    """The stored per-sample CPU costs as :func:`~.job_cost.cost_key` keys them: {(model, input shape, classes, batch):
    (train, eval)} (so that an estimate made from them is the same on every machine and in every process)."""
    out = {}
    for k, (t, v) in _stored_costs(conf_dir).items():
        model, rest = k.split("@", 1)
        shape, classes, batch = rest.split(",")
        out[(model, tuple(int(x) for x in shape.split("x")), int(classes.split()[0]), int(batch[2:]))] = (t, v)
    return out


def cost_name(key: tuple) -> str:
    """``cnn/545098@3x32x32,10 classes,B=128``: a per-sample cost's key as conf/runtimes.yaml writes it."""
    m, s, c, b = key
    return f"{m}@{'x'.join(map(str, s))},{c} classes,B={b}"


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


def stored_form(got: dict) -> dict:
    """An estimate as conf/runtimes.yaml keeps it: without the per-setting breakdown and the cost keys measured now."""
    return {k: v for k, v in got.items() if k not in ("settings", "measured_now")}
