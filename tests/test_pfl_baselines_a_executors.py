"""FedPer, LG-FedAvg, FedBABU, pFedMe, FedProto, FedDistill, FedRoD: a few-round smoke run of each on digits with the
BatchNorm tiny CNN (or the mlp) and partial participation, identical (fp64) with both executors."""

from __future__ import annotations

import pytest
import torch
from conftest import make_cfg

from fedbench.run import Run

BN = "model=tiny_cnn"  # BatchNorm in body and head
METHODS = {
    "fedper": [BN],
    "lgfedavg": [],
    "fedbabu": [BN, "algorithm.ft_epochs=1"],
    "pfedme": ["algorithm.local_steps=3"],
    "fedproto": [BN],
    "feddistill": [],
    "fedrod": [BN, "algorithm.head_scope=head", "optim.persistent_state=true"],
}  # personal head with BN; kept momentum


@pytest.mark.parametrize("algorithm", list(METHODS))
def test_smoke_run_is_identical_with_both_executors(tmp_path, algorithm):
    runs = {}
    for ex in ("sequential", "vectorized"):
        cfg = make_cfg(
            f"algorithm={algorithm}",
            *METHODS[algorithm],
            "hardware.precision=fp64",
            "clients=4",
            "participation=0.75",
            "rounds=2",
            "eval_every=2",
            f"hardware.executor={ex}",
        )
        run = Run(cfg, tmp_path / ex)
        runs[ex] = (run.execute(), run.algorithm)
    (sa, a), (sb, b) = runs["sequential"], runs["vectorized"]
    assert sa["status"] == "complete" and sa["metrics"]["pers/acc"]["best"] > 0.2  # learns (chance: 0.1)
    for key in sa["metrics"]:
        assert sa["metrics"][key]["last"] == pytest.approx(sb["metrics"][key]["last"], abs=1e-9), key
    assert sa["final"]["pers_client_acc"] == sb["final"]["pers_client_acc"]
    for attr in a.state_attrs:
        x, y = getattr(a, attr), getattr(b, attr)
        for k in x if isinstance(x, dict) else {"": x}:
            u, v = (x[k], y[k]) if isinstance(x, dict) else (x, y)
            assert torch.allclose(u.double(), v.double(), atol=1e-10, rtol=0), (attr, k)
