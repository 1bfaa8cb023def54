"""Helpers shared by the generic-FL baseline tests (tests/test_{fedprox,moon,scaffold,feddyn,fedntd,fedlc,fedbn}.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_cfg

from fedbench.run import Run

FP64 = ["hardware.precision=fp64"]


def setup_run(tmp_path: Path, algo: str, *overrides: str) -> Run:
    """A set-up (not yet trained) run of ``algo`` in fp64 on the embedded digits data."""
    run = Run(make_cfg(f"algorithm={algo}", *FP64, *overrides), tmp_path)
    run.setup()
    return run


def batch(run: Run, client: int = 0, n: int = 16):
    idx = run.data.tensor(run.data.train_idx[client][:n])
    return run.data.x[idx], run.data.y[idx]


def perturbed(model: dict, scale: float, seed: int) -> dict:
    """A copy of ``model`` moved by Gaussian noise (a "trained" model different from ``model``)."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in model.items()}


def states_equal(a, b, tol: float) -> None:
    """Recursively compare algorithm states (tensors, dicts of tensors, None)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            states_equal(a[k], b[k], tol)
    elif torch.is_tensor(a):
        assert torch.allclose(a.to(torch.float64), b.to(torch.float64), atol=tol, rtol=0)
    else:
        assert a == b


def executors_agree_and_it_learns(tmp_path: Path, algo: str, *overrides: str) -> None:
    """Three rounds (tiny CNN with BatchNorm, 3 of 5 clients per round, fp64): both executors give the same
    metrics and the same algorithm state, and the run learns (training loss falls, global accuracy > 0.2,
    chance = 0.1)."""
    runs = {}
    for ex in ("sequential", "vectorized"):
        cfg = make_cfg(
            f"algorithm={algo}",
            "model=tiny_cnn",
            f"hardware.executor={ex}",
            *FP64,
            "rounds=3",
            "participation=0.6",
            *overrides,
        )
        run = Run(cfg, tmp_path / ex)
        runs[ex] = (run, run.execute())
    (seq, a), (vec, b) = runs["sequential"], runs["vectorized"]
    for k in a["metrics"]:
        assert a["metrics"][k]["last"] == pytest.approx(b["metrics"][k]["last"], abs=1e-9), k
    assert a["final"]["pers_client_acc"] == b["final"]["pers_client_acc"]
    states_equal(seq.algorithm.state_dict(), vec.algorithm.state_dict(), 1e-9)
    history = [json.loads(line) for line in (tmp_path / "sequential" / "metrics.jsonl").read_text().splitlines()]
    losses = [h["train/loss"] for h in history if "train/loss" in h]
    assert losses[-1] < losses[0]
    assert a["metrics"]["global/acc"]["last"] > 0.2
