"""Compare runs at equal rounds — for unfinished runs or runs of unequal length (e.g. a paper-scale run still going).

    python scripts/equal_rounds.py LABEL=RUN_DIR [LABEL=RUN_DIR ...] --metric pers/acc --out PREFIX

Reads each run's ``metrics.jsonl`` (a round logged twice, e.g. across a resume, counts once: its last line), keeps the
rounds every run has, and writes ``PREFIX.csv`` (round, one column per run) and ``PREFIX.png`` (the curves), then
prints, at the last common round T: each run's value at T, its best up to T and the round of that best.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path


def rounds(run_dir: Path, metric: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            continue
        if metric in row:
            out[int(row["round"])] = float(row[metric])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
    ap.add_argument("--metric", default="pers/acc")
    ap.add_argument("--out", required=True, help="output prefix (PREFIX.csv, PREFIX.png)")
    a = ap.parse_args(argv)
    series = {}
    for spec in a.runs:
        label, _, path = spec.partition("=")
        series[label] = rounds(Path(path), a.metric)
    common = sorted(set.intersection(*(set(s) for s in series.values())))
    if not common:
        raise SystemExit(f"equal_rounds: the runs share no round with {a.metric}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", *series])
        for t in common:
            w.writerow([t, *(f"{s[t]:.6f}" for s in series.values())])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=150)
    for label, s in series.items():
        ax.plot(common, [s[t] for t in common], label=label, lw=1)
    ax.set_xlabel("round")
    ax.set_ylabel(a.metric)
    tail = [s[t] for s in series.values() for t in common[len(common) // 10 :]]  # zoom on the last 90 % of rounds
    ax.set_ylim(max(0.0, min(tail) - 0.01), max(tail) + 0.005)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"))
    T = common[-1]
    print(f"last common round: {T}")
    for label, s in series.items():
        best_t = max(common, key=lambda t: (s[t], -t))
        print(
            f"  {label}: at round {T} {s[T]:.4f}; best up to {T}: {s[best_t]:.4f} (round {best_t}); "
            f"logged rounds: {min(s)}..{max(s)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
