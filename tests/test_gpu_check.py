"""scripts/gpu_check.sh (make gpu-check) on a machine without a GPU, and its checks' code on the CPU (--quick)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script runs its full checks (minutes)")
def test_without_a_gpu_it_says_so_and_skips_the_cuda_checks(tmp_path):
    report = tmp_path / "report.txt"
    p = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(report)], capture_output=True, text=True,
                       timeout=600, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stdout + p.stderr
    text = report.read_text()
    assert "== 1. device and numerics flags" in text and f"torch {torch.__version__}" in text
    assert "no GPU on this machine (torch.cuda.is_available() is False): skipping the CUDA checks (sections 2-6)" in text
    assert text == p.stdout   # everything printed is in the one report file


def _check(*args) -> str:
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), *args], capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_the_checks_run_on_the_cpu():
    """The code the first GPU will run, on tiny CPU runs: the equality check, the sync counter, the memory report."""
    out = _check("equality", "--device", "cpu", "--quick")
    assert out.count("PASS  sequential == vectorized on cpu") == 2 and "FAIL" not in out   # fp64 and fp32
    out = _check("syncs", "--device", "cpu")
    assert "PASS  host reads inside the vectorized step loop (fedbench's counter): count 0 (allowed 0)" in out
    out = _check("memory", "--device", "cpu", "--quick")
    assert out.count("peak allocated") == 2
