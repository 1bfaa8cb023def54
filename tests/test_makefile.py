"""The Makefile's torch switch (issue #53 item 8): ``make demo`` installs PyPI's torch (CI's, unchanged); ``make demo
TORCH=cpu`` installs the CPU-only wheels first from ``TORCH_CPU_INDEX`` — and when that index cannot be reached it
stops within seconds with one line saying so, before a venv is made (it is never reachable in CI: the test points it
at a closed local port). A value other than pypi or cpu is refused naming it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
from conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
CLOSED = "http://127.0.0.1:9/whl/cpu"  # the discard port: nothing listens, the connection is refused at once


def _make(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["make", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_the_default_install_is_pypis_torch_and_cpu_adds_the_cpu_index_first(tmp_path):
    venv = f"VENV={tmp_path / 'venv'}"
    default = _make("-n", "demo", venv)
    assert default.returncode == 0 and "download.pytorch.org" not in default.stdout
    assert '-e ".[test]"' in default.stdout
    cpu = _make("-n", "demo", venv, "TORCH=cpu").stdout.splitlines()
    first = next(i for i, line in enumerate(cpu) if "--index-url https://download.pytorch.org/whl/cpu" in line)
    assert "torch torchvision" in cpu[first] and first < next(i for i, line in enumerate(cpu) if '-e ".[test]"' in line)
    assert any("urlopen" in line for line in cpu[:first])  # the index is tried before anything is installed


def test_an_unreachable_cpu_index_stops_at_once_saying_so(tmp_path):
    venv = tmp_path / "venv"
    tic = time.perf_counter()
    p = _make("demo", f"VENV={venv}", f"PY={sys.executable}", "TORCH=cpu", f"TORCH_CPU_INDEX={CLOSED}")
    took = time.perf_counter() - tic
    assert p.returncode == 2 and took < 30, (p.returncode, took, p.stderr[-2000:])
    said = [line for line in p.stderr.splitlines() if line.startswith("make: TORCH=cpu")]
    assert said == [
        f"make: TORCH=cpu — {CLOSED} cannot be reached from here (10 s); use the default (make demo: PyPI's torch) "
        "or install torch from a reachable index first"
    ]
    assert not venv.exists()  # nothing made


def test_another_torch_value_is_refused_naming_it():
    p = _make("-n", "demo", "TORCH=gpu")
    assert p.returncode == 2 and "TORCH=gpu — pypi (the default: PyPI's torch) or cpu" in p.stderr
