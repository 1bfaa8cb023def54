#!/usr/bin/env python
"""Methods side by side from a multirun: a Markdown table, method x (best, final) of one metric,
mean ± std over seeds (percent). Reads only each run's summary.json, .hydra/config.yaml (seed, table
labels) and .hydra/hydra.yaml (the chosen algorithm). A stop-gap until the full report tool exists.

    python scripts/compare.py outputs/multirun/<date>/<time> [--metric global/acc]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml


def collect(root: Path, metric: str) -> tuple[dict, dict]:
    """{algorithm: {"best": [...], "final": [...], "seeds": [...]}} in sweep order, and the table labels."""
    rows: dict = defaultdict(lambda: {"best": [], "final": [], "seeds": []})
    labels: dict = {}
    runs = []
    for d in (p.parent for p in root.glob("*/summary.json")):
        hydra = yaml.safe_load((d / ".hydra" / "hydra.yaml").read_text())["hydra"]
        runs.append((int(hydra["job"].get("num") or 0), hydra["runtime"]["choices"]["algorithm"], d))
    for _, algo, d in sorted(runs):                     # sweep order
        summary = json.loads((d / "summary.json").read_text())
        if summary.get("status") != "complete" or metric not in summary.get("metrics", {}):
            continue
        cfg = yaml.safe_load((d / ".hydra" / "config.yaml").read_text())
        labels.update((cfg.get("table") or {}).get("labels") or {})
        m = summary["metrics"][metric]
        rows[algo]["best"].append(m["best"])
        rows[algo]["final"].append(m["final"])
        rows[algo]["seeds"].append(cfg.get("seed"))
    return dict(rows), labels


def cell(values: list[float]) -> str:
    v = 100 * np.asarray(values)
    return f"{v.mean():.2f} ± {v.std():.2f}" if len(v) > 1 else f"{v.mean():.2f}"


def table(rows: dict, labels: dict, metric: str) -> str:
    lines = [f"| Method | seeds | {metric} best (%) | {metric} final (%) |", "|---|---|---|---|"]
    for algo, r in rows.items():
        lines.append(f"| {labels.get(algo, algo)} | {len(r['seeds'])} | {cell(r['best'])} | {cell(r['final'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("multirun_dir", type=Path)
    ap.add_argument("--metric", default="global/acc", help="a summary.json metric (default: global/acc)")
    args = ap.parse_args(argv)
    rows, labels = collect(args.multirun_dir, args.metric)
    if not rows:
        print(f"no complete runs with {args.metric} under {args.multirun_dir}", file=sys.stderr)
        return 1
    print(table(rows, labels, args.metric))
    return 0


if __name__ == "__main__":
    sys.exit(main())
