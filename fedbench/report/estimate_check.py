"""The estimate checked against measured runs (docs/estimates.md, ``scripts/estimate_error.py``): which recorded runs
are checked (:func:`checked_setting`), the estimate of each of their settings, what they measured, and the error
table."""

from __future__ import annotations

import numpy as np

from .job_cost import _cell, _sig

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
