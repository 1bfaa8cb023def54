"""Run dir names over the length limit (fedbench.config.dirname, issue #53 item 4): cut between ``key=value`` items,
never inside a value, the number of items left out said, a hash of the whole; a run made under the old name (cut at
100 characters) keeps it, so the same command still resumes or skips it. Through the real Hydra compose API."""

from __future__ import annotations

import hashlib

from conftest import REPO
from hydra import compose, initialize_config_dir

from fedbench.config import dirname

# the case: the 100th character falls inside the value 100 of samples_per_client
LONG = [  # in Hydra's order (override_dirname sorts them)
    "algorithm=fedrema",
    "clients=10",
    "dataset=cifar10",
    "lr=0.015",
    "model=tiny_cnn",
    "partition.samples_per_client=100",
    "partition=dominant_groups",
]


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def test_a_long_name_is_cut_between_keys_never_inside_a_value():
    text = ",".join(LONG)
    assert text[:100].endswith("samples_per_client=10")  # the old name: this, then the hash (read as 10, not 100)
    assert (
        dirname(text) == f"algorithm=fedrema,clients=10,dataset=cifar10,lr=0.015,model=tiny_cnn,+2_more-{_digest(text)}"
    )
    # commas inside a sweep's value list (a multirun's own name) are not between keys: 'local,fedavg' stays whole
    sweep = "algorithm=local,fedavg," + ",".join(f"k{i}=v{i}" for i in range(30))
    name = dirname(sweep)
    assert name.startswith("algorithm=local,fedavg,k0=v0,") and name.endswith(f"_more-{_digest(sweep)}")
    assert name.split(",+")[0] == sweep[: len(name.split(",+")[0])] and len(name.split(",+")[0]) <= 100
    assert name.split(",+")[1].startswith(f"{30 - name.split(',+')[0].count('=') + 1}_more-")
    # a first item longer than the limit keeps nothing of it
    one = "model.hidden=" + "9" * 130
    assert dirname(one) == f"+1_more-{_digest(one)}"
    assert dirname("rounds=3,seed=1") == "rounds=3,seed=1"  # short names as before


def _dirs(overrides: list[str], sweep_dir: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", [*overrides, f"hydra.sweep.dir={sweep_dir}"], return_hydra_config=True)
        return cfg.hydra.run.dir, cfg.hydra.sweep.subdir


def test_a_run_made_under_the_old_cut_name_keeps_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = ",".join(LONG)
    old, new = f"{text[:100]}-{_digest(text)}", dirname(text)
    assert _dirs(LONG, str(tmp_path / "sweep")) == (f"outputs/runs/{new}", new)
    (tmp_path / "outputs" / "runs" / old).mkdir(parents=True)
    (tmp_path / "sweep" / old).mkdir(parents=True)
    assert _dirs(LONG, str(tmp_path / "sweep")) == (f"outputs/runs/{old}", old)
    (tmp_path / "sweep" / new).mkdir()  # once the new name exists it is the run's
    assert _dirs(LONG, str(tmp_path / "sweep"))[1] == new


def test_a_long_sweeps_own_dir_is_cut_between_keys_and_an_old_one_kept(tmp_path, monkeypatch):
    """The multirun dir the `fedbench` command names after its command line (cli.sweep_dir) follows the same rule,
    and a sweep launched before it under the old cut name is found again (its complete jobs skipped)."""
    from fedbench.cli import sweep_dir

    monkeypatch.chdir(tmp_path)
    text = ",".join(LONG)
    old, new = f"{text[:100]}-{_digest(text)}", dirname(text)
    assert sweep_dir(["-m", *LONG]) == f"outputs/multirun/{new}"
    (tmp_path / "outputs" / "multirun" / old).mkdir(parents=True)
    assert sweep_dir(["-m", *LONG]) == f"outputs/multirun/{old}"
