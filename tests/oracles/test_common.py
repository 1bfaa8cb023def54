"""The oracles' federation draws the same split as fedbench's run: from ``partition.seed`` (default ``${seed}``)."""

from __future__ import annotations

from fedbench.run import Run

from .common import Federation, config


def _split(train, test):
    return [list(map(int, a)) for a in train], [list(map(int, a)) for a in test]


def test_federation_draws_the_split_from_partition_seed_as_the_run(tmp_path):
    """partition.seed = 7 with seed = 0: the oracle's clients hold the run's samples, and these differ from the split
    of partition.seed = 0 (so drawing it from ``seed`` would not pass)."""
    run = Run(config("seed=0", "partition.seed=7"), tmp_path / "run")
    run.setup()
    fed = Federation(run.cfg)
    assert _split(fed.train, fed.test) == _split(run.data.train_idx, run.data.test_idx)
    other = Federation(config("seed=0"))
    assert _split(other.train, other.test) != _split(fed.train, fed.test)
