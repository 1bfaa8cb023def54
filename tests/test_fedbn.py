"""FedBN: BatchNorm parameters and statistics are never averaged (they stay with their client), everything
else is FedAvg; on a net without BN it is FedAvg; executors agree."""

from __future__ import annotations

import pytest
import torch
from baseline_checks import executors_agree_and_it_learns, setup_run
from conftest import make_cfg, run_cfg

from fedbench.algorithms.fedbn import batchnorm_names
from fedbench.engine.stack import weighted_mean


def test_batchnorm_names_of_tiny_cnn(tmp_path):
    fm = setup_run(tmp_path, "fedbn", "model=tiny_cnn").fm
    params, buffers = batchnorm_names(fm.net)
    assert params == ["body.1.weight", "body.1.bias", "body.5.weight", "body.5.bias", "head.1.weight", "head.1.bias"]
    assert set(buffers) == {
        f"{m}.{s}"
        for m in ("body.1", "body.5", "head.1")
        for s in ("running_mean", "running_var", "num_batches_tracked")
    }
    assert batchnorm_names(setup_run(tmp_path / "mlp", "fedbn", "model=mlp").fm.net) == ([], [])


def test_bn_entries_stay_local_and_the_rest_is_fedavg(tmp_path):
    """Two rounds with different participants: after each, every participant's BN params/statistics are
    exactly its own local-training result, absentees keep theirs, and every non-BN entry is the n_k-weighted
    mean of the participants' results (the BN entries never enter any average)."""
    run = setup_run(tmp_path, "fedbn", "model=tiny_cnn")
    algo = run.algorithm
    bn_p, bn_b = batchnorm_names(run.fm.net)
    for t, clients in ((1, torch.tensor([0, 2, 3])), (2, torch.tensor([1, 2]))):
        before_p = {k: v.clone() for k, v in algo.local_w.items()}
        before_b = {k: v.clone() for k, v in algo.local_bn.items()}
        ref = algo.local_train(t, clients, algo.client_models(clients, t), algo.train_spec)  # the round's own training
        algo.round(t, clients)
        others = [k for k in range(algo.K) if k not in clients.tolist()]
        for k in bn_p:
            assert torch.equal(algo.local_w[k][clients], ref.params[k])
            assert torch.equal(algo.local_w[k][others], before_p[k][others])
        for k in bn_b:
            assert torch.equal(algo.local_bn[k][clients], ref.buffers[k])
            assert torch.equal(algo.local_bn[k][others], before_b[k][others])
        avg = weighted_mean(ref.params, algo.n[clients])
        for k in algo.w:
            if k not in bn_p:
                assert torch.allclose(algo.w[k], avg[k], atol=1e-12, rtol=0), k
    # personalized models: shared weights identical across clients, BN statistics differ client to client
    p, b = algo.client_models(torch.arange(algo.K), 3)
    assert torch.equal(p["body.0.weight"][0], p["body.0.weight"][4])
    assert not torch.allclose(b["body.1.running_mean"][0], b["body.1.running_mean"][2])
    assert not torch.allclose(p["body.1.weight"][1], p["body.1.weight"][2])


def test_without_batchnorm_fedbn_is_fedavg(tmp_path):
    res = {
        a: run_cfg(make_cfg(f"algorithm={a}", "model=mlp", "hardware.precision=fp64", "rounds=2"), tmp_path / a)
        for a in ("fedavg", "fedbn")
    }
    for k, v in res["fedavg"]["metrics"].items():
        assert res["fedbn"]["metrics"][k]["last"] == pytest.approx(v["last"], abs=1e-12), k


def test_sequential_equals_vectorized_and_it_learns(tmp_path):
    executors_agree_and_it_learns(tmp_path, "fedbn")
