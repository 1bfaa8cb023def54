"""Every paper experiment config run WITHOUT -m is a real cell of its table: the dataset and model of the sweep's first
cell, and a value of every swept key that the sweep itself contains (no silent fallback to the defaults)."""

from __future__ import annotations

import pytest
from conftest import CONF
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from fedbench.cli import table_note

# conf/experiment/<paper>/<name>.yaml; deeper folders (setting/, ...) hold the pieces those configs include
EXPERIMENTS = sorted(
    str(p.relative_to(CONF / "experiment").with_suffix("")) for p in (CONF / "experiment").glob("*/*.yaml")
)


@pytest.fixture(scope="module")
def composer():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield lambda *ov: compose("config", overrides=list(ov), return_hydra_config=True)
    GlobalHydra.instance().clear()


def _sweep(cfg) -> list[tuple[str, list[str]]]:
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return [
        (
            o.input_line.split("=", 1)[0],
            [str(v) for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line.split("=", 1)[1]],
        )
        for o in parsed
    ]


def test_every_paper_experiment_is_checked():
    assert {e.split("/")[0] for e in EXPERIMENTS} >= {"fedrema", "ecl", "fedka", "fedcom", "cafeme"}
    assert {"fedrema/table1", "fedcom/table1", "ecl/table2", "fedka/table1"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_an_experiment_without_m_runs_its_first_cells_dataset_and_model(composer, exp):
    plain = composer(f"+experiment={exp}")
    sweep = _sweep(plain)
    first = composer(f"+experiment={exp}", *(f"{k}={vals[0]}" for k, vals in sweep))
    assert (plain.dataset.name, plain.model.name) == (first.dataset.name, first.model.name), exp
    assert OmegaConf.to_container(plain.dataset) == OmegaConf.to_container(first.dataset), exp
    choices = plain.hydra.runtime.choices
    for key, vals in sweep:
        if key.startswith("+"):  # an appended config (e.g. FedReMa Table 1's dataset columns): compare what it sets
            continue
        value = choices[key] if key in choices else str(OmegaConf.select(plain, key))
        assert value in vals, f"{exp}: without -m, {key}={value} is not one of the table's values {vals}"


def test_table1_columns_still_compose_each_dataset_with_its_model(composer):
    for setting, model, mu, channels in (
        ("mnist", "cnn", 1, 1),
        ("fashionmnist", "cnn", 1, 1),
        ("cifar10", "alexnet", 5, 3),
    ):
        cfg = composer("+experiment=fedrema/table1", f"+experiment/fedrema/setting@_global_={setting}")
        assert (cfg.dataset.name, cfg.hydra.runtime.choices.model) == (setting, model)
        assert cfg.rema_moon_mu == mu and len(cfg.dataset.normalize.mean) == channels


def test_a_table_run_without_m_says_what_it_runs():
    note = table_note(["+experiment=fedrema/table1", "seed=0"])
    assert note is not None and "-m" in note and "fedrema/table1" in note and "\n" not in note
    assert table_note(["-m", "+experiment=fedrema/table1"]) is None
    assert table_note(["algorithm=fedavg"]) is None
    assert table_note(["+experiment=fedrema/figure3"]) is None  # a single run, not a sweep
