"""FedALA: the projected weight step of adaptive local aggregation on the top layers only, the start
phase, and the layer grouping (docs/pfl_baselines_b.md)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from conftest import make_cfg

from fedbench import seeding
from fedbench.algorithms.fedala import param_layers
from fedbench.engine.stack import rows
from fedbench.run import Run

FP64 = ["hardware.precision=fp64", "hardware.threads=1"]


def _setup(tmp_path, *overrides) -> Run:
    run = Run(make_cfg("algorithm=fedala", *FP64, *overrides), tmp_path)
    run.setup()
    return run


def _ala_run(tmp_path, *overrides) -> Run:
    run = _setup(tmp_path, "batch_size=10000", *overrides)  # one batch = one W step per ALA epoch
    algo = run.algorithm
    g = torch.Generator().manual_seed(1)
    for k, v in algo.P.items():  # client models differ from the global one
        v += 0.3 * torch.randn(v.shape, generator=g, dtype=v.dtype)
    return run


def test_fedala_weight_step_is_clipped_and_touches_only_the_top_layers(tmp_path):
    """Non-start phase, one batch: W = clip(1 − η ∇_θ̂ CE ⊙ (θ_g − θ_k), 0, 1) on the top layer (θ̂ = θ_g there
    at W = 1); the lower layer of θ̂ is exactly θ_g; θ̂_top = θ_k + (θ_g − θ_k) ⊙ W."""
    eta = 50.0
    run = _ala_run(tmp_path, f"algorithm.eta={eta}")
    algo, data = run.algorithm, run.data
    assert algo.top == ["head.0.weight", "head.0.bias"]  # p = 1: the last Linear (2 tensors)
    algo.started[:] = True
    k = 2
    local, glob = rows(algo.P, torch.tensor([k])), algo.w
    sample = np.sort(
        seeding.rng(algo.seed, "ala_sample", 1, k).choice(
            data.train_idx[k], int(0.8 * len(data.train_idx[k])), replace=False
        )
    )
    idx = data.tensor(sample)
    theta = {n: glob[n].clone().requires_grad_(n in algo.top) for n in glob}
    ce = F.cross_entropy(run.fm(theta, algo.bn, data.x[idx]), data.y[idx])
    grads = dict(zip(algo.top, torch.autograd.grad(ce, [theta[n] for n in algo.top])))
    theta_hat, _ = algo.adaptive_local_aggregation(1, torch.tensor([k]))
    clipped = 0
    for n in algo.top:
        delta = glob[n] - local[n][0]
        W = torch.clamp(1 - eta * grads[n] * delta, 0, 1)
        assert torch.allclose(algo.W[n][k], W, atol=1e-10), n
        assert torch.allclose(theta_hat[n][0], local[n][0] + delta * W, atol=1e-10), n
        clipped += int(((1 - eta * grads[n] * delta) < 0).sum() + ((1 - eta * grads[n] * delta) > 1).sum())
    assert clipped > 0  # the projection was really exercised
    for n in glob:
        if n not in algo.top:
            assert torch.equal(theta_hat[n][0], glob[n]), n
    assert torch.equal(algo.W["head.0.weight"][0], torch.ones_like(algo.W["head.0.weight"][0]))  # others untouched


def test_fedala_start_phase_trains_weights_until_losses_settle(tmp_path):
    """First ALA of a client: epochs until len(losses) > num_pre_loss and their std < threshold (or the cap);
    afterwards one epoch per round; a client whose model equals the global one is skipped."""
    run = _ala_run(tmp_path, "algorithm.num_pre_loss=4", "algorithm.threshold=1e9")
    algo = run.algorithm
    _, m1 = algo.adaptive_local_aggregation(1, torch.tensor([0, 1]))
    assert m1["fedala/epochs"] == 5 and algo.started[:2].all()
    _, m2 = algo.adaptive_local_aggregation(2, torch.tensor([0, 1]))
    assert m2["fedala/epochs"] == 1
    capped = _ala_run(tmp_path / "cap", "algorithm.threshold=1e-12", "algorithm.max_start_epochs=7").algorithm
    assert capped.adaptive_local_aggregation(1, torch.tensor([3]))[1]["fedala/epochs"] == 7
    fresh = _setup(tmp_path / "fresh").algorithm
    theta_hat, m = fresh.adaptive_local_aggregation(1, torch.tensor([0]))
    assert m == {} and not fresh.started[0]
    assert all(torch.equal(theta_hat[n][0], fresh.w[n]) for n in fresh.w)


def test_param_layers_group_tensors_by_module():
    assert param_layers(["body.1.weight", "body.1.bias", "body.3.weight", "head.0.weight", "head.0.bias"]) == [
        ["body.1.weight", "body.1.bias"],
        ["body.3.weight"],
        ["head.0.weight", "head.0.bias"],
    ]
