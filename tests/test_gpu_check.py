"""scripts/gpu_check.sh (make gpu-check) on a machine without a GPU, and its checks' code on the CPU (--quick)."""

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script runs its full checks (minutes)")
def test_without_a_gpu_it_says_so_and_skips_the_cuda_checks(tmp_path):
    report = tmp_path / "report.txt"
    p = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), str(report)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    text = report.read_text()
    assert "== 1. device and numerics flags" in text and f"torch {torch.__version__}" in text
    assert (
        "no GPU on this machine (torch.cuda.is_available() is False): skipping the CUDA checks (sections 2-6)" in text
    )
    assert text == p.stdout  # everything printed is in the one report file


@pytest.fixture
def gpu_check(monkeypatch, tmp_path):
    """scripts/gpu_check.py imported in this process (its runs' folders under tmp_path)."""
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return module


def test_the_checks_run_on_the_cpu(gpu_check, capsys):
    """The code the first GPU will run, on tiny CPU runs (in-process; the script's own process is tested above):
    the equality check, the sync counter, the memory report."""

    def check(name, **kw) -> str:
        getattr(gpu_check, "cmd_" + name)(argparse.Namespace(**{"device": "cpu", "quick": True, "data": None, **kw}))
        assert gpu_check.FAILED == []
        return capsys.readouterr().out

    out = check("equality")
    assert out.count("PASS  sequential == vectorized on cpu") == 2 and "FAIL" not in out  # fp64 and fp32
    out = check("syncs")
    assert "PASS  host reads inside the vectorized step loop (fedbench's counter): count 0 (allowed 0)" in out
    out = check("memory")
    assert out.count("peak allocated") == 2
