"""scripts/equal_rounds.py: runs compared at the rounds they all have; a round logged twice (a resume) counts once
with its last value; a line cut by a kill is skipped; best-up-to-T is over the common rounds only."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "equal_rounds.py"


def _run(d: Path, rows: list[dict], torn: bool = False) -> Path:
    d.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (d / "metrics.jsonl").write_text(text + ('{"round": 9, "pers/a' if torn else ""))
    return d


def test_equal_rounds_csv_and_best_up_to_the_last_common_round(tmp_path):
    a = _run(
        tmp_path / "a", [{"round": t, "pers/acc": v} for t, v in [(0, 0.1), (1, 0.5), (2, 0.7), (3, 0.6), (4, 0.99)]]
    )
    b = _run(
        tmp_path / "b",
        [
            {"round": 0, "pers/acc": 0.2},
            {"round": 1, "pers/acc": 0.3},
            {"round": 2, "pers/acc": 0.4},
            {"round": 2, "pers/acc": 0.8},
            {"round": 3, "pers/acc": 0.65},
        ],
        torn=True,
    )
    p = subprocess.run(
        [sys.executable, str(SCRIPT), f"A={a}", f"B={b}", "--out", str(tmp_path / "o" / "cmp")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    rows = list(csv.reader((tmp_path / "o" / "cmp.csv").open()))
    assert rows == [
        ["round", "A", "B"],
        ["0", "0.100000", "0.200000"],
        ["1", "0.500000", "0.300000"],
        ["2", "0.700000", "0.800000"],
        ["3", "0.600000", "0.650000"],
    ]
    assert "last common round: 3" in p.stdout
    assert "A: at round 3 0.6000; best up to 3: 0.7000 (round 2)" in p.stdout  # A's 0.99 at round 4 is beyond T
    assert "B: at round 3 0.6500; best up to 3: 0.8000 (round 2)" in p.stdout  # the re-logged round 2 (0.8) counts
    assert (tmp_path / "o" / "cmp.png").stat().st_size > 1000
