"""W&B: a run's name (method, dataset, the overrides that vary, seed), tags (paper, table, algorithm, dataset) and job
type, read back from the real wandb library's offline files; names of paper-table jobs under Hydra's real config.
A run's and a sweep's W&B files (names, tags, job types, the sweep's table as a W&B Table): tests/test_cli.py
(test_three_round_cli_run_with_wandb_offline, test_two_by_two_multirun_shares_a_wandb_group)."""

from __future__ import annotations

import pytest
from conftest import CONF
from omegaconf import OmegaConf

from fedbench.loggers import SWEPT, run_name, swept_keys, wandb_tags


@pytest.fixture
def hydra_job():
    """A job's config as Hydra gives it to a run (HydraConfig set: overrides, choices, sweep params)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    def make(*overrides):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        return cfg

    yield make
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None


def test_a_table_job_is_named_by_what_its_sweep_varies(hydra_job, monkeypatch):
    cfg = hydra_job(
        "+experiment=fedrema/table3",
        "scale=0.1",
        "algorithm.delta=0.7",
        "seed=2",
        "logger=none",
        "logger.wandb.project=p",
        "hardware.threads=1",
    )
    monkeypatch.setenv(SWEPT, "")  # no sweep on the command line: the table's own (algorithm.delta, seed) varies
    assert run_name(cfg, sweep=True) == "fedrema cifar10 algorithm.delta=0.7 seed=2"
    assert wandb_tags(cfg) == ["paper:fedrema", "table:table3", "algorithm:fedrema", "dataset:cifar10"]
    assert wandb_tags(cfg, run=False) == ["paper:fedrema", "table:table3"]  # the sweep's own run (its table)
    monkeypatch.setenv(SWEPT, "scale")  # `-m ... scale=0.1,0.2`
    assert run_name(cfg, sweep=True) == "fedrema cifar10 scale=0.1 algorithm.delta=0.7 seed=2"
    # one run: every override given that changes results (not logger*, hardware.threads; the experiment is in the tags)
    assert run_name(cfg, sweep=False) == "fedrema cifar10 scale=0.1 algorithm.delta=0.7 seed=2"
    # a swept config group shows as its last name: the CAFeMe table's column
    monkeypatch.setenv(SWEPT, "")
    cfg = hydra_job(
        "+experiment=cafeme/table1",
        "algorithm=ifca",
        "experiment/cafeme/column@_global_=rmnist_shards",
        "seed=4",
        "eval.new_clients.steps=2",
    )
    assert run_name(cfg, sweep=True) == "ifca rmnist column=rmnist_shards seed=4"
    assert wandb_tags(cfg)[:2] == ["paper:cafeme", "table:table1"]


def test_swept_keys_are_the_configs_and_the_command_lines_sweeps():
    config = OmegaConf.create(
        {
            "hydra": {
                "sweeper": {
                    "params": {"+experiment/fedrema/setting@_global_": "mnist,cifar10", "algorithm": "fedavg,local"}
                },
                "overrides": {"task": ["seed=0,1", "rounds=2", "lr=range(1,3)"]},
            }
        }
    )
    assert swept_keys(config) == ["experiment/fedrema/setting@_global_", "algorithm", "seed", "lr"]
