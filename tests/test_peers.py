"""scripts/peers/pfl_cifar10.py: each side runs and reports per-round times and accuracies; the summary's arithmetic.
pfl-research itself is an optional extra (pip install -e ".[peers]"): its side runs where it is installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "peers" / "pfl_cifar10.py"
# a small federation of the benchmark's shape: 40 clients x 50 synthetic images, 2 sampled per round
TINY = ["dataset=synthetic", "dataset.shape=[3,32,32]", "dataset.train_per_class=200", "dataset.test_per_class=10",
        "clients=40"]  # fmt: skip


def _peers():
    spec = importlib.util.spec_from_file_location("peers_pfl_cifar10", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _side(side: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{side}.json"
    cmd = [sys.executable, str(SCRIPT), "--side", side, "--seed", "1", "--result", str(out), "--rounds", "3",
           "--eval-every", "2", "--threads", "1", *[f"--override={o}" for o in TINY]]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    return json.loads(out.read_text())


def test_fedbench_side_reports_rounds_evaluations_and_accuracy(tmp_path):
    """Training timed every round; evaluations after rounds 2 and 3 (eval_every, and the last) timed apart; accuracies
    there (and round 0's, which is not compared)."""
    r = _side("fedbench", tmp_path)
    assert sorted(map(int, r["train_s"])) == [1, 2, 3] and all(s > 0 for s in r["train_s"].values())
    assert sorted(map(int, r["eval_s"])) == [2, 3]
    assert {"2", "3"} <= set(r["acc"]) and all(0 <= a <= 1 for a in r["acc"].values())


NO_PFL = importlib.util.find_spec("pfl") is None


@pytest.mark.skipif(NO_PFL, reason='pfl-research not installed (pip install -e ".[peers]")')
def test_pfl_side_on_the_same_clients(tmp_path):
    r = _side("pfl", tmp_path)
    assert sorted(map(int, r["train_s"])) == [1, 2, 3] and sorted(map(int, r["eval_s"])) == [2, 3]
    assert all(0 <= a <= 1 for a in r["acc"].values())


def test_summary_leaves_out_the_warm_up_round_and_amortises_evaluation(capsys):
    """Medians over rounds 2.. (round 1 warms up); rounds/s = 1 / (train + eval / eval_every); the ratio and the
    paired accuracy difference as printed (hand values)."""
    peers = _peers()
    fb = {"train_s": {"1": 9.0, "2": 2.0, "3": 4.0, "4": 3.0}, "eval_s": {"2": 1.0, "4": 3.0}, "acc": {"4": 0.40}}
    pf = {"train_s": {"1": 1.0, "2": 6.0, "3": 6.0, "4": 6.0}, "eval_s": {"2": 8.0, "4": 8.0}, "acc": {"4": 0.37}}
    s = peers.summarize(fb, eval_every=2)
    assert s["train_s"] == 3.0 and s["eval_s"] == 2.0 and s["rounds_per_s"] == pytest.approx(1 / (3.0 + 2.0 / 2))
    args = type("A", (), {"eval_every": 2, "rounds": 4, "threads": 2, "device": "cpu", "executor": "auto",
                          "precision": "fp32"})()  # fmt: skip
    fb2 = {**fb, "acc": {"4": 0.42}, "machine": "m"}
    pf2 = {**pf, "acc": {"4": 0.38}}
    peers.report({"fedbench": {0: {**fb, "machine": "m"}, 1: fb2}, "pfl": {0: pf, 1: pf2}}, [0, 1], args)
    out = capsys.readouterr().out
    assert "training s/round: fedbench 3.000   pfl-research 6.000   fedbench faster by x2.00" in out
    # rounds/s: fedbench 1 / (3 + 1) = 0.25, pfl-research 1 / (6 + 4) = 0.1
    assert "rounds/s: fedbench 0.250   pfl-research 0.100   fedbench faster by x2.50" in out
    assert "paired difference +0.0350 (sd 0.0071)" in out  # differences 0.03 and 0.04


def test_pfllib_side_by_side_refuses_a_folder_that_is_no_pfllib_checkout(tmp_path):
    """scripts/peers/pfllib_equal.py needs a PFLlib checkout (not on PyPI; not here): one line naming the option and
    exit 2 before anything is built; and round 1 is warm-up, so --rounds 1 is refused the same way."""
    script = SCRIPT.parent / "pfllib_equal.py"
    p = subprocess.run([sys.executable, str(script), "--pfllib", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"--pfllib {str(tmp_path)!r} — not a PFLlib checkout" in p.stderr and not p.stdout
    (tmp_path / "system" / "flcore" / "clients").mkdir(parents=True)
    (tmp_path / "system" / "flcore" / "clients" / "clientavg.py").write_text("")
    p = subprocess.run(
        [sys.executable, str(script), "--pfllib", str(tmp_path), "--rounds", "1"], capture_output=True, text=True
    )
    assert p.returncode == 2 and "--rounds 1 — at least 2 (round 1 is warm-up)" in p.stderr, p.stderr
