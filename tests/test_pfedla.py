"""pFedLA: hypernetwork output (layer-wise weights over all clients), layer-wise mixing, the hypernetwork
step as the VJP through the personalized model, and a real round (docs/pfl_baselines_b.md)."""

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
    r = layer_weights(hn, torch.tensor(1), retain=1)  # HeurpFedLA: one layer keeps θ_1
    kept = int(torch.argmax(a[:, 1]))
    assert torch.equal(r[kept], torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64))
    others = [l for l in range(3) if l != kept]
    assert torch.allclose(r[others], a[others])


def test_pfedla_layerwise_mix_by_hand():
    models = {
        "a.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        "a.bias": torch.tensor([1.0, 3.0]),
        "b.weight": torch.tensor([[10.0], [20.0]]),
    }
    alpha = torch.tensor([[[0.25, 0.75], [1.0, 0.0]]])  # one client, layers a and b
    out = layerwise_mix(models, alpha, param_layers(list(models)))
    assert torch.allclose(out["a.weight"][0], torch.tensor([2.5, 3.5]))
    assert torch.allclose(out["a.bias"][0], torch.tensor(2.5))
    assert torch.allclose(out["b.weight"][0], torch.tensor([10.0]))


def test_pfedla_hypernetwork_step_is_the_vjp_through_the_personalized_model(tmp_path):
    """φ_i ← φ_i − η ∂⟨θ̄_i(φ_i), Δθ_i⟩/∂φ_i (the default sign, Δθ_i = θ_i' − θ̄_i), checked against autograd
    through the full layer-wise mixing."""
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
    assert torch.equal(algo.hn["out.weight"][0], before["out.weight"][0])  # other clients' HNs untouched


def test_pfedla_round_stores_trained_models_and_evaluates_the_mixture(tmp_path):
    run = _setup(tmp_path)
    algo = run.algorithm
    seen = {}  # the round's last result per phase (Context.observers)
    run.ctx.observers.append(lambda t, ids, res, phase: seen.update({phase: res}))
    algo.round(1, torch.tensor([0, 2, 4]))
    trained = seen["train"]
    for n in algo.P:
        assert torch.equal(algo.P[n][[0, 2, 4]], trained.params[n]), n
    p, _ = algo.client_models(torch.arange(5), 1)
    expected = layerwise_mix(algo.P, algo.alphas(torch.arange(5)), algo.layers)
    assert all(torch.allclose(p[n], expected[n], atol=1e-12) for n in p)
    assert not torch.allclose(p["head.0.weight"][1], algo.P["head.0.weight"][1])  # a real mixture


def _transparent_hypernetworks(algo, out_weight: torch.Tensor) -> None:
    """Hypernetworks whose MLP passes z = 1 through (embedding 1, width 1, weights 1, biases 0), so the raw
    layer-wise weights are exactly ``out_weight`` [K, L, N] (all positive) and α_i^l = out_weight[i, l] / its sum."""
    K, L, N = out_weight.shape
    one = lambda *s: torch.ones(K, *s, dtype=torch.float64)  # noqa: E731
    algo.hn = {
        "embedding": one(1),
        **{f"mlp{i}.weight": one(1, 1) for i in range(3)},
        **{f"mlp{i}.bias": torch.zeros(K, 1, dtype=torch.float64) for i in range(3)},
        "out.weight": out_weight.unsqueeze(-1).clone(),
        "out.bias": torch.zeros(K, L, N, dtype=torch.float64),
    }


def test_pfedla_hypernetwork_update_follows_the_pfedla_code_sign_by_hand(tmp_path):
    """A real round on 3 clients (2 participate). With α_i^l = r_il / S_il (r = the raw output weights), the
    chain rule gives ∂θ̄_i^l/∂r_ilj = (θ_j^l − θ̄_i^l)/S_il, so the pFedLA code's step (KarhouTam/pFedLA
    ``update_hypernetwork``, FL-bench ``pfedla``: φ ← φ − η_hn J^T Δθ with the uploaded Δθ_i = θ_i' − θ̄_i)
    moves r_ilj by −η_hn ⟨θ_j^l − θ̄_i^l, Δθ_i^l⟩ / S_il; ``hn_update=pfedhn`` (pFedHN's sign) by the opposite.
    The embedding and MLP do not change (α does not depend on the scale of z)."""
    eta = 0.3
    for convention, sign in ((None, -1.0), ("pfedhn", 1.0)):  # None: the default (the pFedLA code)
        option = [f"algorithm.hn_update={convention}"] if convention else []
        run = _setup(
            tmp_path / str(convention),
            "clients=3",
            "algorithm.embedding_dim=1",
            "algorithm.hidden_dim=1",
            f"algorithm.hn_lr={eta}",
            *option,
        )
        algo = run.algorithm
        gen = torch.Generator().manual_seed(1)
        for v in algo.P.values():  # three different stored models
            v += 0.3 * torch.randn(v.shape, generator=gen, dtype=v.dtype)
        r = torch.tensor(
            [
                [[1.0, 2.0, 3.0], [4.0, 1.0, 1.0]],
                [[2.0, 2.0, 1.0], [1.0, 5.0, 2.0]],
                [[1.0, 1.0, 6.0], [3.0, 2.0, 1.0]],
            ],
            dtype=torch.float64,
        )  # [K, L=2 layers of the mlp, N]
        assert len(algo.layers) == 2
        _transparent_hypernetworks(algo, r)
        stored = {n: v.clone() for n, v in algo.P.items()}
        clients = torch.tensor([2, 0])
        algo.round(1, clients)
        for i in clients.tolist():
            for l, names in enumerate(algo.layers):
                S = r[i, l].sum()
                mixed = {n: sum(r[i, l, j] / S * stored[n][j] for j in range(3)) for n in names}  # θ̄_i^l (Eq. 3)
                delta = {n: algo.P[n][i] - mixed[n] for n in names}  # Δθ_i^l
                for j in range(3):
                    inner = sum(((stored[n][j] - mixed[n]) * delta[n]).sum() for n in names)
                    expected = r[i, l, j] + sign * eta * inner / S
                    assert torch.allclose(algo.hn["out.weight"][i, l, j, 0], expected, atol=1e-10), (
                        convention,
                        i,
                        l,
                        j,
                    )
        assert torch.equal(algo.hn["out.weight"][1], r[1].unsqueeze(-1))  # client 1 did not take part
        assert torch.allclose(algo.hn["embedding"], torch.ones(3, 1, dtype=torch.float64), atol=1e-12)
