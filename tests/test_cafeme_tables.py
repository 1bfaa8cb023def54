"""CAFeMe's table configs: Table 1 = one sweep over its four columns with the code's settings per column, its Ditto
row = the code's Ditto (never FedAvg-FT's numbers), RMNIST's rotation chunks per run seed, and the report's layout
(the paper's four columns, Fig. 4's panels from the same runs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from conftest import make_cfg
from omegaconf import OmegaConf

from fedbench.report import Report, group_tables
from fedbench.report.runs import RunRecord
from fedbench.run import Run

REPO = Path(__file__).resolve().parent.parent
EXP = REPO / "conf" / "experiment" / "cafeme"
COLUMN = "experiment/cafeme/column@_global_"
TABLE1 = yaml.safe_load((EXP / "table1.yaml").read_text())
SWEEP = TABLE1["hydra"]["sweeper"]["params"]

# the code's arguments.py per dataset: B, lr_ft, lr_ft_pfl, IFCA clusters (spec cafeme.md §4)
CODE = {"cifar10": (50, 0.01, 0.05, 3), "rmnist": (30, 0.001, 0.01, 4)}
PAPER_COLUMNS = ["CIFAR-10 Shards", "CIFAR-10 Dirichlet", "RMNIST Shards", "RMNIST Dirichlet"]


def _cell(column: str, algorithm: str = "cafeme", *extra: str):
    return make_cfg("+experiment=cafeme/table1", f"{COLUMN}={column}", f"algorithm={algorithm}", *extra, fast=False)


def test_table1_is_one_sweep_over_the_four_columns_with_the_codes_settings():
    """One command: algorithms x the four columns x 5 seeds; every composed cell has the code's values for its
    dataset and partition (100 clients, 5 per round, 1000 rounds, 20 new clients, 50 steps; B / lr_ft / lr_ft_pfl /
    IFCA clusters per dataset; shards 200 x 2, Dirichlet α = 0.3) and the column label the report shows."""
    columns = SWEEP[COLUMN].split(",")
    assert sorted(columns) == sorted(f"{d}_{p}" for d in ("cifar10", "rmnist") for p in ("shards", "dirichlet"))
    assert SWEEP["seed"] == "0,1,2,3,4"
    assert set(SWEEP["algorithm"].split(",")) == {
        "fedavg",
        "fedavg_ft",
        "ifca",
        "ifca_ft",
        "ditto_caf",
        "fedrep_caf",
        "perfedavg_caf",
        "cafeme",
    }
    labels = []
    for col in columns:
        data, part = col.split("_")
        c = _cell(col, "ifca")
        B, lr_ft, lr_pfl, clusters = CODE[data]
        assert (
            c.dataset.name,
            c.partition.name,
            c.batch_size,
            c.eval.new_clients.lr,
            c.eval.new_clients.lr_pfl,
            c.algorithm.clusters,
        ) == (data, part, B, lr_ft, lr_pfl, clusters)
        assert (c.clients, c.participation, c.rounds, c.eval.new_clients.fraction, c.eval.new_clients.steps) == (
            100,
            0.05,
            1000,
            0.2,
            50,
        )
        assert (c.local_epochs, c.lr, c.optim.name, c.optim.momentum, c.drop_last, c.dataset.normalize) == (
            5,
            0.001,
            "sgd",
            0.0,
            True,
            None,
        )
        assert c.model.channels == ([64, 64, 64] if data == "cifar10" else [32, 64])
        if part == "shards":
            assert (c.partition.num_shards, c.partition.shards_per_client) == (200, 2)
        else:
            assert (c.partition.alpha, c.partition.min_size) == (0.3, 10)
        assert (c.partition.test_split, c.partition.test_fraction) == ("local", 0.2)
        labels.append(c.cafeme_column)
    assert sorted(labels) == sorted(PAPER_COLUMNS)
    assert set(TABLE1["table"]["reference"]["ditto_caf"]) == set(PAPER_COLUMNS)


def test_the_ditto_row_is_the_codes_ditto_and_cannot_coincide_with_fedavg_ft(tmp_path):
    """Ditto's new clients fine-tune its global model, as FedAvg-FT's do; with Ditto's global copy trained by
    FedAvg's solver the two rows were the same numbers. The table's Ditto row is the code's Ditto (5 Adam steps,
    μ = 0.1, unweighted mean), so after the same round on the same data its global model and its new clients'
    curves differ from FedAvg-FT's (tiny digits version of the table's cell)."""
    row = next(a for a, name in TABLE1["table"]["labels"].items() if name == "Ditto")
    assert row in SWEEP["algorithm"].split(",") and row != "ditto"
    tiny = [
        "dataset=digits",
        "partition.num_shards=null",
        "clients=10",
        "participation=0.3",
        "rounds=1",
        "model.channels=[4,8]",
        "model.hidden=[16,16]",
        "eval.new_clients.steps=3",
        "batch_size=8",
        "logger=none",
        "hardware=cpu",
        "hardware.precision=fp64",
        "local_epochs=1",
    ]
    out = {}
    for algo in (row, "fedavg_ft"):
        cfg = _cell("cifar10_shards", algo, *tiny)
        assert cfg.algorithm.name == ("ditto" if algo == row else "fedavg_ft")
        run = Run(cfg, tmp_path / algo)
        out[algo] = (run.execute(), run.algorithm.w)
    assert out[row][0]["newclients/client_curves"] != out["fedavg_ft"][0]["newclients/client_curves"]
    gap = max((out[row][1][n] - out["fedavg_ft"][1][n]).abs().max().item() for n in out[row][1])
    assert gap > 1e-4


def test_table2_runs_table1s_baselines_with_femnists_budget(tmp_path):
    """Table 2 (FEMNIST) runs the same eight methods as Table 1 — the code's Ditto / FedRep / Per-FedAvg
    (ditto_caf, fedrep_caf, perfedavg_caf), not the original papers' ones — with FEMNIST's S = 8 and lr_in = 0.01
    landing in each one's keys, and these three arms pass their algorithm's setup (plain `fedrep` with Table 2's
    head_steps stopped there: its budget is given in epochs)."""
    table2 = yaml.safe_load((EXP / "table2.yaml").read_text())
    arms = table2["hydra"]["sweeper"]["params"]["algorithm"].split(",")
    assert arms == SWEEP["algorithm"].split(",")
    assert set(table2["table"]["labels"]) == set(table2["table"]["reference"]) == set(arms)
    tiny = [
        "dataset=digits",
        "partition=iid",
        "clients=10",
        "model.channels=[4,8]",
        "model.hidden=[16]",
        "model.padding=2",
        "logger=none",
        "hardware=cpu",
    ]
    for algo in ("ditto_caf", "fedrep_caf", "perfedavg_caf"):
        cfg = make_cfg("+experiment=cafeme/table2", f"algorithm={algo}", *tiny, fast=False)
        a = cfg.algorithm
        if algo == "fedrep_caf":
            assert (a.head_steps, a.body_steps, a.head_epochs, a.optimizer, a.lr, a.aggregate) == (
                8,
                1,
                None,
                "adam",
                0.001,
                "all",
            )
        if algo == "perfedavg_caf":
            assert (a.alpha, a.beta, a.local_steps, a.variant) == (0.01, 0.001, 8, "hf")
        Run(cfg, tmp_path / algo).setup()


def test_figure3_bars_are_table1s_rmnist_setting_with_their_partition():
    """Figure 3 (RMNIST vs heterogeneity): every bar is Table 1's RMNIST cell (data, model, B, fine-tuning lrs, IFCA
    clusters, solver, rounds, clients) with only the partition changed — None = equal random parts, Dir α from
    1000 to 0.3 (FedLab hetero_dir, min 10), Shards = 200 x 2 — and the same eight methods as Table 1."""
    fig = yaml.safe_load((EXP / "figure3.yaml").read_text())
    sweep = fig["hydra"]["sweeper"]["params"]
    assert sweep["algorithm"] == SWEEP["algorithm"] and sweep["seed"] == SWEEP["seed"]
    bars = sweep["experiment/cafeme/heterogeneity@_global_"].split(",")
    assert bars[0] == "none" and bars[-1] == "shards"
    same = (
        "dataset",
        "model",
        "batch_size",
        "eval",
        "algorithm",
        "lr",
        "optim",
        "local_epochs",
        "clients",
        "participation",
        "rounds",
        "drop_last",
    )
    ref = OmegaConf.to_container(_cell("rmnist_shards", "ifca"))
    alphas = []
    for bar in bars:
        c = make_cfg(
            "+experiment=cafeme/figure3",
            f"experiment/cafeme/heterogeneity@_global_={bar}",
            "algorithm=ifca",
            fast=False,
        )
        raw = OmegaConf.to_container(c)
        assert {k: raw[k] for k in same} == {k: ref[k] for k in same}, bar
        p = c.partition
        assert (p.test_split, p.test_fraction) == ("local", 0.2)
        if bar == "none":
            assert (p.name, c.cafeme_heterogeneity) == ("iid", "None") and "num_shards" not in p
        elif bar == "shards":
            assert (p.name, p.num_shards, p.shards_per_client) == ("shards", 200, 2)
        else:
            assert (p.name, p.min_size, c.cafeme_heterogeneity) == ("dirichlet", 10, f"Dir {p.alpha}")
            alphas.append(p.alpha)
    assert alphas[0] == 1000 and alphas[-1] == 0.3 and alphas == sorted(alphas, reverse=True)


def test_rmnist_rotation_chunks_are_reshuffled_per_run_seed(tmp_path):
    """The code seeds NumPy with the run seed and then shuffles which images get which rotation: the table's RMNIST
    columns use dataset.split_seed = seed, so seeds 0 and 3 rotate different images (fake 60-image MNIST)."""
    from test_datasets import write_idx

    from fedbench.data.datasets import load_dataset

    write_idx(tmp_path, "MNIST", n_train=40, n_test=20)
    rot = {}
    for seed in (0, 3):
        c = _cell("rmnist_dirichlet", "fedavg", f"seed={seed}", f"data_root={tmp_path}")
        assert c.dataset.split_seed == seed
        rot[seed] = load_dataset(c.dataset, tmp_path / "cache").attrs["rotation"]
    assert not torch.equal(rot[0], rot[3])
    for r in rot.values():  # still 10 equal chunks per split
        assert torch.equal(torch.bincount(r[:40], minlength=10), torch.full((10,), 4))


def _record(algorithm: str, column: str, seed: int, acc: float, curve: list[float]) -> RunRecord:
    """A finished run of the Table 1 sweep as the report reads it (its table node is the real one)."""
    summary = {
        "metrics": {"newclients/acc": {"last": acc}},
        **{f"newclients/step{s}_acc": v for s, v in zip(range(0, 51, 5), curve)},
    }
    config = {"table": TABLE1["table"], "cafeme_column": column, "seed": seed, "algorithm": {"name": algorithm}}
    return RunRecord(None, "complete", config, {"algorithm": algorithm}, {}, summary=summary)


def test_report_prints_the_papers_layout_and_the_fig4_panels_from_the_same_runs():
    """Table 1: one row per method in the paper's order, the four columns in the paper's order, each cell the
    mean over seeds in %, next to the paper's number; Fig. 4: one table per column with the curve's points."""
    runs = []
    for j, col in enumerate(reversed(PAPER_COLUMNS)):  # sweep order differs from the paper's
        for i, algo in enumerate(("cafeme", "fedavg", "ditto_caf")):
            for seed in (0, 1):
                acc = 0.5 + 0.1 * i + 0.01 * j + 0.02 * seed
                runs.append(_record(algo, col, seed, acc, [acc - 0.05 * (10 - s) / 10 for s in range(11)]))
    tables = {t.id: t for t in group_tables(runs)}
    assert set(tables) == {"table1"} | {f"fig4_{c.replace(' ', '_')}" for c in PAPER_COLUMNS}
    rep = Report(tables["table1"])
    assert [c.header for c in rep.columns] == PAPER_COLUMNS
    assert [rep.row_names[r] for r in rep.row_keys] == [
        "FedAvg",
        "FedAvg-FT",
        "IFCA",
        "IFCA-FT",
        "Ditto",
        "FedRep",
        "Per-FedAvg",
        "CAFeMe",
    ]  # the paper's rows
    assert rep.cells[("fedrep_caf", "CIFAR-10 Shards")].text() == "not run"
    assert rep.header()[:4] == ["Method", "CIFAR-10 Shards", "paper", "Δ"]
    ditto = rep.cells[("ditto_caf", "RMNIST Shards")]  # i = 2, j = 1 (reversed order), seeds 0 and 1
    assert ditto.values == pytest.approx([71.0, 73.0]) and ditto.text() == "72.00 ± 1.00"
    assert rep.paper_text("ditto_caf", rep.columns[2]) == "90.44"
    fig = Report(tables["fig4_RMNIST_Dirichlet"])  # j = 0
    assert [c.header for c in fig.columns] == [str(s) for s in range(0, 51, 5)]
    assert fig.cells[("cafeme", "50")].mean == pytest.approx(51.0) and fig.cells[("cafeme", "0")].mean == pytest.approx(
        46.0
    )


def test_one_column_from_the_command_line(capsys):
    """`experiment/cafeme/column@_global_=<column>` picks one column (the CLI's pre-check knows nested groups): a
    known column passes the pre-check, an unknown one is one line naming the key, the value and the allowed columns."""
    from fedbench.cli import precheck

    precheck(["+experiment=cafeme/table1", f"{COLUMN}=rmnist_dirichlet", "logger=none"])  # no exit: accepted
    assert _cell("rmnist_dirichlet").cafeme_column == "RMNIST Dirichlet"
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        precheck(["+experiment=cafeme/table1", f"{COLUMN}=rmnist_iid", "logger=none"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1
    assert "experiment/cafeme/column='rmnist_iid'" in lines[0] and "rmnist_shards" in lines[0]
