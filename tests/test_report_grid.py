"""Best of a grid in the report (fedbench/report/grid.py): a tuned row's cell shows the runs of the grid value with the
best mean over seeds (FedKA §5.1 reports each baseline at its best μ / α / β), marked and explained; on hand-made run
dirs as fedbench writes them (tests/test_report.py's ``write_run``)."""

from __future__ import annotations

import csv

from test_report import write_run

from fedbench.report import Report, Table, collect, group_tables, report

TUNED = {
    "paper": "fedka",
    "id": "t1",
    "title": "grid test",
    "rows": "choice:algorithm",
    "cols": None,
    "metrics": {"Acc": "global/acc.last"},
    "percent": True,
    "tune": {"rows": {"fedprox": "algorithm.mu", "fedka": "algorithm.beta"}, "note": "FedKA §5.1"},
    "reference": {"fedprox": {"Acc": 55.5}},
}


def _run(root, algorithm, seed, acc, table, name, **config):
    d = write_run(root, algorithm, seed, table, [0.1, acc], **config)
    d.rename(root / name)


def test_best_of_grid_is_the_value_with_the_best_mean_over_seeds(tmp_path):
    """FedProx μ ∈ {0.01, 0.1, 1} x 2 seeds: μ = 0.1 has the best mean (0.55) although μ = 1 holds the best single run
    (0.60) and the worst mean; the cell shows μ = 0.1's two runs, marked; FedAvg (not tuned) shows its runs as they are.
    A failed run does not count in its value's mean; a value whose runs all failed cannot be chosen."""
    root = tmp_path / "sweep"
    accs = {0.01: (0.50, 0.52), 0.1: (0.54, 0.56), 1: (0.60, 0.30)}
    for mu, pair in accs.items():
        for seed, acc in enumerate(pair):
            _run(root, "fedprox", seed, acc, TUNED, f"fedprox_mu{mu}_s{seed}", mu=mu)
    _run(root, "fedprox", 2, 0.99, TUNED, "fedprox_mu5_s2", mu=5)  # a grid value with no complete run ...
    (root / "fedprox_mu5_s2" / "summary.json").unlink()
    (root / "fedprox_mu5_s2" / "status.json").write_text('{"status": "failed", "error": "RunFailed: x"}')
    for seed, acc in enumerate((0.40, 0.42)):
        _run(root, "fedavg", seed, acc, TUNED, f"fedavg_s{seed}")
    [table] = group_tables(collect([root]))
    rep = Report(table)
    col = rep.columns[0]
    cell, choice = rep.cells[("fedprox", "Acc")], rep.grid("fedprox", col)
    assert choice.key == "algorithm.mu" and choice.chosen == "0.1"
    assert sorted(round(v, 9) for v in cell.values) == [54.0, 56.0] and sorted(cell.seeds) == [0, 1]
    assert choice.scores["0.01"] == 0.51 and abs(choice.scores["1"] - 0.45) < 1e-12 and choice.scores["5"] is None
    assert list(choice.scores) == ["0.01", "0.1", "1", "5"]  # numeric order
    assert rep.grid("fedavg", col) is None and sorted(rep.cells[("fedavg", "Acc")].values) == [40.0, 42.0]
    assert not rep.warnings()  # no "several runs with one seed"
    line = dict(zip(rep.row_keys, rep.lines()))["fedprox"]
    assert line[1] == "55.00 ± 1.00 [mu=0.1 of 4]" and line[2] == "55.50"
    notes = rep.grid_notes()
    assert notes[0] == "FedKA §5.1" and len(notes) == 2  # FedKA has no runs: no line
    assert "mu ∈ {0.01, 0.1, 1, 5} → 0.1" in notes[1] and "0.1 55.00" in notes[1] and "5 —" in notes[1]

    out = tmp_path / "out"
    report([root], out=out, plots=True, wandb="disabled")
    md = (out / "fedka_t1.md").read_text()
    assert "[mu=0.1 of 4]" in md and "best value of a grid" in md
    rows = {r["row"]: r for r in csv.DictReader((out / "fedka_t1.csv").open())}
    assert (rows["fedprox"]["grid_key"], rows["fedprox"]["grid_value"]) == ("algorithm.mu", "0.1")
    assert rows["fedprox"]["n"] == "2" and rows["fedavg"]["grid_key"] == ""


