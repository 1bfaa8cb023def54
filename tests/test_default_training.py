"""The defaults train (issue #20 item 1): the README's CIFAR-10 example and the plain digits run give finite, falling
losses; a real image dataset brings its own default lr (conf/dataset_defaults/), which never replaces the lr an
experiment config or the command line sets."""

from __future__ import annotations

import json
import math

import pytest
from conftest import make_cfg, run_cfg
from test_docs_commands import doc_commands, shell_words

from fedbench.run import Run


def _rounds(run_dir) -> dict:
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["round"], {}).update(row)
    return rows


def test_readme_cifar_example_trains(shared_data, tmp_path):
    """The README's CIFAR-10 command (shards, 20 clients of 2 classes), its first round with 3 of the 20 clients and
    one local epoch (to keep it cheap): before the CIFAR-10 default lr (0.05 with momentum 0.9) the README run ended
    round 1 with a non-finite loss (client 3), and this cut-down round did not learn either."""
    # the quick start's CIFAR-10 run (README also shows a tiny_cnn size-limited one, which this test is not about)
    [cmd] = [
        c
        for c in doc_commands()
        if c.source.startswith("README.md") and "dataset=cifar10" in c.text and "model=cnn " in c.text + " "
    ]
    _, *args = shell_words(cmd.text, shared_data)
    args = [a for a in args if not a.startswith(("rounds=", "dataset.root=", "data_root="))]
    cfg = make_cfg(
        *args,
        f"dataset.root={shared_data}",
        "rounds=1",
        "participation=0.15",
        "local_epochs=1",
        "eval.global_model=false",
        "logger=none",
        "hardware=cpu",
        fast=False,
    )
    assert cfg.dataset.name == "cifar10" and cfg.model.name == "cnn" and cfg.partition.name == "shards"
    run_cfg(cfg, tmp_path)  # raises Diverged on a non-finite loss
    loss = _rounds(tmp_path)[1]["train/loss"]
    # each client holds (about evenly) 2 classes: a model that learns nothing cannot beat ln 2, the loss of the best
    # constant guess; the epoch's mean loss (from ln 10 at the first step) must be below it
    assert math.isfinite(loss) and loss < math.log(2)


def test_default_digits_run_trains(tmp_path):
    """`fedbench` with nothing set (digits, MLP, FedAvg, lr 0.05): the loss falls round after round."""
    cfg = make_cfg("rounds=3", "logger=none", "hardware=cpu", fast=False)
    assert cfg.dataset.name == "digits" and cfg.lr == 0.05
    run_cfg(cfg, tmp_path)
    rows = _rounds(tmp_path)
    losses = [rows[t]["train/loss"] for t in (1, 2, 3)]
    assert all(map(math.isfinite, losses)) and losses[0] > losses[1] > losses[2]
    assert rows[3]["pers/acc"] > rows[0]["pers/acc"] + 0.3


@pytest.mark.parametrize(
    "dataset", ["cifar10", "cifar100", "tinyimagenet", "mnist", "fashionmnist", "rmnist", "femnist"]
)
def test_real_image_datasets_default_to_a_step_that_trains(dataset):
    """lr 0.05 with momentum 0.9 (a step of lr/(1-momentum) = 0.5) collapses conv nets on CIFAR-10 and MNIST (measured,
    conf/dataset_defaults/cifar10.yaml, mnist.yaml); the real image datasets default to lr 0.01 (step 0.1); the
    embedded digits keep 0.05; the command line still wins."""
    cfg = make_cfg(f"dataset={dataset}", "dataset.root=x", fast=False)
    assert cfg.lr == 0.01 and cfg.optim.lr == 0.01 and cfg.optim.momentum == 0.9
    assert make_cfg(f"dataset={dataset}", "dataset.root=x", "lr=0.2", fast=False).optim.lr == 0.2
    assert make_cfg("dataset=digits", fast=False).lr == 0.05


@pytest.mark.parametrize(
    "experiment,lr",
    [
        ("fedrema/table3", 0.01),
        ("fedka/table1", 0.01),
        ("ecl/table1", 0.1),
        ("fedcom/table1", 0.001),
        ("cafeme/table1", 0.001),
    ],
)
def test_experiment_configs_keep_their_own_lr(experiment, lr):
    """A paper table sets the paper's lr (FedReMa Table 3: 0.01, FedKA: 0.01, ECL: 0.1, FedCOM: 0.001, CAFeMe: the
    code's lr_outer 0.001) and the dataset's default never replaces it: composed after the table's own dataset choice,
    also when a column or the command line changes the dataset."""
    cfg = make_cfg(f"+experiment={experiment}", fast=False)
    assert cfg.lr == lr, (experiment, cfg.lr)
    assert make_cfg(f"+experiment={experiment}", "dataset=mnist", fast=False).lr == lr


def test_divergence_message_names_round_clients_run_dir_and_what_to_try(tmp_path):
    """A run made to blow up (lr 1e4) stops in round 1 with the round, the client(s), the run dir and what to try."""
    from fedbench.errors import Diverged

    cfg = make_cfg("lr=10000", "rounds=2")
    with pytest.raises(Diverged) as e:
        Run(cfg, tmp_path).execute()
    msg = str(e.value)
    assert "round 1" in msg and "client(s) [" in msg and str(tmp_path) in msg and "lower lr (now 10000" in msg
