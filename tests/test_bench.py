"""scripts/bench.py runs end to end (smoke runs on synthetic data; speed itself is never asserted)."""

import json
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench.py"


def _bench(*args, tmp_path=None) -> str:
    tiny = [
        "--model",
        "mlp",
        "--shape",
        "1,8,8",
        "--test-per-class",
        "20",
        "--batch-size",
        "16",  # small and fast
        "--peak-size",
        "256",
    ]
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--synthetic", "--rounds", "1", "--epochs", "1", "--no-clean", *tiny, *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        cwd=tmp_path,
    ).stdout


def test_bench_prints_rounds_fractions_and_ratio():
    out = _bench("--clients", "5", "--executors", "sequential,vectorized")  # the equal-size workload
    peak = float(re.search(r"fp32 matmul peak: ([\d.]+) GFLOP/s", out).group(1))
    assert peak > 0
    for ex in ("sequential", "vectorized"):
        m = re.search(
            rf"equal {ex}: ([\d.]+) s/round .*?, (\d+) sample-gradients/s, .*fraction of FLOP bound ([\d.]+), "
            rf"peak memory (\d+) MiB",
            out,
        )
        assert m, out
        seconds, samples_per_s, fraction, mib = float(m.group(1)), int(m.group(2)), float(m.group(3)), int(m.group(4))
        # the fraction is printed to 2 decimals: on a machine loaded by other work it may print 0.00 (issue 36 item 5:
        # no test depends on the load); its unrounded value is checked in the JSON test below
        assert seconds > 0 and samples_per_s > 0 and 0 <= fraction < 2 and mib > 0, out
    ratio = float(re.search(r"equal: vectorized/sequential time ratio: ([\d.]+)", out).group(1))
    assert ratio > 0
    assert "per round, against the peak measured right before and after it" in out


def test_bench_uneven_workload_and_clients_sweep(tmp_path):
    """--workloads with a Dirichlet workload (ragged clients: one vectorized call per local step index) and a clients
    sweep, printed, plotted and written as JSON, for both executors."""
    out = _bench(
        "--clients",
        "4",
        "--workloads",
        "dir0.5",
        "--clients-sweep",
        "3,5",
        "--plot",
        "sweep.png",
        "--json",
        "all.json",
        tmp_path=tmp_path,
    )
    assert re.search(r"dir0.5: vectorized/sequential time ratio: [\d.]+", out), out
    m = re.search(r"dir0.5: client sizes (\d+)–(\d+), (\d+) client-steps/round; vectorized calls/round (\d+)", out)
    assert m and int(m.group(1)) < int(m.group(2)) and int(m.group(4)) < int(m.group(3)), out  # uneven sizes
    rows = re.findall(r"^\s+(\d+)\s+(sequential|vectorized)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(\d+)$", out, re.M)
    assert sorted((int(n), ex) for n, ex, *_ in rows) == [
        (3, "sequential"),
        (3, "vectorized"),
        (5, "sequential"),
        (5, "vectorized"),
    ], out
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "all.json").read_text())
    assert {(r["workload"], r["executor"], r["clients"]) for r in saved} >= {
        ("dir0.5", "vectorized", 4),
        ("equal", "sequential", 5),
    }
    assert all(r["peak_bytes"] > 0 and r["samples_per_s"] > 0 and r["flops_per_s"] > 0 for r in saved)


def test_bench_pfl_research_workload(tmp_path):
    """--workloads pfl_cifar10: pfl-research's benchmark shape (+experiment=peers/pfl_cifar10), synthetic here: the 50
    sampled clients of 1,000 take 5 steps of 50 images each per round (250 client-steps, 2,500 sample-gradients)."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--synthetic", "--workloads", "pfl_cifar10", "--rounds", "1", "--no-clean",
         "--executors", "sequential", "--test-per-class", "20", "--peak-size", "256", "--json", "pfl.json"],
        capture_output=True, text=True, timeout=900, check=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert re.search(r"pfl_cifar10 sequential: [\d.]+ s/round", out), out
    m = re.search(r"pfl_cifar10: client sizes (\d+)–(\d+), (\d+) client-steps/round", out)
    assert m and m.groups() == ("50", "50", "250"), out
    (r,) = json.loads((tmp_path / "pfl.json").read_text())
    assert r["clients"] == 50 and r["samples_per_s"] > 0


def test_bench_splits_a_run_over_processes():
    """--nproc 1,2: the same rounds in one process and over two (torchrun, gloo), and their time ratio."""
    out = _bench("--clients", "6", "--executors", "sequential", "--nproc", "1,2")
    assert re.search(r"equal sequential: [\d.]+ s/round", out), out
    assert re.search(r"equal sequential x2 processes: [\d.]+ s/round", out), out
    m = re.search(r"equal: sequential 2 processes / 1 time ratio: ([\d.]+) \(speed-up ([\d.]+)x\)", out)
    assert m and float(m.group(1)) > 0 and abs(float(m.group(1)) * float(m.group(2)) - 1) < 0.05, out
