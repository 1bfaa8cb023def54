"""The report tool (fedbench/report/): a real multirun through the CLI into a table, incomplete sweeps marked cell
by cell, rounds-to-target / speedup / runtime arithmetic on run dirs with known records, plots, W&B offline, and
the table -> command listing."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from fedbench.plots import set_formats
from fedbench.report import (
    Report,
    Table,
    collect,
    experiment_tables,
    group_tables,
    list_tables,
    main,
    plot_curves,
    report,
)
from fedbench.report.figures import vs_key_figures

REPO = Path(__file__).resolve().parent.parent


def _csv(path: Path) -> dict:
    """{(row, column): csv line} of a report CSV."""
    return {(r["row"], r["column"]): r for r in csv.DictReader(path.open())}


# ---- end to end: the real CLI ------------------------------------------------------------------------------------


def test_multirun_through_the_cli_into_a_report_with_a_failed_run(tmp_path, cache_dir, capsys, monkeypatch):
    """A 2 methods x 2 seeds sweep of the smoke experiment where the seed doubles as the weight decay, so the runs
    with seed 1e9 really diverge (non-finite parameters -> status diverged): each cell holds 1 value of 2 runs and
    says `1 diverged`; a never-started job (its dir removed) is reported as missing in its own cell."""
    from fedbench import cli
    from fedbench.sweep import SWEEP_FAILED

    sweep = tmp_path / "sweep"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "fedbench",
            "-m",
            "+experiment=smoke",
            "algorithm=local,fedavg",
            "seed=0,1000000000",
            "optim.weight_decay=${seed}",
            "rounds=1",
            "clients=3",
            "hardware=cpu",
            "hardware.threads=1",
            f"cache_dir={cache_dir}",
            f"hydra.sweep.dir={sweep}",
        ],
    )
    SWEEP_FAILED.clear()
    with pytest.raises(SystemExit) as e:  # the console script, in this process
        cli.main()
    err = capsys.readouterr().err
    assert e.value.code == 1, err[-3000:]  # the sweep ran to its end; some jobs failed
    statuses = sorted(json.loads(f.read_text())["status"] for f in sweep.glob("*/status.json"))
    assert statuses == ["complete"] * 2 + ["diverged"] * 2

    out = tmp_path / "rep"
    monkeypatch.setenv("COLUMNS", "200")  # the table's cells unwrapped, whatever the terminal running the tests
    assert main([str(sweep), "--out", str(out)]) == 0  # = fedbench-report / scripts/report.py
    printed = capsys.readouterr().out
    assert "Smoke" in printed and "1 diverged" in printed and "diverged in round 1: non-finite" in printed
    cells = _csv(out / "smoke_smoke.csv")
    assert set(cells) == {(r, c) for r in ("local", "fedavg") for c in ("Best Acc", "Final Acc")}
    for (row, col), c in cells.items():
        assert (c["n"], c["n_runs"], c["seeds"], c["status"]) == ("1", "2", "0", "diverged=1")
        assert c["cell"].endswith("(1/2, 1 diverged)") and c["ours_std"] == "0.0"
    # the numbers are the runs' summary.json values in percent
    fedavg = [
        json.loads((d / "summary.json").read_text())
        for d in sweep.iterdir()
        if "algorithm=fedavg" in d.name and (d / "summary.json").exists()
    ]
    assert [100 * s["metrics"]["pers/acc"]["best"] for s in fedavg] == [float(cells[("fedavg", "Best Acc")]["values"])]
    md = (out / "smoke_smoke.md").read_text()
    assert "| Method | Best Acc | Final Acc |" in md and "diverged" in md and "non-finite" in md
    png = out / "smoke_smoke_curves_pers_acc.png"
    assert png.exists() and png.stat().st_size > 1000

    # a job of the sweep that never started: its dir is gone, multirun.yaml still lists it
    partial = tmp_path / "partial"
    shutil.copytree(sweep, partial)
    gone = next(d for d in partial.iterdir() if "algorithm=local" in d.name and d.name.endswith("seed=0"))
    shutil.rmtree(gone)
    report([partial], out=tmp_path / "rep2", plots=False)
    cells = _csv(tmp_path / "rep2" / "smoke_smoke.csv")
    local = cells[("local", "Best Acc")]
    assert (local["n"], local["n_runs"], local["cell"]) == ("0", "2", "1 missing, 1 diverged")
    assert cells[("fedavg", "Best Acc")]["n"] == "1"


# ---- arithmetic on hand-written run dirs -------------------------------------------------------------------------

TABLE2 = {
    "paper": "fedka",
    "id": "table2",
    "title": "FedKA Table 2 (test)",
    "rows": "choice:algorithm",
    "cols": None,
    "metrics": {
        "Rounds": "rounds_to_target",
        "Acc@2": "global/acc@2",
        "Time/round (s)": "time_per_round",
        "Wall (s)": "wall_time",
    },
    "target": {"metric": "global/acc", "row": "fedavg", "at": "last"},
    "percent": True,
    "labels": {"fedavg": "FedAvg", "fedka": "FedKA", "fedprox": "FedProx"},
    "reference": {"fedavg": {"Rounds": 100}, "fedka": {"Rounds": 43}, "fedprox": {"Rounds": None}},
}


def write_run(
    root: Path,
    algorithm: str,
    seed: int,
    table: dict,
    acc=None,
    times=None,
    status="complete",
    num=0,
    extra=None,
    **config,
) -> Path:
    """A run dir as fedbench writes it, with the given per-round global accuracy and round times."""
    d = root / f"algorithm={algorithm},seed={seed}"
    (d / ".hydra").mkdir(parents=True)
    cfg = {
        "seed": seed,
        "rounds": len(acc or [0]) - 1,
        "algorithm": {"name": algorithm, **config},
        "logger": {"wandb": {"mode": "disabled", "project": "fedbench-test"}},
        "table": table,
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (d / ".hydra" / "hydra.yaml").write_text(
        yaml.safe_dump(
            {
                "hydra": {
                    "runtime": {"choices": {"algorithm": algorithm}},
                    "job": {"num": num},
                    "overrides": {"task": [f"algorithm={algorithm}", f"seed={seed}"]},
                }
            }
        )
    )
    acc = acc or []
    times = times or [1.0] * max(len(acc) - 1, 0)
    lines = [{"round": r, "global/acc": a, **({"time/round": times[r - 1]} if r else {})} for r, a in enumerate(acc)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "status.json").write_text(
        json.dumps({"status": status, "error": "RunFailed: test" if status == "failed" else None})
    )
    if status == "complete":
        summary = {
            "status": "complete",
            "metrics": {"global/acc": {"best": max(acc), "final": acc[-1], "last": acc[-1]}},
            "time_per_round": sum(times) / len(times),
            "wall_time": sum(times),
            **(extra or {}),
        }
        (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_rounds_to_target_speedup_and_runtime_from_the_runs_records(tmp_path):
    """FedKA Table 2: rounds = first round whose global accuracy reaches FedAvg's last-round accuracy of the same
    seed; speedup = that target round / rounds; never reached -> "\\"; runtime = summary.json's time_per_round and
    wall_time; running/failed runs are counted per cell, not averaged."""
    root = tmp_path / "sweep"
    write_run(root, "fedavg", 0, TABLE2, [0.1, 0.3, 0.5, 0.6, 0.55], [1, 2, 3, 4])  # target 0.55 @4: reached @3
    write_run(root, "fedavg", 1, TABLE2, [0.1, 0.2, 0.4, 0.5, 0.5], [2, 2, 2, 2])  # target 0.50 @4: reached @3
    write_run(root, "fedka", 0, TABLE2, [0.1, 0.56, 0.6, 0.7, 0.7], [3, 3, 3, 3])  # 0.56 >= 0.55 @1: speedup 4
    write_run(root, "fedka", 1, TABLE2, [0.1, 0.3, 0.45, 0.49, 0.49], [1, 1, 1, 1])  # never reaches 0.50
    write_run(root, "fedprox", 0, TABLE2, status="running")
    write_run(root, "fedprox", 1, TABLE2, status="failed")
    [table] = group_tables(collect([root]))
    rep = Report(table)
    assert rep.row_keys == ["fedavg", "fedka", "fedprox"]
    assert [c.header for c in rep.columns] == ["Rounds", "Speedup", "Acc@2", "Time/round (s)", "Wall (s)"]
    cell = {(r, c): rep.cells[(r, c)] for r, c in rep.cells}
    assert cell[("fedavg", "Rounds")].values == [4.0, 4.0]  # the target row: its target round, 1x (#16 item 13)
    assert cell[("fedavg", "Speedup")].values == [1.0, 1.0]
    assert cell[("fedka", "Rounds")].values == [1.0] and cell[("fedka", "Rounds")].other == {"never": 1}
    assert cell[("fedka", "Speedup")].values == [4.0]
    assert cell[("fedka", "Rounds")].text(0) == "1 (1/2, 1 never)" and rep.digits["Rounds"] == 0
    assert cell[("fedavg", "Acc@2")].values == [50.0, 40.0] and cell[("fedavg", "Acc@2")].text(2) == "45.00 ± 5.00"
    assert cell[("fedavg", "Time/round (s)")].values == [2.5, 2.0]  # not scaled to percent
    assert cell[("fedka", "Wall (s)")].values == [12.0, 4.0]
    assert cell[("fedprox", "Rounds")].text() == "1 running, 1 failed"
    # the paper's numbers beside ours: speedup derived from the paper's rounds, null = never ("\")
    assert rep.paper_text("fedka", rep.columns[1]) == "2.33" and rep.paper_text("fedprox", rep.columns[0]) == "\\"
    assert rep.diff("fedka", rep.columns[0]) == 1.0 - 43
    # issue #52: in a claim, the never-reaching run (FedKA seed 1, rounds 0-4, target round 4) counts as its censored
    # value's bound — reached at round 5 at the earliest: speedup <= 4/5 = 0.8, rounds >= 5 — not as speedup 0
    from fedbench.claims.results import run_value

    never = next(r for r, _ in table.members if r.seed == 1 and "fedka" in r.path.name)
    assert rep.never_bound(never, "speedup", rep.columns[1]) == pytest.approx(0.8)
    assert rep.never_bound(never, "rounds_to_target", rep.columns[0]) == 5.0
    speed = Report(Table(dict(TABLE2, metrics={"value": "speedup"}), table.members))
    assert run_value(speed, never, speed.columns[0]) == pytest.approx(0.8)
    reached = next(r for r, _ in table.members if r.seed == 0 and "fedka" in r.path.name)
    assert run_value(speed, reached, speed.columns[0]) == 4.0
    # target at a fixed round (target.at) instead of the last one: FedAvg's round-2 accuracy (0.5 and 0.4)
    rep = Report(Table(dict(TABLE2, target={"metric": "global/acc", "row": "fedavg", "at": 2}), table.members))
    assert rep.cells[("fedka", "Rounds")].values == [1.0, 2.0]
    assert rep.cells[("fedka", "Speedup")].values == [2.0, 1.0]
    # all seeds never reach the target -> "\" like the paper
    shutil.rmtree(root / "algorithm=fedka,seed=0")
    rep = Report(group_tables(collect([root]))[0])
    assert rep.cells[("fedka", "Rounds")].text() == "\\"


def test_delta_table_plots_and_merged_columns(tmp_path):
    """A numeric row key (FedReMa δ) gets a metric-vs-δ picture with accuracies and CCP length in their own panels;
    two configs of one paper table with one metric column each (FedKA Table 1's datasets) become one table."""
    delta = {
        "paper": "fedrema",
        "id": "table3",
        "title": "δ",
        "rows": "algorithm.delta",
        "cols": None,
        "percent": True,
        "metrics": {"Best Acc": "global/acc.best", "Final Acc": "global/acc.final", "Rounds in CCP": "ccp_rounds"},
        "reference": {0.1: {"Best Acc": 63.36, "Rounds in CCP": 500}, 0.5: {"Best Acc": 65.40, "Rounds in CCP": 36}},
    }
    root = tmp_path / "delta"
    for i, (d, ccp) in enumerate([(0.5, 2), (0.1, 4)]):
        run = write_run(
            root,
            "fedrema",
            0,
            delta,
            [0.1, 0.4, 0.5 + d / 10, 0.6],
            [1, 1, 1],
            num=i,
            extra={"ccp_rounds": ccp},
            delta=d,
        )
        run.rename(root / f"delta={d}")
    [(rep, pictures)] = report([root], out=tmp_path / "out", wandb="disabled")
    assert rep.row_keys == ["0.1", "0.5"] and rep.row_names == {"0.1": "0.1", "0.5": "0.5"}
    assert rep.cells[("0.1", "Rounds in CCP")].values == [4.0] and rep.cells[("0.5", "Best Acc")].values == [60.0]
    assert rep.paper_text("0.5", rep.columns[2]) == "36" and rep.diff("0.1", rep.columns[0]) == 60.0 - 63.36
    names = sorted(p.name for p in pictures)
    assert names == ["fedrema_table3_curves_global_acc.png", "fedrema_table3_vs_delta.png"]
    assert all(p.stat().st_size > 1000 for p in pictures)
    [(_, fig)] = vs_key_figures(rep)
    assert [ax.get_xlabel() for ax in fig.axes] == ["CCP threshold δ"] * 2
    set_formats("pdf,svg")  # --pictures pdf,svg: each picture also as PDF and SVG, the PNG still written
    try:
        [(_, again)] = report([root], out=tmp_path / "vector", wandb="disabled")
    finally:
        set_formats(None)
    for png in again:
        assert png.suffix == ".png" and png.with_suffix(".pdf").read_bytes().startswith(b"%PDF")
        assert "<svg" in png.with_suffix(".svg").read_text()[:1000]
    with pytest.raises(ValueError, match=r"--pictures 'eps' — a comma list of png, pdf, svg"):
        set_formats("eps")
    csv_rows = _csv(tmp_path / "out" / "fedrema_table3.csv")
    assert csv_rows[("0.5", "Rounds in CCP")]["paper"] == "36"

    cifar10 = {
        "paper": "fedka",
        "id": "table1",
        "title": "FedKA Table 1: acc (CIFAR-10, t-CNN)",
        "rows": "choice:algorithm",
        "cols": None,
        "metrics": {"CIFAR-10": "global/acc.last"},
        "percent": True,
        "reference": {"fedavg": {"CIFAR-10": 59.8}},
    }
    cifar100 = dict(
        cifar10,
        title="FedKA Table 1: acc (CIFAR-100, ResNet-50)",
        metrics={"CIFAR-100": "global/acc.last"},
        reference={"fedavg": {"CIFAR-100": 26.7}},
    )
    write_run(tmp_path / "s10", "fedavg", 0, cifar10, [0.1, 0.5])
    write_run(tmp_path / "s100", "fedavg", 0, cifar100, [0.1, 0.2])
    [table] = group_tables(collect([tmp_path / "s10", tmp_path / "s100"]))
    rep = Report(table)
    assert table.title == "FedKA Table 1: acc" and [c.header for c in rep.columns] == ["CIFAR-10", "CIFAR-100"]
    assert rep.lines() == [["fedavg", "50.00", "59.80", "-9.80", "20.00", "26.70", "-6.70"]]
    [png] = plot_curves(rep, tmp_path / "merged")  # one panel per dataset, runs not pooled across them
    assert png.name == "fedka_table1_curves_global_acc.png" and png.stat().st_size > 1000


def test_report_table_is_logged_to_wandb_offline(tmp_path):
    """--wandb offline: one W&B run of job type `report` holding the table (wandb.Table), written to files only."""
    import wandb
    from wandb_files import read_run

    root = tmp_path / "sweep"
    write_run(root, "fedavg", 0, TABLE2, [0.1, 0.3, 0.5], [1, 1])
    write_run(root, "fedka", 0, TABLE2, [0.1, 0.6, 0.7], [1, 1])
    out = tmp_path / "out"
    report([root], out=out, plots=False, wandb="offline")
    wandb.teardown()  # the W&B service writes the offline file asynchronously; shutting it down flushes it
    [logged] = [row for row in read_run(out)["history"] if "report/fedka_table2/_type" in row]
    assert logged["report/fedka_table2/_type"] == "table-file"
    assert logged["report/fedka_table2/nrows"] == 3 * 5  # 3 rows (FedProx only in the paper) x 5 columns
    [saved] = out.glob("wandb/*run-*/files/" + logged["report/fedka_table2/path"])
    table = json.loads(saved.read_text())
    assert table["columns"][:4] == ["table", "row", "row_label", "column"]
    rounds = {(r[1], r[3]): r for r in table["data"]}[("fedka", "Rounds")]
    assert rounds[table["columns"].index("ours_mean")] == "1.0"  # reached FedAvg's final 0.5 at round 1


# ---- the table -> command listing --------------------------------------------------------------------------------


def test_listing_gives_each_table_its_command_and_the_reduced_one(tmp_path, capsys):
    """Commands come from the config's path; the reduced CPU command from its header comment (overrides only, or a
    whole command, possibly over two comment lines); runs = size of the sweep grid."""
    exp = tmp_path / "experiment" / "paper"
    exp.mkdir(parents=True)
    table = {
        "paper": "paper",
        "id": "t",
        "title": "T",
        "rows": "choice:algorithm",
        "cols": None,
        "metrics": {"A": "a.b"},
    }
    (exp / "table2.yaml").write_text(
        "# @package _global_\n# Paper Table 2. CPU: `scale=0.2 seed=0` (20 rounds).\n"
        + yaml.safe_dump({"hydra": {"sweeper": {"params": {"algorithm": "a,b", "seed": "0,1,2"}}}, "table": table})
    )
    (exp / "table10.yaml").write_text(
        "# @package _global_\n# CPU (docs/x.md): `fedbench -m +experiment=paper/table10 scale=0.1\n"
        "# seed=0 local_epochs=1` (needs data).\nrounds: 5\n" + yaml.safe_dump({"table": table})
    )
    (exp / "setting.yaml").write_text("# a shared setting, not a table\nrounds: 5\n")
    entries = experiment_tables(tmp_path)
    assert [e["name"] for e in entries] == ["paper/table2", "paper/table10"]
    t2, t10 = entries
    assert t2["command"] == "fedbench -m +experiment=paper/table2" and t2["runs"] == 6
    assert t2["reduced"] == "fedbench -m +experiment=paper/table2 scale=0.2 seed=0" and t2["note"] == "20 rounds"
    assert (
        t10["reduced"] == "fedbench -m +experiment=paper/table10 scale=0.1 seed=0 local_epochs=1" and t10["runs"] == 1
    )

    # the real tree: every config with a table: node is listed, and the console listing prints
    real = experiment_tables(REPO / "conf")
    with_table = [
        p for p in (REPO / "conf" / "experiment").rglob("*.yaml") if "table" in (yaml.safe_load(p.read_text()) or {})
    ]
    assert len(real) == len(with_table) and all(e["command"].startswith("fedbench -m +experiment=") for e in real)
    md = tmp_path / "tables.md"
    assert list_tables(["--markdown", str(md)]) == 0
    assert "fedbench -m +experiment=smoke" in capsys.readouterr().out
    assert "`fedbench -m +experiment=smoke`" in md.read_text()


def test_a_metric_no_run_has_is_refused_with_those_they_have(tmp_path, capsys):
    """Issue #37: `fedbench-report --metric nosuch/metric` printed an empty table and exit 0."""
    from fedbench.report import main as report_main

    write_run(tmp_path / "sweep", "fedavg", 0, None, acc=[0.1, 0.4])
    assert report_main([str(tmp_path / "sweep"), "--metric", "nosuch/metric", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--metric 'nosuch/metric'" in err and "they have: global/acc" in err
    assert not (tmp_path / "sweep" / "report").exists()
    assert report_main([str(tmp_path / "sweep"), "--metric", "global/acc", "--no-plots"]) == 0


def _swept(d: Path, key: str, value, typed: bool = True) -> Path:
    """Set a dotted config key of a run dir written by :func:`write_run` (and, ``typed``, as the sweep's override)."""
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    *parents, last = key.split(".")
    node = cfg
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    if typed:
        hydra = yaml.safe_load((d / ".hydra" / "hydra.yaml").read_text())
        hydra["hydra"]["overrides"]["task"].append(f"{key}={value}")
        (d / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    return d


def test_runs_of_one_method_and_seed_on_different_datasets_are_one_table_split_or_pooled(tmp_path, capsys):
    """Issue #36 (plots/report): `fedbench-report outputs/runs` averaged a digits and a synthetic FedAvg run into one
    cell with only a warning. Issue #53: the key they differ in is the table's rows (each run its own numbers, never
    averaged); ``--split dataset.name`` gives one table per dataset; ``--pool`` averages, warning."""
    from fedbench.report import main as report_main

    dirs = []
    for name, acc in (("digits", [0.1, 0.7]), ("synthetic", [0.1, 0.3])):
        d = _swept(write_run(tmp_path / name, "fedavg", 0, None, acc=acc), "dataset.name", name, typed=False)
        _swept(d, "hardware.threads", 1 if name == "digits" else 2, typed=False)  # where it ran: never a table key
        dirs.append(str(tmp_path / name))
    out = tmp_path / "report"
    assert report_main([*dirs, "--no-plots", "--out", str(out)]) == 0
    cells = _csv(out / "runs_global_acc_by_dataset.name.csv")
    assert {k: float(c["ours_mean"]) for k, c in cells.items() if k[1] == "Best"} == {
        ("digits", "Best"): pytest.approx(70.0),
        ("synthetic", "Best"): pytest.approx(30.0),
    }
    assert report_main([*dirs, "--no-plots", "--out", str(out), "--split", "dataset.name"]) == 0
    for name, best in (("digits", 70.0), ("synthetic", 30.0)):
        cells = _csv(out / f"runs_global_acc_{name}.csv")
        assert float(cells[("fedavg", "Best")]["ours_mean"]) == pytest.approx(best)
    assert report_main([*dirs, "--no-plots", "--out", str(tmp_path / "pooled"), "--pool"]) == 0
    cells = _csv(tmp_path / "pooled" / "runs_global_acc.csv")
    assert float(cells[("fedavg", "Best")]["ours_mean"]) == pytest.approx(50.0)
    assert "several runs with seed 0" in (tmp_path / "pooled" / "runs_global_acc.md").read_text()


def test_a_sensitivity_sweep_is_one_table_with_the_swept_key_as_its_rows_and_one_plot_against_it(tmp_path, capsys):
    """Issue #53 item 3: `fedbench -m algorithm=fedrema algorithm.delta=0.3,0.7 seed=0,1` then `fedbench-report` was
    refused (--split gave two one-row tables). Now: one table, δ as its rows (in numeric order, not sweep order),
    mean over seeds per δ; a key derived from δ (changing with it) is not a second axis; one picture with δ on x."""
    from fedbench.report import main as report_main

    accs = {(0.7, 0): [0.1, 0.5, 0.4], (0.7, 1): [0.1, 0.6, 0.2], (0.3, 0): [0.1, 0.2, 0.9], (0.3, 1): [0.1, 0.3, 0.7]}
    for (delta, seed), acc in accs.items():
        d = write_run(tmp_path / "sweep" / f"delta={delta}", "fedrema", seed, None, acc=acc, delta=delta)
        _swept(d, "algorithm.delta_percent", int(delta * 100), typed=False)
        _swept(d, "algorithm.delta", delta)
    out = tmp_path / "report"
    assert report_main([str(tmp_path / "sweep"), "--out", str(out)]) == 0
    cells = _csv(out / "runs_global_acc_by_algorithm.delta.csv")
    # Best: max of each curve, mean over the two seeds; Final: the last value (windows of 2 rounds' evaluations)
    assert {k: round(float(c["ours_mean"]), 6) for k, c in cells.items()} == {
        ("0.3", "Best"): 80.0,  # (90 + 70) / 2
        ("0.3", "Final"): 80.0,
        ("0.7", "Best"): 55.0,  # (50 + 60) / 2
        ("0.7", "Final"): 30.0,  # (40 + 20) / 2
    }
    md = (out / "runs_global_acc_by_algorithm.delta.md").read_text()
    assert md.index("| 0.3 |") < md.index("| 0.7 |") and "| delta | Best | Final |" in md
    assert sorted(p.name for p in out.glob("*_vs_*.png")) == ["runs_global_acc_by_algorithm.delta_vs_delta.png"]
    [(rep, _)] = report([tmp_path / "sweep"], out=tmp_path / "again", plots=False, wandb="disabled")
    [(name, fig)] = vs_key_figures(rep)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "CCP threshold δ" and [t.get_text() for t in ax.get_xticklabels()] == ["0.3", "0.7"]


def test_a_key_swept_over_several_methods_is_the_columns_one_table_per_metric(tmp_path):
    """Issue #53 item 3: FedAvg and FedProx each at Dirichlet α 0.1 and 0.5 (a key every method has): rows = methods,
    columns = α, one table per metric (Best, Final) and one picture each with α on x."""
    acc = {("fedavg", 0.1): [0.1, 0.3, 0.2], ("fedavg", 0.5): [0.1, 0.6, 0.5], ("fedprox", 0.1): [0.1, 0.4, 0.35]}
    acc[("fedprox", 0.5)] = [0.1, 0.8, 0.7]
    for (method, alpha), a in acc.items():
        final = {"global/acc": {"best": max(a), "final": a[-1], "final_n": 1, "last": a[-1]}}  # (window 1)
        d = write_run(tmp_path / "sweep" / f"a{alpha}", method, 0, None, acc=a, extra={"metrics": final})
        _swept(d, "partition.alpha", alpha)
    done = report([tmp_path / "sweep"], out=tmp_path / "out", wandb="disabled")
    assert sorted(rep.table.stem for rep, _ in done) == [
        "runs_global_acc_best_by_partition.alpha",
        "runs_global_acc_final_by_partition.alpha",
    ]
    best = _csv(tmp_path / "out" / "runs_global_acc_best_by_partition.alpha.csv")
    assert {k: round(float(c["ours_mean"]), 6) for k, c in best.items()} == {
        ("fedavg", "alpha=0.1"): 30.0,
        ("fedavg", "alpha=0.5"): 60.0,
        ("fedprox", "alpha=0.1"): 40.0,
        ("fedprox", "alpha=0.5"): 80.0,
    }
    final = _csv(tmp_path / "out" / "runs_global_acc_final_by_partition.alpha.csv")
    assert float(final[("fedprox", "alpha=0.1")]["ours_mean"]) == pytest.approx(35.0)
    md = (tmp_path / "out" / "runs_global_acc_final_by_partition.alpha.md").read_text()
    assert "| Method | alpha=0.1 | alpha=0.5 |" in md  # the columns are α's values, whatever the metric
    assert all(len(pics) == 2 and pics[1].name.endswith("_vs_alpha.png") for _, pics in done)  # curves, vs α


def test_runs_that_differ_in_a_key_one_method_lacks_are_refused_in_one_line(tmp_path, capsys):
    """A FedAvg run next to a δ sweep of FedReMa: FedAvg has no δ, so δ cannot be an axis of their table: refused
    in one line (ending in a newline) naming the key, its values and --split / --pool; nothing written."""
    from fedbench.report import main as report_main

    write_run(tmp_path / "fedavg", "fedavg", 0, None, acc=[0.1, 0.5])
    for delta in (0.3, 0.7):
        _swept(
            write_run(tmp_path / f"d{delta}", "fedrema", 0, None, acc=[0.1, delta], delta=delta),
            "algorithm.delta",
            delta,
        )
    out = tmp_path / "report"
    assert (
        report_main([str(tmp_path / "fedavg"), str(tmp_path / "d0.3"), str(tmp_path / "d0.7"), "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n") and "differ in algorithm.delta (0.3, 0.7):" in err
    assert "--split algorithm.delta" in err and not out.exists()


def test_the_final_column_says_how_many_evaluations_it_averaged(tmp_path, capsys, monkeypatch):
    """Issue #53 item 6: a 3-round run's final (window 5) is the mean of all 3 evaluations — its whole curve, no
    end-of-training value: the header says ``Final (all 3 evals)``; a 10-round run's says ``Final (last 5 evals)``;
    the CSV's column stays ``Final``."""
    from fedbench.report import main as report_main

    def summary(acc, n):
        final = sum(acc[-n:]) / n
        return {"metrics": {"global/acc": {"best": max(acc), "final": final, "final_n": n, "last": acc[-1]}}}

    short = [0.1, 0.2, 0.6, 0.4]  # final = (20 + 60 + 40) / 3 = 40; best 60
    write_run(tmp_path / "short", "fedavg", 0, None, acc=short, extra=summary(short, 3))
    long = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.5, 0.6]  # final = mean of rounds 6-10 = 70
    write_run(tmp_path / "long", "fedavg", 0, None, acc=long, extra=summary(long, 5))
    monkeypatch.setenv("COLUMNS", "200")
    for name, header, final in (("short", "Final (all 3 evals)", 40.0), ("long", "Final (last 5 evals)", 70.0)):
        out = tmp_path / f"report_{name}"
        assert report_main([str(tmp_path / name), "--no-plots", "--no-wandb", "--out", str(out)]) == 0
        assert f"| Method | Best | {header} |" in (out / "runs_global_acc.md").read_text()
        assert header in capsys.readouterr().out
        assert float(_csv(out / "runs_global_acc.csv")[("fedavg", "Final")]["ours_mean"]) == pytest.approx(final)


def test_a_sweep_given_twice_counts_once(tmp_path):
    """`fedbench-report <sweep> <sweep>` read the sweep's runs once and then listed every job again as missing."""
    from fedbench.report import collect

    sweep = tmp_path / "sweep"
    write_run(sweep, "fedavg", 0, None, acc=[0.1, 0.4])
    (sweep / "multirun.yaml").write_text(
        yaml.safe_dump(
            {
                "hydra": {
                    "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"},
                    "overrides": {"task": ["algorithm=fedavg", "seed=0"]},
                }
            }
        )
    )
    once = collect([sweep])
    assert [r.status for r in once] == ["complete"]
    assert [r.status for r in collect([sweep, sweep])] == ["complete"]
