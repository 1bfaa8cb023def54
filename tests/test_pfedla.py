"""pFedLA: hypernetwork output (layer-wise weights over all clients), layer-wise mixing, the hypernetwork
step as the VJP through the personalized model, and a real round (spec baselines.md; docs/pfl_baselines_b.md)."""
from __future__ import annotations

import torch
from conftest import make_cfg

from fedbench.algorithms.fedala import param_layers
from fedbench.algorithms.pfedla import init_hypernetwork, layer_weights, layerwise_mix
from fedbench.run import Run

FP64 = ["hardware.precision=fp64", "hardware.threads=1"]


def _setup(tmp_path, *overrides) -> Run:
    run = Run(make_cfg("algorithm=pfedla", *FP64, *overrides), tmp_path)
    run.setup()
    return run


def test_pfedla_hypernetwork_output_is_layerwise_weights_over_all_clients():
    hn = init_hypernetwork(K=4, L=3, emb=8, hidden=6, seed=0, k=1, dtype=torch.float64, device="cpu")
    a = layer_weights(hn, torch.tensor(1))
    assert a.shape == (3, 4) and torch.all(a >= 0)
    assert torch.allclose(a.sum(1), torch.ones(3, dtype=torch.float64))
    r = layer_weights(hn, torch.tensor(1), retain=1)                   # HeurpFedLA: one layer keeps θ_1
    kept = int(torch.argmax(a[:, 1]))
    assert torch.equal(r[kept], torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64))
    others = [l for l in range(3) if l != kept]
    assert torch.allclose(r[others], a[others])


def test_pfedla_layerwise_mix_by_hand():
    models = {"a.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "a.bias": torch.tensor([1.0, 3.0]),
              "b.weight": torch.tensor([[10.0], [20.0]])}
    alpha = torch.tensor([[[0.25, 0.75], [1.0, 0.0]]])                # one client, layers a and b
    out = layerwise_mix(models, alpha, param_layers(list(models)))
    assert torch.allclose(out["a.weight"][0], torch.tensor([2.5, 3.5]))
    assert torch.allclose(out["a.bias"][0], torch.tensor(2.5))
    assert torch.allclose(out["b.weight"][0], torch.tensor([10.0]))


def test_pfedla_hypernetwork_step_is_the_vjp_through_the_personalized_model(tmp_path):
    """φ_i ← φ_i − η ∂⟨θ̄_i(φ_i), θ̄_i − θ_i'⟩/∂φ_i, checked against autograd through the full layer-wise mixing."""
    run = _setup(tmp_path, "algorithm.hn_lr=0.01")
    algo, clients = run.algorithm, torch.tensor([1, 3])
    gen = torch.Generator().manual_seed(0)
    for v in algo.P.values():
        v += torch.randn(v.shape, generator=gen, dtype=v.dtype)
    g = {n: torch.randn((2, *v.shape[1:]), generator=gen, dtype=v.dtype) for n, v in algo.P.items()}
    before = {n: v.clone() for n, v in algo.hn.items()}
    expected = {}
    for i, k in enumerate(clients.tolist()):
        h = {n: v[k].clone().requires_grad_(True) for n, v in before.items()}
        alpha = layer_weights(h, torch.tensor(k)).unsqueeze(0)
        mixed = layerwise_mix(algo.P, alpha, algo.layers)
        inner = sum((mixed[n][0] * g[n][i]).sum() for n in mixed)
        grads = torch.autograd.grad(inner, list(h.values()))
        expected[k] = {n: h[n].detach() - 0.01 * gr for n, gr in zip(h, grads)}
    algo.update_hypernetworks(clients, g)
    for k in clients.tolist():
        for n in algo.hn:
            assert torch.allclose(algo.hn[n][k], expected[k][n], atol=1e-12), n
    assert torch.equal(algo.hn["out.weight"][0], before["out.weight"][0])   # other clients' HNs untouched


def test_pfedla_round_stores_trained_models_and_evaluates_the_mixture(tmp_path):
    run = _setup(tmp_path)
    algo = run.algorithm
    algo.keep_local = True
    algo.round(1, torch.tensor([0, 2, 4]))
    trained = algo.last_local[2]
    for n in algo.P:
        assert torch.equal(algo.P[n][[0, 2, 4]], trained.params[n]), n
    p, _ = algo.client_models(torch.arange(5), 1)
    expected = layerwise_mix(algo.P, algo.alphas(torch.arange(5)), algo.layers)
    assert all(torch.allclose(p[n], expected[n], atol=1e-12) for n in p)
    assert not torch.allclose(p["head.0.weight"][1], algo.P["head.0.weight"][1])    # a real mixture
