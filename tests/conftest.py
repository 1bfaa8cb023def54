"""Shared test helpers: compose real Hydra configs and run real (tiny) federations."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from fedbench.hydra_cache import install

install()  # as the fedbench command does: each config file parsed once per process

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"

# Tiny, fast, offline defaults for every test run (the embedded digits data, files only).
# logger.pictures=false: no run PNGs (a run's results are the same, tests/test_plots.py; the tests of pictures ask)
FAST = ["logger=none", "logger.pictures=false", "hardware=cpu", "rounds=3", "clients=5", "local_epochs=1"]

# One thread: the test models are tiny (thread sync costs more than it gains) and a busy machine's shared
# cores make OpenMP's spin-waits very slow. Subprocesses (CLI tests) inherit OMP_NUM_THREADS.
THREADS = os.environ.get("FEDBENCH_TEST_THREADS", "1")
os.environ["OMP_NUM_THREADS"] = THREADS
torch.set_num_threads(int(THREADS))
os.environ.setdefault("WANDB_SILENT", "true")
os.environ["WANDB_MODE"] = "offline"  # safety net: no test may reach the network


# `make test-fast` (FEDBENCH_TEST_FAST=1, -m "not slow"): the unit tests only. A test that starts a subprocess (the
# CLI, torchrun, a launcher), a run (Run.execute past its config check: run_cfg, a sweep, a resume) or torch.compile is
# skipped the moment it does, so the selection needs no list and follows the tests as they change; a test slow in
# another way is marked @pytest.mark.slow. `make test` runs everything.
FAST_ONLY = os.environ.get("FEDBENCH_TEST_FAST") == "1"


@pytest.fixture(scope="session", autouse=True)
def unit_tests_only():
    """Under ``FEDBENCH_TEST_FAST=1``: skip a test at its first subprocess or process, run or compiled program."""
    if not FAST_ONLY:
        yield
        return
    import multiprocessing.process
    import subprocess

    from fedbench.run import Run

    def skip(why: str):
        def refuse(*args, **kwargs):
            pytest.skip(f"make test-fast: {why} (make test runs it)")

        return refuse

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "_execute_child", skip("starts a subprocess"))
        mp.setattr(multiprocessing.process.BaseProcess, "start", skip("starts a process"))
        mp.setattr(Run, "_lead", skip("runs a federation"))  # (a bad config is still refused before, by execute)
        mp.setattr(torch, "compile", skip("compiles with torch.compile"))  # seconds to minutes per program
        yield


def make_cfg(*overrides: str, fast: bool = True, cache_dir: str | Path | None = None):
    """Compose ``conf/config.yaml`` with Hydra's compose API (plus the fast test defaults)."""
    GlobalHydra.instance().clear()
    extra = [f"cache_dir={cache_dir}"] if cache_dir else []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[*(FAST if fast else []), *extra, *overrides])
    GlobalHydra.instance().clear()
    return cfg


def metrics_by_round(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl merged by round: a round may log several rows (its metrics, then a picture such as the last
    round's client_spread.png)."""
    rows: dict[int, dict] = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.setdefault(r["round"], {}).update(r)
    return rows


def fedbench_main(args: list[str]) -> None:
    """The ``fedbench`` entry point in this process (``-m`` sweeps included), as the console script runs it."""
    import sys

    from fedbench import cli

    argv, sys.argv = sys.argv, ["fedbench", *args]
    try:
        cli.main()
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()


def build_context(cfg, out_dir: Path):
    """What build.setup makes before the algorithm, from the same helpers but without a Run (CPU, fp64): the
    :class:`~fedbench.context.Context` an algorithm, the evaluator and the monitors are built from."""
    from fedbench import build, seeding
    from fedbench.context import Context
    from fedbench.engine.augment import build_augment

    cpu = torch.device("cpu")
    data = build.federated_data(cfg, cpu, torch.float64)
    seeding.seed_everything(cfg.seed, "init")
    executor, fm = build.model(cfg, data, cpu, torch.float64)
    return Context(cfg, data, fm, executor, fm.init_state(torch.float64, cpu), build_augment(cfg.dataset), out_dir)


def run_cfg(cfg, run_dir: Path) -> dict:
    """Execute one run in ``run_dir``; returns its summary."""
    from fedbench.run import Run

    return Run(cfg, run_dir).execute()


def shared_data_dir() -> Path | None:
    """``FEDBENCH_DATA`` or ``<repo>/../shared/data`` if it exists (real CIFAR-10 / MNIST)."""
    env = os.environ.get("FEDBENCH_DATA")
    for p in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if p.exists():
            return p
    return None


@pytest.fixture
def shared_data():
    d = shared_data_dir()
    if d is None:
        pytest.skip("real datasets not present (set FEDBENCH_DATA or provide ../shared/data)")
    return d


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fedbench-cache")
