"""One documented behaviour for a local batch of ONE sample when the model's BatchNorm cannot normalise it (issue 35.3,
README "Top-level keys"): every method, under both executors, drops that step as ``drop_last`` would, trains the rest
and says so once — none crashes. The executor-level rule itself (counts, equal steps in both executors, a client
left without steps keeps its model) is pinned in test_vectorized.py."""

from __future__ import annotations

import importlib.util
import logging

import pytest
from conftest import REPO, make_cfg

from fedbench.run import Run

_spec = importlib.util.spec_from_file_location("golden", REPO / "scripts" / "golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

SETTING = ("rounds=1", "local_epochs=1", "drop_last=false", "checkpoint.final_model=false")


def _cfg(algorithm: str, *extra: str):
    few = ["algorithm.clusters=3"] if algorithm.startswith("ifca") else []  # at most one cluster per client (#54)
    return make_cfg(
        f"algorithm={algorithm}",
        "model=tiny_cnn",
        "clients=3",
        *golden.EXTRA.get(algorithm, []),
        *few,
        *SETTING,
        *extra,
    )


_SIZES: dict = {}  # the federation's train sizes and whether its model fails on one sample, per golden EXTRA


def _federation(algorithm: str, tmp_path) -> tuple[list[int], bool]:
    key = tuple(golden.EXTRA.get(algorithm, []))
    if key not in _SIZES:
        probe = Run(_cfg(algorithm), tmp_path / "probe")
        probe.setup()
        _SIZES[key] = [len(i) for i in probe.data.train_idx], probe.fm.batch_of_one_fails(probe.data.x)
    return _SIZES[key]


@pytest.mark.parametrize("algorithm", golden.algorithms())
def test_every_method_drops_a_one_sample_batch_under_both_executors(tmp_path, algorithm, caplog):
    sizes, fails = _federation(algorithm, tmp_path)  # tiny CNN: its BatchNorm1d head cannot train on one sample
    assert fails or algorithm == "cafeme"  # CAFeMe's own model normalises with batch statistics, no error
    batch = max(sizes) - 1  # the largest client's epoch: one batch of n − 1 samples, then one of ONE sample
    for executor in ("sequential", "vectorized"):
        caplog.clear()
        run = Run(_cfg(algorithm, f"batch_size={batch}", f"hardware.executor={executor}"), tmp_path / executor)
        with caplog.at_level(logging.WARNING, logger="fedbench.engine.executor"):
            summary = run.execute()
        assert summary["status"] == "complete", (algorithm, executor)
        said = [r.getMessage() for r in caplog.records if "of a single sample" in r.getMessage()]
        assert len(said) == (1 if run.executor.dropped_samples else 0), (algorithm, executor, said)
        assert fails or not run.executor.dropped_samples
