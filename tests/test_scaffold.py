"""SCAFFOLD: the corrected gradient g − c_k + c (as a linear loss term and as one real SGD step), option-II
control variates and the server rule on hand-made values, the first round end to end, executors agree."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from baseline_checks import batch, executors_agree_and_it_learns, perturbed, setup_run

from fedbench.algorithms.local import LocalInputs, LocalSpec
from fedbench.algorithms.scaffold import effective_steps
from fedbench.engine.stack import broadcast, tagged


def test_corrected_gradient_is_g_minus_ck_plus_c(tmp_path):
    """∇[CE(w) + ⟨w, c − c_k⟩] = g − c_k + c with g = ∇CE, for hand-made c and c_k; and one local SGD step
    of the executor (lr η, no momentum) moves w by −η(g − c_k + c)."""
    run = setup_run(tmp_path, "scaffold", "optim.momentum=0", "lr=0.1")
    algo, fm = run.algorithm, run.fm
    w = {k: v.requires_grad_(True) for k, v in perturbed(algo.w, 0.05, 0).items()}
    c, c_k = perturbed({k: torch.zeros_like(v) for k, v in algo.w.items()}, 1.0, 1), perturbed(algo.w, 1.0, 2)
    x, y = batch(run)
    names = list(w)
    ctx = tagged({k: c[k] - c_k[k] for k in names}, "correction")
    got = torch.autograd.grad(algo.loss(fm, w, algo.bn, x, y, ctx), [w[k] for k in names])
    g = torch.autograd.grad(F.cross_entropy(fm(w, algo.bn, x), y), [w[k] for k in names])
    for k, a, b in zip(names, got, g):
        assert torch.allclose(a, b - c_k[k] + c[k], atol=1e-12, rtol=0), k

    # one real local step through the executor, client 0, one mini-batch = its first 16 samples
    algo.c = c
    algo.c_local = broadcast(c_k, algo.K)
    start = {k: v.detach() for k, v in w.items()}
    clients = torch.tensor([0])
    res = algo.local_train(
        1,
        clients,
        (broadcast(start, 1), broadcast(algo.bn, 1)),
        LocalSpec(loss=algo.loss, steps=1, batch_size=16),
        LocalInputs(
            ctx=tagged({k: (c[k] - c_k[k]).unsqueeze(0) for k in names}, "correction"),
            indices=[run.data.train_idx[0][:16]],
        ),
    )
    for k, b in zip(names, g):
        assert torch.allclose(res.params[k][0], start[k] - 0.1 * (b - c_k[k] + c[k]), atol=1e-12, rtol=0), k


def test_control_variates_and_server_update_by_hand(tmp_path):
    """N=4 clients, S={1,3}, one scalar parameter, η=0.1, steps K_1=2, K_3=5, η_g=1:
    c_k⁺ = c_k − c + (x − y_k)/(K_k η);  x ← x + mean(y_k − x);  c ← c + (|S|/N)·mean(c_k⁺ − c_k)."""
    run = setup_run(tmp_path, "scaffold", "clients=4", "lr=0.1", "algorithm.momentum_corrected_steps=false")
    algo = run.algorithm
    f64 = lambda *v: torch.tensor(v if len(v) > 1 else v[0], dtype=torch.float64)  # noqa: E731  (scalar or [M])
    algo.w, algo.bn = {"a": f64(1.0)}, {}
    algo.c = {"a": f64(0.5)}
    algo.c_local = {"a": f64(0.1, 0.2, 0.3, 0.4)}
    algo.server_update(torch.tensor([1, 3]), {"a": f64(0.6, 1.4)}, {}, torch.tensor([2, 5]), lr=0.1)
    c1 = 0.2 - 0.5 + (1.0 - 0.6) / (2 * 0.1)  # = 1.7
    c3 = 0.4 - 0.5 + (1.0 - 1.4) / (5 * 0.1)  # = -0.9
    assert torch.allclose(algo.c_local["a"], f64(0.1, c1, 0.3, c3), atol=1e-12)
    assert torch.allclose(algo.w["a"], f64(1.0 + ((0.6 - 1) + (1.4 - 1)) / 2), atol=1e-12)
    assert torch.allclose(algo.c["a"], f64(0.5 + (2 / 4) * ((c1 - 0.2) + (c3 - 0.4)) / 2), atol=1e-12)


def test_momentum_corrected_control_variate(tmp_path):
    """momentum ρ=0.5, K=2 steps, η=0.1: the divisor is 2.5·η (two momentum steps move g + 1.5g), not 2·η."""
    run = setup_run(
        tmp_path, "scaffold", "clients=2", "lr=0.1", "optim.momentum=0.5", "algorithm.momentum_corrected_steps=true"
    )
    algo = run.algorithm
    f64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    algo.w, algo.bn, algo.c, algo.c_local = {"a": f64(1.0)}, {}, {"a": f64(0.0)}, {"a": f64([0.0, 0.0])}
    algo.server_update(torch.tensor([0]), {"a": f64([0.5])}, {}, torch.tensor([2]), lr=0.1)
    assert torch.allclose(algo.c_local["a"], f64([(1.0 - 0.5) / (2.5 * 0.1), 0.0]))


def test_first_round_end_to_end(tmp_path):
    """Round 1 (c = c_k = 0) trains exactly like FedAvg's clients; afterwards c_k = (x − y_k)/(K_k η) for the
    participants (0 for the others), x = plain mean of the y_k, c = (|S|/N)·mean(c_k)."""
    run = setup_run(tmp_path, "scaffold", "model=tiny_cnn", "algorithm.momentum_corrected_steps=false")
    algo = run.algorithm
    clients = torch.tensor([0, 2, 3])
    x0 = {k: v.clone() for k, v in algo.w.items()}
    ref = algo.local_train(1, clients, (broadcast(x0, 3), broadcast(algo.bn, 3)), LocalSpec())  # plain CE
    algo.round(1, clients)
    eta = float(run.cfg.lr)
    for k in x0:
        scale = (1.0 / (ref.steps.to(torch.float64) * eta)).view(-1, *([1] * x0[k].dim()))
        expected_ck = (x0[k].unsqueeze(0) - ref.params[k]) * scale
        assert torch.allclose(algo.c_local[k][clients], expected_ck, atol=1e-10), k
        assert torch.count_nonzero(algo.c_local[k][[1, 4]]) == 0
        assert torch.allclose(algo.w[k], ref.params[k].mean(0), atol=1e-12), k
        assert torch.allclose(algo.c[k], (3 / 5) * expected_ck.mean(0), atol=1e-10), k
    assert len(set(ref.steps.tolist())) > 1  # clients really took different numbers of steps


def test_momentum_corrected_step_count():
    """K momentum-SGD steps with constant gradient move (K − ρ(1−ρ^K)/(1−ρ))/(1−ρ) plain steps: K=2, ρ=0.5
    moves g + 1.5g = 2.5g; ρ=0 gives K."""
    assert torch.allclose(effective_steps(torch.tensor([1.0, 2.0]), 0.5), torch.tensor([1.0, 2.5]))
    assert torch.equal(effective_steps(torch.tensor([7.0]), 0.0), torch.tensor([7.0]))


def test_sequential_equals_vectorized_and_it_learns(tmp_path):
    executors_agree_and_it_learns(tmp_path, "scaffold")


def test_control_variates_use_the_decayed_lr_of_the_local_steps(tmp_path):
    """Issue 16.8: under a step decay (lr 0.1 → 0.02 after round 1) round 2's local steps run at η = 0.02, so
    c_k⁺ = c_k − c + (x − y_k)/(K_k · 0.02), not /(K_k · 0.1). Asymmetric c, c_k; participants {1, 3} of 4."""
    run = setup_run(
        tmp_path,
        "scaffold",
        "clients=4",
        "lr=0.1",
        "optim.momentum=0",
        "optim.lr_decay_round=1",
        "optim.lr_decay_to=0.02",
        "algorithm.momentum_corrected_steps=false",
    )
    algo = run.algorithm
    algo.c = perturbed({k: torch.zeros_like(v) for k, v in algo.w.items()}, 0.3, 1)
    algo.c_local = broadcast(perturbed({k: torch.zeros_like(v) for k, v in algo.w.items()}, 0.7, 2), algo.K)
    algo.c_local = {
        k: v * torch.arange(1, 5, dtype=v.dtype).view(-1, *([1] * (v.dim() - 1))) for k, v in algo.c_local.items()
    }
    clients = torch.tensor([1, 3])
    x0, c0, ck0 = dict(algo.w), dict(algo.c), {k: v[clients].clone() for k, v in algo.c_local.items()}
    ctx = tagged({k: c0[k].unsqueeze(0) - ck0[k] for k in c0}, "correction")
    ref = algo.local_train(2, clients, (broadcast(x0, 2), broadcast(algo.bn, 2)), algo.train_spec, LocalInputs(ctx=ctx))
    at_01 = algo.local_train(
        2,
        clients,
        (broadcast(x0, 2), broadcast(algo.bn, 2)),
        algo.train_spec.replace(opt=algo.opt.replace(lr=0.1)),
        LocalInputs(ctx=ctx),
    )
    assert not torch.allclose(ref.params[next(iter(x0))], at_01.params[next(iter(x0))])  # the steps did decay
    algo.round(2, clients)
    for k in x0:
        steps = ref.steps.to(torch.float64).view(-1, *([1] * x0[k].dim()))
        expected = ck0[k] - c0[k] + (x0[k].unsqueeze(0) - ref.params[k]) / (steps * 0.02)
        assert torch.allclose(algo.c_local[k][clients], expected, atol=1e-9), k
        assert torch.allclose(algo.c[k], c0[k] + (2 / 4) * (expected - ck0[k]).mean(0), atol=1e-9), k
