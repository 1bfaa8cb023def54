"""FedPAC, FedALA, FedFomo, pFedLA together: sequential == vectorized whole rounds in fp64 (each method's own
local phases and server rule), that the run learns, resume == uninterrupted, and config checks.
The defining mechanisms are tested in test_fedpac.py, test_fedala.py, test_fedfomo.py and test_pfedla.py
(docs/pfl_baselines_b.md)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_cfg

from fedbench.errors import ConfigError
from fedbench.run import Run

FP64 = ["hardware.precision=fp64", "hardware.threads=1"]

STATE = {
    "fedpac": ("theta", "phi", "centroids"),
    "fedala": ("w", "P", "W"),
    "fedfomo": ("P", "affinity"),
    "pfedla": ("P", "hn"),
}


@pytest.mark.parametrize("algo", sorted(STATE))
def test_sequential_equals_vectorized_and_the_run_learns(tmp_path, algo):
    """A few whole rounds (each method's own local phases and server rule) match across executors in fp64;
    the personalized models learn (10 digit classes: chance is 0.1; 2 short rounds)."""
    algos, summaries = {}, {}
    for ex in ("sequential", "vectorized"):
        run = Run(
            make_cfg(f"algorithm={algo}", *FP64, "rounds=2", "participation=0.8", f"hardware.executor={ex}"),
            tmp_path / ex,
        )
        summaries[ex] = run.execute()
        algos[ex] = run.algorithm
    for attr in STATE[algo]:
        a, b = getattr(algos["sequential"], attr), getattr(algos["vectorized"], attr)
        for k in a if isinstance(a, dict) else [None]:
            x, y = (a[k], b[k]) if k is not None else (a, b)
            assert torch.allclose(x, y, atol=1e-9, rtol=0), (attr, k)
    assert summaries["sequential"]["status"] == "complete"
    assert summaries["sequential"]["metrics"]["pers/acc"]["best"] > 0.3


@pytest.mark.parametrize(
    "algo,key,value",
    [
        ("fedpac", "head_scope", "all"),
        ("fedpac", "lam", -1),
        ("fedala", "rand_percent", 0),
        ("fedala", "top_layers", 9),
        ("fedfomo", "val_fraction", 1.0),
        ("fedfomo", "M", 0),
        ("pfedla", "hn_lr", 0),
        ("pfedla", "retain_layers", -1),
    ],
)
def test_bad_hyperparameters_fail_in_setup(tmp_path, algo, key, value):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        Run(make_cfg(f"algorithm={algo}", *FP64, f"algorithm.{key}={value}"), tmp_path).setup()


@pytest.mark.parametrize("algo", sorted(STATE))
def test_resumed_run_equals_uninterrupted(tmp_path, algo):
    """``state_attrs`` hold the whole method state: a run resumed from its round-1 checkpoint ends where the
    uninterrupted run ended (FedALA's weights/start flags, FedFomo's affinity, pFedLA's hypernetworks, ...)."""
    args = [f"algorithm={algo}", *FP64, "rounds=2", "checkpoint.every=1", "checkpoint.keep_complete=1"]
    full = Run(make_cfg(*args), tmp_path)
    full.execute()  # leaves the round-1 checkpoint
    assert (tmp_path / "checkpoints" / "round_000001.pt").exists()  # kept (checkpoint.keep_complete=1)
    (tmp_path / "summary.json").unlink()  # as if it had been killed during round 2
    status = json.loads((tmp_path / "status.json").read_text())
    (tmp_path / "status.json").write_text(json.dumps({**status, "status": "running"}))
    resumed = Run(make_cfg(*args, "resume=true"), tmp_path)
    resumed.execute()
    first = [next(h["time/round"] for h in r.history if h["round"] == 1) for r in (full, resumed)]
    assert first[0] == first[1]  # round 1 was restored from the checkpoint, not re-run
    for attr in STATE[algo]:
        a, b = getattr(full.algorithm, attr), getattr(resumed.algorithm, attr)
        for k in a if isinstance(a, dict) else [None]:
            x, y = (a[k], b[k]) if k is not None else (a, b)
            assert torch.equal(x, y), (attr, k)
