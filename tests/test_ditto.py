"""Ditto: the personal objective's proximal pull toward w^t, its one-step update, and executor equivalence."""

from __future__ import annotations

import pytest
import torch
from conftest import make_cfg

from fedbench.engine.schedule import make_schedule
from fedbench.engine.stack import row
from fedbench.errors import ConfigError
from fedbench.run import Run

FP64 = ["hardware.precision=fp64", "partition=complementary_pairs", "clients=10"]


def _run(tmp_path, *overrides) -> Run:
    run = Run(make_cfg("algorithm=ditto", *FP64, *overrides), tmp_path)
    run.setup()
    return run


def test_personal_gradient_includes_lambda_times_v_minus_w(tmp_path):
    """grad h_k(v; w) = grad CE(v) + lambda (v - w) (Ditto Eq. 2), checked against autograd of plain CE."""
    lam = 0.7
    run = _run(tmp_path, f"algorithm.lam={lam}")
    algo, fm = run.algorithm, run.fm
    g = torch.Generator().manual_seed(0)
    w = algo.w
    v = {k: (t + 0.1 * torch.randn(t.shape, generator=g, dtype=t.dtype)).requires_grad_(True) for k, t in w.items()}
    idx = run.data.tensor(run.data.train_idx[0][:16])
    x, y = run.data.x[idx], run.data.y[idx]
    names = list(v)
    grads = torch.autograd.grad(algo.personal_loss(fm, v, algo.bn, x, y, {"w_global": w}), [v[k] for k in names])
    ce = torch.autograd.grad(torch.nn.functional.cross_entropy(fm(v, algo.bn, x), y), [v[k] for k in names])
    for k, gh, gc in zip(names, grads, ce):
        expected = gc + lam * (v[k].detach() - w[k])
        assert torch.allclose(gh, expected, atol=1e-12, rtol=0), k
        assert not torch.allclose(gh, gc, atol=1e-6)  # the pull is really there


def test_one_personal_step_is_sgd_on_h_anchored_at_round_start_global(tmp_path):
    """With s = 1 step and plain SGD: v_k^1 = v_k^0 - eta (grad CE(v_k^0; batch) + lambda (v_k^0 - w^0)),
    where w^0 is the global model at the start of the round (not the freshly aggregated w^1)."""
    lam, lr = 0.5, 0.1
    run = _run(
        tmp_path,
        f"algorithm.lam={lam}",
        "algorithm.personal_steps=1",
        f"lr={lr}",
        "optim.momentum=0.0",
        "algorithm.personal_epochs=3",
    )  # personal_steps overrides personal_epochs
    algo, fm, data = run.algorithm, run.fm, run.data
    w0 = {k: t.clone() for k, t in algo.w.items()}
    v0 = {k: t[3].clone() for k, t in algo.V.items()}
    algo.round(1, torch.arange(10))
    batch = make_schedule([data.train_idx[3]], [3], int(run.cfg.batch_size), algo.seed, "personal", 1, steps=1)[0][0]
    p = {k: t.clone().requires_grad_(True) for k, t in v0.items()}
    ce = torch.nn.functional.cross_entropy(fm(p, row(algo.VB, 3), data.x[batch]), data.y[batch])
    grads = dict(zip(p, torch.autograd.grad(ce, list(p.values()))))
    assert not torch.allclose(algo.w["head.0.weight"], w0["head.0.weight"])  # the global model did move this round
    for k in p:
        assert torch.allclose(algo.V[k][3], v0[k] - lr * (grads[k] + lam * (v0[k] - w0[k])), atol=1e-12, rtol=0), k


def test_sequential_equals_vectorized(tmp_path):
    """Whole Ditto rounds (global copies, personal updates with the proximal loss, FedAvg) match across executors."""
    algos = {}
    for ex in ("sequential", "vectorized"):
        run = Run(
            make_cfg("algorithm=ditto", *FP64, "rounds=2", "algorithm.lam=0.3", f"hardware.executor={ex}"),
            tmp_path / ex,
        )
        run.execute()
        algos[ex] = run.algorithm
    a, b = algos["sequential"], algos["vectorized"]
    for k in a.V:
        assert torch.allclose(a.V[k], b.V[k], atol=1e-10, rtol=0), k
        assert torch.allclose(a.w[k], b.w[k], atol=1e-10, rtol=0), k
    assert not torch.allclose(a.V["head.0.weight"][0], a.w["head.0.weight"])  # personal != global


