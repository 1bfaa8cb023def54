"""Generic-FL baselines (FedProx, MOON, SCAFFOLD, FedDyn, FedNTD, FedLC, FedBN): every hyperparameter is
checked before training. Each method's mechanism, executor equivalence and a smoke run: tests/test_<method>.py."""

from __future__ import annotations

import pytest
from conftest import make_cfg

from fedbench.errors import ConfigError
from fedbench.run import Run


@pytest.mark.parametrize(
    "algo,key,bad",
    [
        ("fedprox", "mu", -1),
        ("moon", "tau", 0),
        ("moon", "mu", "a"),
        ("moon", "projection_dim", 0),
        ("pfedla", "hn_update", "descent"),
        ("scaffold", "server_lr", 0),
        ("scaffold", "weighted_average", "yes"),
        ("scaffold", "momentum_corrected_steps", 1),
        ("feddyn", "alpha", 0),
        ("feddyn", "adaptive_alpha", "no"),
        ("fedntd", "beta", -0.5),
        ("fedntd", "tau", 0),
        ("fedlc", "tau", -1),
        ("fedlc", "empty_count", 0),
    ],
)
def test_bad_hyperparameter_is_a_config_error_before_training(tmp_path, algo, key, bad):
    with pytest.raises(ConfigError) as e:
        Run(make_cfg(f"algorithm={algo}", f"algorithm.{key}={bad}"), tmp_path).setup()
    assert e.value.key == f"algorithm.{key}"
    assert not (tmp_path / "metrics.jsonl").exists()
