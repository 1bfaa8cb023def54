"""`make test-fast` (FEDBENCH_TEST_FAST=1): the unit tests run, and a test is skipped the moment it starts a subprocess,
a run or torch.compile — while a bad config is still refused before any run (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

from conftest import REPO

TESTS = """
    import subprocess
    import sys

    import pytest
    import torch
    from conftest import make_cfg, run_cfg

    from fedbench.errors import ConfigError


    def test_a_unit():
        assert torch.arange(3).sum() == 3


    def test_a_bad_config_is_refused_before_the_run(tmp_path):
        with pytest.raises(ConfigError, match="participation"):
            run_cfg(make_cfg("participation=2"), tmp_path)


    def test_a_subprocess():
        subprocess.run([sys.executable, "-c", "pass"])
        raise AssertionError("ran on")


    def test_a_run(tmp_path):
        run_cfg(make_cfg("rounds=1"), tmp_path)
        raise AssertionError("ran on")


    def test_a_compile():
        torch.compile(torch.nn.Linear(2, 2))
        raise AssertionError("ran on")
"""


def test_make_test_fast_skips_a_test_at_its_first_subprocess_run_or_compile(tmp_path):
    (tmp_path / "test_kinds.py").write_text(textwrap.dedent(TESTS))
    env = {**os.environ, "FEDBENCH_TEST_FAST": "1", "PYTHONPATH": str(REPO / "tests")}
    args = ["-m", "pytest", "-q", "-rs", "-p", "conftest", "-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0"]
    p = subprocess.run(
        [sys.executable, *args, "--rootdir", str(tmp_path), "test_kinds.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0 and re.search(r"\b2 passed, 3 skipped\b", out), out[-3000:]
    for why in ("starts a subprocess", "runs a federation", "compiles with torch.compile"):
        assert f"make test-fast: {why}" in out, out[-3000:]