@pytest.mark.parametrize(
    "key,value",
    [
        ("lam", -0.1),
        ("personal_steps", 0),
        ("personal_epochs", 0),
        ("global_steps", 0),
        ("global_optimizer", "sgd"),
        ("global_lr", 0),
        ("aggregate", "median"),
    ],
)
def test_bad_hyperparameters_fail_in_setup(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        _run(tmp_path, f"algorithm.{key}={value}")


def test_global_model_is_fedavg_of_the_global_copies_not_of_the_personal_models(tmp_path):
    """Ditto Alg. 1: w^{t+1} = sum_k n_k w_k^t / sum n_k over the GLOBAL copies, which train exactly like FedAvg's
    clients (same solver, same batches) — so after two rounds Ditto's w equals FedAvg's w, while the personal
    models (pulled toward w^t with lambda = 0.5) are elsewhere. Client sizes differ, so weighting matters too."""
    out = {}
    for name, extra in (("ditto", ["algorithm.lam=0.5"]), ("fedavg", [])):
        run = Run(make_cfg(f"algorithm={name}", *FP64, "rounds=2", *extra), tmp_path / name)
        run.execute()
        out[name] = run.algorithm
    d, f = out["ditto"], out["fedavg"]
    assert len({len(i) for i in d.data.train_idx}) > 1  # unequal n_k
    for k in d.w:
        assert torch.allclose(d.w[k], f.w[k], atol=1e-12, rtol=0), k
    assert not torch.allclose(d.V["head.0.weight"].mean(0), d.w["head.0.weight"], atol=1e-4)


def _adam_copy(run, k, w, steps, lr):
    """CAFeMe code's Ditto global copy by hand: ``steps`` torch.optim.Adam steps (fresh state) on the client's
    consecutive mini-batches (the run's train schedule of round 1), from the global model ``w``."""
    fm, data = run.fm, run.data
    sched = make_schedule(
        [data.train_idx[k]],
        [k],
        int(run.cfg.batch_size),
        run.algorithm.seed,
        "train",
        1,
        steps=steps,
        drop_last=bool(run.cfg.drop_last),
    )[0]
    p = {n: v.clone().requires_grad_(True) for n, v in w.items()}
    opt = torch.optim.Adam(list(p.values()), lr=lr)
    for b in sched:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(fm(p, run.algorithm.bn, data.x[b]), data.y[b]).backward()
        opt.step()
    return {n: v.detach() for n, v in p.items()}


def test_caf_variant_global_copies_take_five_adam_steps_and_are_averaged_unweighted(tmp_path):
    """algorithm=ditto_caf (CAFeMe code's Ditto, Table 1/2 row): each global copy takes 5 Adam steps (lr 0.001) on
    5 mini-batches, the server averages them unweighted (code aggregate_model_params); lambda = 0.1, 5 personal
    steps; every client keeps its Adam state across rounds. Two clients of different sizes, by hand."""
    run = Run(make_cfg("algorithm=ditto_caf", *FP64, "lr=0.01", "optim.momentum=0.0"), tmp_path)
    run.setup()
    algo = run.algorithm
    hp = algo.hp
    assert (hp.lam, hp.personal_steps, hp.global_steps, hp.global_optimizer, hp.global_lr, hp.aggregate) == (
        0.1,
        5,
        5,
        "adam",
        0.001,
        "uniform",
    )
    sizes = [len(i) for i in run.data.train_idx]
    a, b = max(range(10), key=sizes.__getitem__), min(range(10), key=sizes.__getitem__)
    assert sizes[a] > sizes[b]
    w0 = {n: v.clone() for n, v in algo.w.items()}
    wa, wb = _adam_copy(run, a, w0, 5, 0.001), _adam_copy(run, b, w0, 5, 0.001)
    algo.round(1, torch.tensor([a, b]))
    for n in wa:
        assert torch.allclose(algo.w[n], (wa[n] + wb[n]) / 2, atol=1e-10, rtol=0), n
    steps = algo.opt_state["step"]
    assert steps[a] == 5 and steps[b] == 5 and steps.sum() == 10
    algo.round(2, torch.tensor([a]))
    assert steps[a] == 10 and steps[b] == 5


def test_default_ditto_keeps_the_runs_solver_and_weighted_mean(tmp_path):
    """Plain algorithm=ditto (FedCOM / ECL tables) is unchanged: the global copy uses the run's optimizer for
    local_epochs, the server mean is n_k-weighted, lambda = 0.01."""
    run = _run(tmp_path)
    hp = run.algorithm.hp
    assert (hp.lam, hp.global_steps, hp.global_optimizer, hp.aggregate) == (0.01, None, None, "weighted")


def test_personal_model_is_kept_across_rounds_and_its_optimizer_starts_fresh(tmp_path):
    """Round 2's personal update starts from v_k as round 1 left it (not from w), anchored at w^2, with a fresh
    optimizer: with momentum 0.9 and s = 1 step, v_k <- v_k - eta (grad CE(v_k) + lambda (v_k - w^2)) exactly
    (torch SGD's first step with a new momentum buffer is the plain gradient step)."""
    lam, lr, k = 0.3, 0.1, 4
    run = _run(tmp_path, f"algorithm.lam={lam}", "algorithm.personal_steps=1", f"lr={lr}", "optim.momentum=0.9")
    algo, fm, data = run.algorithm, run.fm, run.data
    algo.round(1, torch.arange(10))
    v1 = {n: t[k].clone() for n, t in algo.V.items()}
    w1 = {n: t.clone() for n, t in algo.w.items()}
    assert not torch.allclose(v1["head.0.weight"], w1["head.0.weight"])  # round 1 moved v_k away from w
    algo.round(2, torch.arange(10))
    batch = make_schedule([data.train_idx[k]], [k], int(run.cfg.batch_size), algo.seed, "personal", 2, steps=1)[0][0]
    p = {n: t.clone().requires_grad_(True) for n, t in v1.items()}
    ce = torch.nn.functional.cross_entropy(fm(p, row(algo.VB, k), data.x[batch]), data.y[batch])
    grads = dict(zip(p, torch.autograd.grad(ce, list(p.values()))))
    for n in p:
        assert torch.allclose(algo.V[n][k], v1[n] - lr * (grads[n] + lam * (v1[n] - w1[n])), atol=1e-12, rtol=0), n
