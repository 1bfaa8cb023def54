"""The declared evaluation protocol (issue #34 item 2, fedbench/protocol.py, docs/protocol.md): one ``eval.protocol``
block, resolved and checked before any training, printed in the run header, stated by every paper's experiment
configs with its source, and checked by the report (tests/test_report.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import CONF, fedbench_main, make_cfg
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from fedbench import protocol
from fedbench.config import validate
from fedbench.errors import ConfigError

EXPERIMENTS = sorted(
    str(p.relative_to(CONF / "experiment").with_suffix("")) for p in (CONF / "experiment").glob("*/*.yaml")
)
MODEL_OF_METRIC = {"pers": "personalized", "global": "global", "newclients": "fine-tuned"}


def compose_experiment(exp: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={exp}"])
    GlobalHydra.instance().clear()
    return cfg


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_each_paper_table_states_the_protocol_its_headline_number_uses(exp):
    """The protocol's model and statistic are those of an accuracy the table reports (``pers/acc.best``: personalized,
    best); the source names the paper's section."""
    cfg = compose_experiment(exp)
    table = OmegaConf.select(cfg, "table")
    if table is None:
        pytest.skip(f"{exp} has no table")
    paths = [p for p in table.metrics.values() if p.split("/")[0] in MODEL_OF_METRIC and "." in p]
    if not paths:
        pytest.skip(f"{exp}'s table reports no accuracy ({list(table.metrics.values())})")
    validate(cfg)  # the protocol is one the run delivers
    got = protocol.fields(cfg)
    reported = {(MODEL_OF_METRIC[p.split("/")[0]], p.rsplit(".", 1)[1]) for p in paths}
    assert (got["model"], got["statistic"]) in reported, f"{exp}: the protocol is none of the table's {paths}"
    assert got["test_split"] == str(cfg.partition.test_split)
    paper = {"fedrema": "FedReMa", "ecl": "ECL", "fedka": "FedKA", "fedcom": "FedCOM", "cafeme": "CAFeMe"}[
        exp.split("/")[0]
    ]
    assert str(cfg.eval.protocol.source).startswith(f"{paper} §"), exp


def test_auto_resolves_to_what_the_run_evaluates():
    assert protocol.fields(make_cfg())["model"] == "personalized"
    assert protocol.fields(make_cfg("eval.personalized=false")) == {
        "model": "global",
        "clients": "all",
        "test_split": "local",
        "statistic": "final",
    }
    new = make_cfg("eval.personalized=false", "eval.global_model=false", "eval.new_clients.enabled=true")
    assert protocol.fields(new)["model"] == "fine-tuned" and protocol.fields(new)["clients"] == "new"
    assert protocol.fields(make_cfg("partition=shards", "partition.test_split=matched"))["test_split"] == "matched"


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["eval.protocol.statistic=median"], "eval.protocol.statistic", "best, final, last"),
        (["eval.protocol.model=personal"], "eval.protocol.model", "personalized"),
        (["eval.protocol.model=global", "eval.global_model=false"], "eval.protocol.model", "eval.global_model=true"),
        (["eval.protocol.model=fine-tuned"], "eval.protocol.model", "eval.new_clients.enabled=true"),
        (["eval.protocol.model=fine-tuned", "eval.protocol.clients=all"], "eval.protocol.clients", "new exactly when"),
        (["eval.protocol.clients=new"], "eval.protocol.clients", "new exactly when"),
    ],
)
def test_a_protocol_the_run_cannot_deliver_is_refused_naming_the_key(overrides, key, words):
    with pytest.raises(ConfigError) as e:
        validate(make_cfg(*overrides))
    assert e.value.key == key and words in str(e.value)


