"""fedbench/hydra_cache.py: each config file parsed once per process gives the configs Hydra composes without it;
an edited file is read again; what one compose does to a loaded file (Hydra takes its defaults list out) never
reaches the next."""

import os

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.sources_registry import SourcesRegistry
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from fedbench import hydra_cache
from fedbench.cli import CONF_DIR

# nested groups (@_global_ arms and columns), + and ~, sweeps' first values: one of each paper and the plain run
CASES = [
    [],
    ["algorithm=fedrema", "partition=shards"],
    ["+experiment=fedrema/table1", "algorithm=ditto"],
    ["+experiment=fedka/table1", "experiment/fedka/arm@_global_=fedka_0.01"],
    ["+experiment=ecl/table1", "algorithm=ecl", "~dataset.augment"],
    ["+experiment=fedcom/table2", "algorithm.top_x=5"],
    ["+experiment=cafeme/table1", "experiment/cafeme/column@_global_=rmnist_dirichlet"],
]


def _composed(overrides: list[str]) -> dict:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    out = OmegaConf.to_container(cfg, resolve=False)
    out["hydra"].pop("runtime", None)  # its cwd/output dir are per call; the choices are compared below
    return out | {"choices": dict(cfg.hydra.runtime.choices)}


@pytest.fixture
def uncached():
    """Compose as Hydra does without the cache (its own loader, restored afterwards)."""
    hydra_cache.install()
    cls = SourcesRegistry.instance().resolve("file")
    cached = cls.load_config
    assert cached.fedbench_cache, "the cache is installed (conftest and the fedbench command do it)"

    class Off:
        def __enter__(self):
            cls.load_config = cached.uncached

        def __exit__(self, *exc):
            cls.load_config = cached

    return Off()


@pytest.mark.parametrize("overrides", CASES, ids=[" ".join(c) or "config" for c in CASES])
def test_cached_composes_equal_hydras_own_and_each_other(overrides, uncached):
    first, second = _composed(overrides), _composed(overrides)  # the second entirely from the cache
    with uncached:
        own = _composed(overrides)
    assert first == own and second == own
    assert own["choices"]["algorithm"] and "defaults" not in own  # the defaults list was taken out (a copy each time)


def test_a_file_is_parsed_once_and_read_again_when_it_changes(tmp_path):
    hydra_cache.install()
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - model: small\n  - _self_\nrounds: 3\n")
    (conf / "model" / "small.yaml").write_text("width: 16\n")

    def width_rounds():
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = compose("config")
        GlobalHydra.instance().clear()
        return cfg.model.width, cfg.rounds

    before = len(hydra_cache._PARSED)
    assert width_rounds() == (16, 3)
    assert len(hydra_cache._PARSED) == before + 2
    assert width_rounds() == (16, 3) and len(hydra_cache._PARSED) == before + 2  # nothing parsed again
    (conf / "model" / "small.yaml").write_text("width: 128\n")  # another size
    assert width_rounds() == (128, 3)
    small = conf / "model" / "small.yaml"
    st = small.stat()
    small.write_text("width: 512\n")  # the same size: told apart by its mtime
    os.utime(small, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert width_rounds() == (512, 3)
