"""Per-FedAvg: the HF / FO update against a hand computation, the finite-difference Hessian term
against an exact Hessian-vector product, and executor equivalence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_cfg

from fedbench.engine.schedule import make_schedule
from fedbench.run import Run

BASE = [
    "algorithm=perfedavg",
    "model=tiny_cnn",
    "model.batch_norm=false",
    "hardware.precision=fp64",
    "clients=6",
    "batch_size=8",
]


def _run(tmp_path, *overrides) -> Run:
    run = Run(make_cfg(*BASE, *overrides), tmp_path)
    run.setup()
    return run


def _batches(run, k, n):
    pack = make_schedule([run.data.train_idx[k]], [k], 8, run.algorithm.seed, "train", 1, steps=1, batches_per_step=n)[
        0
    ][0]
    return run.data.x[pack].unflatten(0, (n, -1)), run.data.y[pack].unflatten(0, (n, -1))


def _grad(fm, p, x, y, create_graph=False):
    q = {n: v if v.requires_grad else v.clone().requires_grad_(True) for n, v in p.items()}
    g = torch.autograd.grad(F.cross_entropy(fm(q, {}, x), y), list(q.values()), create_graph=create_graph)
    return dict(zip(q, g))


@pytest.mark.parametrize("variant", ["hf", "fo"])
def test_one_local_iteration_equals_hand_computation(tmp_path, variant):
    """θ̃ = θ − α∇f(θ;D); g = ∇f(θ̃;D'); HF: θ − β(g − α[∇f(θ+δg;D'') − ∇f(θ−δg;D'')]/2δ); FO: θ − βg."""
    alpha, beta, delta, k = 0.1, 0.05, 1e-3, 4
    run = _run(
        tmp_path,
        f"algorithm.alpha={alpha}",
        f"algorithm.beta={beta}",
        f"algorithm.delta={delta}",
        "algorithm.local_steps=1",
        f"algorithm.variant={variant}",
    )
    fm, theta = run.fm, {n: v.clone() for n, v in run.algorithm.w.items()}
    xs, ys = _batches(run, k, 3 if variant == "hf" else 2)
    g0 = _grad(fm, theta, xs[0], ys[0])
    g = _grad(fm, {n: theta[n] - alpha * g0[n] for n in theta}, xs[1], ys[1])
    d = g
    if variant == "hf":
        plus = _grad(fm, {n: theta[n] + delta * g[n] for n in theta}, xs[2], ys[2])
        minus = _grad(fm, {n: theta[n] - delta * g[n] for n in theta}, xs[2], ys[2])
        d = {n: g[n] - alpha * (plus[n] - minus[n]) / (2 * delta) for n in g}
    run.algorithm.round(1, torch.tensor([k]))
    for n in theta:
        assert torch.allclose(run.algorithm.w[n], theta[n] - beta * d[n], atol=1e-12, rtol=0), n


def test_finite_difference_term_is_the_hessian_vector_product(tmp_path):
    """The HF correction [∇f(θ+δg) − ∇f(θ−δg)]/2δ equals ∇²f(θ)·g up to O(δ²) (Per-FedAvg §4)."""
    run = _run(tmp_path, "algorithm.delta=1e-4")
    algo, fm = run.algorithm, run.fm
    xs, ys = _batches(run, 2, 3)
    theta = {n: v.clone() for n, v in algo.w.items()}
    d, _ = algo.direction(theta, {}, xs, ys)
    g0 = _grad(fm, theta, xs[0], ys[0])
    g = _grad(fm, {n: theta[n] - algo.alpha * g0[n] for n in theta}, xs[1], ys[1])
    q = {n: v.clone().requires_grad_(True) for n, v in theta.items()}
    grads = _grad(fm, q, xs[2], ys[2], create_graph=True)
    hv = torch.autograd.grad(sum((grads[n] * g[n]).sum() for n in q), list(q.values()))
    for n, h in zip(q, hv):
        assert torch.allclose((g[n] - d[n]) / algo.alpha, h, atol=1e-6, rtol=1e-5), n
    assert max(h.abs().max().item() for h in hv) > 1e-3  # a real curvature term


def test_sequential_equals_vectorized(tmp_path):
    ws = []
    for ex in ("sequential", "vectorized"):
        run = _run(tmp_path / ex, f"hardware.executor={ex}", "algorithm.local_steps=2")
        run.algorithm.round(1, torch.tensor([0, 3, 5]))
        ws.append(run.algorithm.w)
    for n in ws[0]:
        assert torch.allclose(ws[0][n], ws[1][n], atol=1e-12, rtol=0), n


def test_default_perfedavg_learns_on_shards(tmp_path):
    """The default budget (τ = 10 HF iterations per round with β = the run's lr, and Per-FedAvg's personalized model
    = one α-step from the global model) learns in 3 rounds on the label-sorted shards (2 classes per client). The old
    default (the CAF code's 5 iterations at β = 0.001, scored without the personalization step) stayed at chance."""
    summary = Run(make_cfg("algorithm=perfedavg", "partition=shards"), tmp_path).execute()
    assert summary["metrics"]["pers/acc"]["best"] > 0.6


def test_personalized_model_is_one_alpha_step_from_the_global_model(tmp_path):
    """Per-FedAvg's personalized model θ_k = θ − α∇f_k(θ; D) (one step on one of its batches, lr α, not β)."""
    alpha, beta, k = 0.3, 0.01, 2
    run = _run(tmp_path, f"algorithm.alpha={alpha}", f"algorithm.beta={beta}", "algorithm.eval_steps=1")
    algo = run.algorithm
    theta = {n: v.clone() for n, v in algo.w.items()}
    i = make_schedule([run.data.train_idx[k]], [k], 8, algo.seed, "personalize", 1, steps=1)[0][0]
    g = _grad(run.fm, theta, run.data.x[i], run.data.y[i])
    P, _ = algo.client_models(torch.tensor([k]), 1)
    for n in theta:
        assert torch.allclose(P[n][0], theta[n] - alpha * g[n], atol=1e-12, rtol=0), n


def test_rema_variant_is_pflibs_first_order_epochs(tmp_path):
    """perfedavg_rema = PFLlib's clientperavg: FO, local_epochs passes with one iteration per 2 batches, α = lr."""
    run = Run(
        make_cfg(
            "algorithm=perfedavg_rema",
            "model=tiny_cnn",
            "model.batch_norm=false",
            "hardware.precision=fp64",
            "clients=6",
            "batch_size=8",
            "local_epochs=2",
            "lr=0.2",
        ),
        tmp_path,
    )
    run.setup()
    algo = run.algorithm
    assert (algo.variant, algo.alpha, algo.local_steps) == ("fo", 0.2, None)
    seen = {}  # the round's last result per phase (Context.observers)
    run.ctx.observers.append(lambda t, ids, res, phase: seen.update({phase: res}))
    algo.round(1, torch.tensor([1, 4]))
    steps = seen["train"].steps
    n = [len(run.data.train_idx[k]) for k in (1, 4)]
    assert [int(s) for s in steps] == [2 * (m // 8) // 2 for m in n]