def test_the_line_names_model_clients_split_statistic_and_source():
    cfg = make_cfg("clients=7", "rounds=10", "eval.final_window=3", "eval.protocol.source='Paper §4'")
    assert protocol.line(cfg) == (
        "personalized models · all 7 clients · test split local · final (mean of the last 3 evaluations after round 0)"
        " · Paper §4"
    )
    # issue #53: a run shorter than the window averages its whole curve, and says so (7 rounds, every 3rd: 3, 6, 7)
    short = make_cfg("rounds=7", "eval_every=3", "eval.final_window=4")
    assert protocol.final_words(short) == "final (mean of all 3 evaluations after round 0: the whole run)"
    assert protocol.final_words(make_cfg("rounds=7", "eval_every=3", "eval.final_window=2")) == (
        "final (mean of the last 2 evaluations after round 0)"
    )
    ft = make_cfg("algorithm=fedavg_ft", "algorithm.ft_steps=4", "eval.protocol.statistic=best")
    assert protocol.line(ft).startswith("personalized models (the method fine-tunes 4 steps) · all 5 clients")
    assert protocol.line(ft).endswith("best evaluation")
    g = make_cfg("eval.protocol.model=global", "eval.protocol.statistic=last")
    assert protocol.line(g) == "the global model · all 5 clients · the global test set · last evaluation"


def test_differences_name_each_field_and_its_runs():
    a = {"model": "personalized", "clients": "all", "test_split": "local", "statistic": "best"}
    got = protocol.differences({"fedavg": a, "ecl": {**a, "statistic": "last"}, "ditto": a})
    assert got == ["statistic: best (ditto, fedavg) vs last (ecl)"]
    assert protocol.differences({"x": a, "y": dict(a)}) == []


def test_the_run_header_prints_the_protocol(tmp_path):
    run_dir = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "fedbench.cli", "dataset=digits", "clients=4", "rounds=1", "logger=none",
         "hardware.threads=1", "eval.protocol.statistic=best", f"hydra.run.dir={run_dir}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    want = "fedbench: protocol: personalized models · all 4 clients · test split local · best evaluation"
    assert want in (run_dir / "run.log").read_text()  # the console's lines (logger=none prints none)


def test_the_protocol_does_not_change_a_runs_fingerprint():
    """A run made before eval.protocol existed (or with another statistic) is the same computation: re-running its
    command skips or resumes it instead of refusing a "different config"."""
    from fedbench.checkpoint import fingerprint

    cfg = make_cfg()
    older = OmegaConf.create(OmegaConf.to_container(cfg))
    del older.eval.protocol
    assert fingerprint(older) == fingerprint(cfg) == fingerprint(make_cfg("eval.protocol.statistic=best"))
    assert fingerprint(make_cfg("eval.final_window=4")) != fingerprint(cfg)  # what the run computes still counts


def test_the_report_prints_the_protocol_and_refuses_to_mix_two_in_one_column(tmp_path, capsys):
    from fedbench.report import main as report_main

    common = ["dataset=digits", "clients=4", "rounds=2", "logger=none", "hardware.threads=1"]
    fedbench_main(
        ["-m", "algorithm=fedavg", "eval.protocol.statistic=best", *common, f"hydra.sweep.dir={tmp_path / 'a'}"]
    )
    fedbench_main(["-m", "algorithm=fedper", *common, f"hydra.sweep.dir={tmp_path / 'b'}"])
    capsys.readouterr()
    both = [str(tmp_path / "a"), str(tmp_path / "b"), "--no-wandb", "--no-plots"]
    assert report_main([*both, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "differ in their evaluation protocol — statistic: best (fedavg) vs final (fedper)" in err
    )
    assert "--mixed-protocols" in err and not (tmp_path / "r").exists()
    assert report_main([*both, "--out", str(tmp_path / "r"), "--mixed-protocols"]) == 0
    md = (tmp_path / "r" / "runs_pers_acc.md").read_text()
    assert "Protocol: mixed protocols: statistic: best (fedavg) vs final (fedper)." in md
    assert report_main([str(tmp_path / "b"), "--no-wandb", "--no-plots", "--out", str(tmp_path / "rb")]) == 0
    md = (tmp_path / "rb" / "runs_pers_acc.md").read_text()
    want = "Protocol: personalized models · all 4 clients · test split local · final (mean of all 2 evaluations after"
    assert "| Method | Best | Final (all 2 evals) |" in md  # issue #53: a 2-round run's final is its whole curve
    assert want in md and "protocol: personalized models · all 4 clients" in capsys.readouterr().out
