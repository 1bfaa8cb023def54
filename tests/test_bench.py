"""scripts/bench.py runs end to end (a smoke run on synthetic data; speed itself is never asserted)."""
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench.py"


def test_bench_prints_rounds_fractions_and_ratio():
    out = subprocess.run([sys.executable, str(SCRIPT), "--synthetic", "--rounds", "1", "--epochs", "1", "--clients", "5",
                          "--no-clean", "--executors", "sequential,vectorized"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    peak = float(re.search(r"fp32 matmul peak: ([\d.]+) GFLOP/s", out).group(1))
    assert peak > 0
    for ex in ("sequential", "vectorized"):
        m = re.search(rf"{ex}: ([\d.]+) s/round .*?, (\d+) sample-gradients/s, .*fraction of FLOP bound ([\d.]+)", out)
        assert m, out
        seconds, samples_per_s, fraction = float(m.group(1)), int(m.group(2)), float(m.group(3))
        assert seconds > 0 and samples_per_s > 0 and 0 < fraction < 2, out
    ratio = float(re.search(r"vectorized/sequential time ratio: ([\d.]+)", out).group(1))
    assert ratio > 0
    assert "per round, against the peak measured right before and after it" in out
