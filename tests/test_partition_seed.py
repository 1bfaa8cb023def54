"""partition.seed: the seed of the data split (partition draw + per-client train/test split), apart from the training
seed — FedReMa's 5 runs per cell keep one split (its code generates the dataset once) and vary only the training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_cfg

from fedbench import seeding
from fedbench.data.datasets import load_dataset
from fedbench.data.partitions import make_partition
from fedbench.errors import ConfigError
from fedbench.run import Run

SPLIT = ("partition=dominant_groups", "partition.samples_per_client=60", "clients=6", "model=tiny_cnn")


def _setup(tmp_path, *overrides):
    run = Run(make_cfg(*SPLIT, *overrides), tmp_path)
    run.setup()
    return run


def _split(run):
    return [a.tolist() for a in run.data.train_idx], [a.tolist() for a in run.data.test_idx]


def test_default_partition_seed_is_the_run_seed_and_draws_the_same_split_as_before(tmp_path):
    """partition.seed = ${seed}: the split is bit-identical to the one drawn from ``rng(seed, "partition")``."""
    run = _setup(tmp_path, "seed=3")
    assert run.cfg.partition.seed == 3
    cfg = run.cfg
    ds = load_dataset(cfg.dataset, cache_dir=cfg.cache_dir)
    before = make_partition(
        cfg.partition, ds.y.numpy(), ds.n_train, ds.num_classes, int(cfg.clients), seeding.rng(3, "partition")
    )
    assert _split(run) == ([a.tolist() for a in before.train], [a.tolist() for a in before.test])
    assert _split(run) != _split(_setup(tmp_path / "s4", "seed=4"))  # and the run seed still moves it


def test_a_fixed_partition_seed_keeps_the_split_while_the_training_seed_changes(tmp_path):
    a = _setup(tmp_path / "a", "seed=0", "partition.seed=7")
    b = _setup(tmp_path / "b", "seed=1", "partition.seed=7")
    assert _split(a) == _split(b)
    assert np.array_equal(a.data.counts, b.data.counts)
    name = next(iter(a.initial_params))
    assert not torch.equal(a.initial_params[name], b.initial_params[name])  # the training seed still acts
    assert _split(a) != _split(_setup(tmp_path / "c", "seed=0", "partition.seed=8"))


def test_fedrema_tables_keep_one_split_across_their_seeds_and_other_tables_follow_the_seed():
    for exp in ("fedrema/table1", "fedrema/table2", "fedrema/table3", "fedrema/table4", "fedrema/table5"):
        assert make_cfg(f"+experiment={exp}", "seed=4", fast=False).partition.seed == 0, exp
    assert make_cfg("+experiment=ecl/table1", "seed=4", fast=False).partition.seed == 4


def test_bad_partition_seed_fails_before_training(tmp_path):
    with pytest.raises(ConfigError) as e:
        _setup(tmp_path, "partition.seed=-1")
    assert "partition.seed" in str(e.value)
