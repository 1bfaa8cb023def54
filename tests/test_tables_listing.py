"""fedbench-tables (issue #20 item 8): a filter (`fedbench-tables fedrema`), each command whole on a line of its own
at any terminal width, and runtime estimates kept as data (conf/runtimes.yaml) whose arithmetic is jobs x rounds x
the measured seconds per round."""

from __future__ import annotations

import pytest
from conftest import CONF

from fedbench.report import experiment_tables, list_tables
from fedbench.report.catalog import matches, time_text
from fedbench.report.runtime import hours
from fedbench.report.stored_runtimes import load


def _listing(argv, width, monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.setenv("COLUMNS", str(width))
    code = list_tables(argv)
    return code, capsys.readouterr().out


def test_filter_and_commands_on_their_own_lines(monkeypatch, capsys):
    entries = experiment_tables(CONF)
    fedrema = [e for e in entries if matches(e, ["fedrema"])]
    assert fedrema and all(e["paper"] == "fedrema" for e in fedrema)
    assert [e["name"] for e in entries if matches(e, ["fedka", "table2"])] == ["fedka/table2", "fedka/table2_cifar100"]
    code, out = _listing(["fedrema"], 60, monkeypatch, capsys)
    assert code == 0
    lines = out.splitlines()
    for e in fedrema:  # a 60-column terminal: every command still whole, on one line (the terminal may fold it)
        assert any(e["command"] in ln for ln in lines) and any(e["reduced"] in ln for ln in lines), e["name"]
    assert "fedka/" not in out and "ECL" not in out
    code, _ = _listing(["nosuchpaper"], 100, monkeypatch, capsys)
    assert code == 1


def test_stored_estimates_are_listed(monkeypatch, capsys):
    """Every stored estimate names a real table, has runs, rounds, s/round and seconds (runs x rounds x s/round of
    the first cell, scaled by the swept values' mean cost: test_estimate_...), and is printed."""
    times = load(CONF)
    names = {e["name"] for e in experiment_tables(CONF)}
    assert times and set(times) <= names
    for name, scales in times.items():
        for scale, t in scales.items():
            assert scale in ("cpu", "paper") and t["runs"] >= 1 and t["rounds"] >= 1 and t["s_per_round"] > 0
            assert t["seconds"] > 0, (name, scale)
    name, t = next(iter(times.items()))
    assert time_text(t) == " / ".join(hours(t[s]["seconds"]) if s in t else "—" for s in ("cpu", "paper"))
    _, out = _listing([name], 200, monkeypatch, capsys)
    assert f"~{hours(next(iter(t.values()))['seconds'])} here" in out
    assert [hours(40), hours(720), hours(12240), hours(756000)] == ["40 s", "12 min", "3.4 h", "210 h"]


def test_estimate_is_jobs_times_rounds_times_measured_round(tmp_path):
    """The smoke table (digits, 6 jobs of 5 rounds): its sweep's methods cost the same per round, so the estimate is
    exactly 6 x 5 x s/round; a swept local_epochs=1,3 makes the round the mean of the two settings', more than E=1
    alone, and the estimate still runs x rounds x that round (issue #53: the old one was not).
    Written into a copy of conf/: the other tables' stored estimates stay
    (a filtered --estimate re-measures its own)."""
    import shutil

    from fedbench.report.runtime import write_estimates

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    before = load(conf)
    entry = {"name": "smoke", "reduced": "fedbench -m +experiment=smoke local_epochs=1,3 seed=0"}
    write_estimates([entry], conf, None, log=lambda m: None)
    after = load(conf)
    paper, cpu = after["smoke"]["paper"], after["smoke"]["cpu"]
    assert (paper["runs"], paper["rounds"]) == (6, 5)
    assert paper["seconds"] == pytest.approx(6 * 5 * paper["s_per_round"], rel=1e-2)
    assert cpu["runs"] == 3 * 2  # 3 methods x E in {1, 3}, one seed
    assert cpu["seconds"] == pytest.approx(cpu["runs"] * cpu["rounds"] * cpu["s_per_round"], rel=1e-3)  # #53
    assert cpu["s_per_round"] > 1.2 * paper["s_per_round"]  # the mean setting's round: E = 1 and E = 3
    assert {k: v for k, v in after.items() if k != "smoke"} == {k: v for k, v in before.items() if k != "smoke"}
    assert len(before) > 5


def test_any_command_line_gets_an_estimate_without_training(tmp_path, capsys, monkeypatch):
    """``fedbench --estimate``: the runs of any command line (its -m values) x rounds x the measured s/round, in one
    line, and no run made."""
    from conftest import fedbench_main

    monkeypatch.chdir(tmp_path)
    fedbench_main(["--estimate", "-m", "algorithm=fedavg,fedprox", "seed=0,1", "rounds=7", "clients=4"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("fedbench: estimated ") and "4 runs x 7 rounds x " in line, line
    assert not (tmp_path / "outputs").exists()  # nothing ran


class _Fixed(dict):
    """Per-sample costs (train, evaluate) given, not measured: the estimate's arithmetic alone."""

    def __init__(self, train, evaluate):
        super().__init__()
        self.pair = (train, evaluate)

    def __contains__(self, key):
        return True

    def __getitem__(self, key):
        return self.pair


def test_the_estimate_scales_with_local_epochs_and_not_with_seeds():
    """Training only (evaluation free): a round costs E x the E = 1 round, and a swept E = 1,3 costs their mean (2x)
    per run; evaluation only: E changes nothing. Seeds multiply runs, never the cost per run."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fedbench.report.runtime import estimate_overrides

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        go = lambda given, costs: estimate_overrides(  # noqa: E731
            ["rounds=5", "clients=4", *given], lambda o: compose("config", overrides=o, return_hydra_config=True), costs
        )
        one = go(["local_epochs=1", "seed=0,1,2"], _Fixed(1e-3, 0.0))
        three = go(["local_epochs=3"], _Fixed(1e-3, 0.0))
        assert one["runs"] == 3 and three["s_per_round"] == pytest.approx(3 * one["s_per_round"], rel=1e-3)
        both = go(["local_epochs=1,3"], _Fixed(1e-3, 0.0))
        assert both["runs"] == 2 and both["seconds"] == pytest.approx(2 * 2 * 5 * one["s_per_round"], rel=1e-3)
        e1, e3 = go(["local_epochs=1"], _Fixed(0.0, 1e-3)), go(["local_epochs=3"], _Fixed(0.0, 1e-3))
        assert e1["s_per_round"] == e3["s_per_round"] > 0
    GlobalHydra.instance().clear()


def test_the_estimate_counts_only_the_evaluations_the_run_makes():
    """Evaluation only (1 s per sample): the digits' clients' test splits and the global test set, every eval_every
    rounds — the clients' splits not at all with eval.personalized=false (an estimate counted them: pfl-research's
    benchmark shape came out 116x too slow)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fedbench.report.runtime import estimate_overrides

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["clients=4"])
        go = lambda given: estimate_overrides(  # noqa: E731
            ["rounds=5", "clients=4", *given], lambda o: compose("config", overrides=o, return_hydra_config=True),
            _Fixed(0.0, 1.0),
        )  # fmt: skip
        from fedbench.run import Run

        run = Run(cfg, "unused")
        run.setup()
        local = sum(len(t) for t in run.data.test_idx)
        glob = len(run.data.global_test_idx)
        assert local > 0 and glob > 0 and local != glob
        assert go([])["s_per_round"] == pytest.approx((local + glob) * 1.0, rel=1e-3)
        assert go(["eval.personalized=false"])["s_per_round"] == pytest.approx(glob * 1.0, rel=1e-3)
        assert go(["eval.global_model=false"])["s_per_round"] == pytest.approx(local * 1.0, rel=1e-3)
        assert go(["eval_every=4"])["s_per_round"] == pytest.approx((local + glob) * 1.0 / 4, rel=1e-3)
    GlobalHydra.instance().clear()


def test_an_estimate_without_the_dataset_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    """``fedbench --estimate`` builds the command's data to measure it: with no dataset under data_root it says so in
    one line (the key, the value, where it looked) and exits 2, as a run does — the old code printed a traceback."""
    from conftest import fedbench_main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        fedbench_main(["--estimate", "dataset=mnist", f"data_root={tmp_path / 'empty'}", "rounds=2"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("fedbench: invalid config: dataset.root=") and "mnist not found" in err, err