def test_grid_choice_per_column_and_by_another_metric_or_minimum(tmp_path):
    """With columns (e.g. FedKA Table 3's participation ratios) the value is chosen per column;
    ``by`` selects on another
    metric than the one shown (here: shown best accuracy, chosen by last accuracy); ``mode: min`` takes the lowest."""
    spec = {
        "paper": "fedka",
        "id": "t3",
        "title": "cols",
        "rows": "choice:algorithm",
        "cols": "participation",
        "metrics": {"Acc": "global/acc.best"},
        "percent": True,
        "tune": {"by": "global/acc.last", "rows": {"moon": "algorithm.mu"}},
    }
    root = tmp_path / "sweep"
    last = {(0.2, 1): 0.30, (0.2, 5): 0.20, (1.0, 1): 0.10, (1.0, 5): 0.25}
    for (part, mu), acc in last.items():
        d = write_run(root, "moon", 0, spec, [0.05, 1 - acc, acc], mu=mu)  # best = 1 − last: the opposite order
        cfg = (d / "config.yaml").read_text().replace("seed: 0\n", f"seed: 0\nparticipation: {part}\n", 1)
        (d / "config.yaml").write_text(cfg)
        d.rename(root / f"moon_p{part}_mu{mu}")
    rep = Report(group_tables(collect([root]))[0])
    by_col = {c.header: c for c in rep.columns}
    assert set(by_col) == {"participation=0.2", "participation=1.0"}
    assert rep.grid("moon", by_col["participation=0.2"]).chosen == "1"  # last 0.30 > 0.20
    assert rep.grid("moon", by_col["participation=1.0"]).chosen == "5"  # last 0.25 > 0.10
    assert rep.cells[("moon", by_col["participation=0.2"].key)].values == [70.0]  # shown: μ = 1's best accuracy
    [table] = group_tables(collect([root]))
    rep = Report(Table(dict(spec, tune={**spec["tune"], "mode": "min"}), table.members))
    assert rep.grid("moon", by_col["participation=0.2"]).chosen == "5"


PAPER_GRIDS = {
    "fedprox": {0.001, 0.01, 0.1, 1},
    "moon": {0.1, 1, 5, 10},
    "feddyn": {1, 0.1, 0.01, 0.001},
    "fedka": {0.5, 0.1, 0.01, 0.001},
}  # FedKA §5.1, as printed


def _arm(path):
    """(method, {key: value}) an arm file of experiment/fedka/arm sets."""
    from omegaconf import OmegaConf

    node = OmegaConf.load(path)
    method = next(d["override /algorithm"] for d in node.defaults if "override /algorithm" in d)
    values = OmegaConf.to_container(node.algorithm) if "algorithm" in node else {}
    return method, {f"algorithm.{k}": v for k, v in values.items()}


def test_fedka_table_sweeps_carry_the_papers_grids():
    """Every FedKA table config with a ``tune:`` node sweeps method arms (experiment/fedka/arm): each arm picks a method
    of the table, and the arms of a tuned method set its tuned key to exactly the paper's grid; two arms composed with
    Table 1 give the method and value they name."""
    from conftest import CONF
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    key, arm_dir = "experiment/fedka/arm@_global_", CONF / "experiment" / "fedka" / "arm"
    tuned_tables = 0
    for path in sorted((CONF / "experiment" / "fedka").glob("table*.yaml")):
        node = OmegaConf.load(path)
        if "tune" not in node.table:
            continue
        tuned_tables += 1
        grids: dict = {}
        for arm in str(node.hydra.sweeper.params[key]).split(","):
            method, values = _arm(arm_dir / f"{arm}.yaml")
            assert method in node.table.reference, (path.stem, arm)
            tkey = node.table.tune.rows.get(method)
            assert set(values) == ({tkey} if tkey else set()), (path.stem, arm)
            if tkey:
                grids.setdefault(method, set()).add(values[tkey])
        assert set(grids) == set(node.table.tune.rows), path.stem
        assert all(values == PAPER_GRIDS[m] for m, values in grids.items()), path.stem
        assert set(node.table.reference) <= {
            _arm(arm_dir / f"{a}.yaml")[0] for a in str(node.hydra.sweeper.params[key]).split(",")
        }
    assert tuned_tables == 12
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for arm, name, mu in (("moon_10", "moon", 10), ("fedavg", "fedavg", None)):
            cfg = compose("config", overrides=["+experiment=fedka/table1", f"{key}={arm}"])
            assert cfg.algorithm.name == name and cfg.algorithm.get("mu") == mu
    GlobalHydra.instance().clear()
