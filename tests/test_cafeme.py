"""CAFeMe: the modulator's permutation-invariant context, sigmoid gating, FO/SO MAML client updates
against hand computations with plain autograd, per-client Adam state, and executor equivalence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_cfg, run_cfg
from omegaconf import OmegaConf
from torch.func import functional_call

from fedbench import seeding
from fedbench.engine.schedule import make_schedule
from fedbench.errors import ConfigError
from fedbench.models import build_model
from fedbench.run import Run

# a CAFeMe network small enough for 8x8 digits (same structure as conf/model/cafeme_mnist.yaml)
TINY = [
    "model=cafeme_mnist",
    "model.channels=[4,8]",
    "model.kernel_size=3",
    "model.padding=1",
    "model.hidden=[16]",
    "model.modulator_hidden=[8]",
    "model.modulator_post=[8]",
]
BASE = ["algorithm=cafeme", *TINY, "hardware.precision=fp64", "clients=6", "batch_size=8"]


def _net(modulation="sigmoid", labels=False):
    torch.manual_seed(0)
    cfg = OmegaConf.create(
        {
            "name": "cafeme_cnn",
            "channels": [4, 8],
            "kernel_size": 3,
            "padding": 1,
            "hidden": [16],
            "modulator_hidden": [8],
            "modulator_post": [8],
            "modulation": modulation,
            "modulator_uses_labels": labels,
        }
    )
    return build_model(cfg, (1, 8, 8), 10).double()


def _run(tmp_path, *overrides) -> Run:
    run = Run(make_cfg(*BASE, *overrides), tmp_path)
    run.setup()
    return run


def test_modulator_context_is_invariant_to_permuting_the_batch():
    """ζ = MLP(mean_b h(x_b)): the same gates for any order of the batch, so the logits permute with it."""
    net = _net()
    x = torch.randn(7, 1, 8, 8, dtype=torch.float64)
    perm = torch.randperm(7)
    z, z_perm = net.body.gates(x), net.body.gates(x[perm])
    for a, b in zip(z, z_perm):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)
    assert torch.allclose(net(x)[perm], net(x[perm]), atol=1e-12, rtol=0)
    other = net.body.gates(torch.randn(7, 1, 8, 8, dtype=torch.float64))
    assert not torch.allclose(z[0], other[0])  # the context does depend on the batch's content
    assert [len(g) for g in z] == [4, 8, 8 * 2 * 2, 16]  # one gate vector per hidden layer (conv, conv, flatten, dense)
    train_mode = net(x)
    net.eval()  # code: BatchNorm without running stats = batch stats at test time too
    assert torch.allclose(net(x), train_mode, atol=1e-12) and not list(net.buffers())


def test_sigmoid_gating_keeps_activations_between_zero_and_the_activation():
    """a ⊙ σ(ζ) (Eq. 4.4): for post-ReLU activations a ≥ 0 every gated value lies in [0, a], also for extreme ζ."""
    net = _net()
    a = torch.relu(torch.randn(5, 8, 3, 3, dtype=torch.float64))
    for z in (torch.full((8,), 60.0), torch.full((8,), -60.0), torch.randn(8) * 10):
        out = net.body.gate(a, z.double())
        assert (out >= 0).all() and (out <= a).all()
        assert torch.allclose(out, a * torch.sigmoid(z.double()).view(1, -1, 1, 1))
    seen = {}
    net.body.dense[-1].register_forward_hook(lambda m, i, o: seen.setdefault("a", o))
    x = torch.randn(6, 1, 8, 8, dtype=torch.float64)
    h = net.body(x)  # the last gated dense activation
    assert (h >= 0).all() and (h <= seen["a"] + 1e-15).all()
    assert torch.allclose(h, seen["a"] * torch.sigmoid(net.body.gates(x)[-1]))


def _hand_update(run, k, S, O, alpha, beta, first_order, support_context=False):
    """Alg. 2 + Alg. 1 line 8 with plain autograd (create_graph only for second order), outer step ω − β∇;
    ``support_context``: the outer batch is classified with the gates of the last personalization batch D'."""
    net, data = run.fm.net, run.data
    pack = make_schedule([data.train_idx[k]], [k], 8, run.algorithm.seed, "train", 1, steps=1, batches_per_step=S + O)[
        0
    ][0]
    xs, ys = data.x[pack].unflatten(0, (S + O, -1)), data.y[pack].unflatten(0, (S + O, -1))
    omega = {n: v.clone().requires_grad_(True) for n, v in run.algorithm.w.items()}
    phi = dict(omega)
    for s in range(S):
        g = torch.autograd.grad(
            F.cross_entropy(functional_call(net, phi, (xs[s],)), ys[s]),
            list(phi.values()),
            create_graph=not first_order,
        )
        phi = {n: phi[n] - alpha * gi for n, gi in zip(phi, g)}
    ctx = {"context": (xs[S - 1], ys[S - 1])} if support_context else {}
    outer = F.cross_entropy(functional_call(net, phi, (xs[S:].flatten(0, 1),), ctx), ys[S:].flatten(0, 1))
    grads = torch.autograd.grad(outer, list(omega.values()))
    return {n: omega[n].detach() - beta * g for n, g in zip(omega, grads)}, dict(zip(omega, grads))


@pytest.mark.parametrize("first_order", [True, False])
def test_one_maml_client_update_equals_hand_computation(tmp_path, first_order):
    """One sampled client, S=2 inner steps (α) on consecutive batches, outer loss on the next 2 batches,
    SGD outer step (β)."""
    S, O, alpha, beta, k = 2, 2, 0.3, 0.05, 3
    run = _run(
        tmp_path,
        f"algorithm.inner_steps={S}",
        f"algorithm.outer_batches={O}",
        f"algorithm.inner_lr={alpha}",
        f"algorithm.outer_lr={beta}",
        "algorithm.outer_optimizer=sgd",
        f"algorithm.first_order={first_order}",
    )
    expected, _ = _hand_update(run, k, S, O, alpha, beta, first_order)
    run.algorithm.round(1, torch.tensor([k]))
    for n, v in expected.items():
        assert torch.allclose(run.algorithm.w[n], v, atol=1e-10, rtol=0), n


def test_first_and_second_order_gradients_differ(tmp_path):
    """The second-order option really differentiates through the inner steps (else the test above proves little)."""
    run = _run(tmp_path)
    _, fo = _hand_update(run, 3, 2, 2, 0.3, 0.05, True)
    _, so = _hand_update(run, 3, 2, 2, 0.3, 0.05, False)
    gap = max((fo[n] - so[n]).abs().max().item() for n in fo)
    assert gap > 1e-6


def test_adam_outer_step_and_per_client_state(tmp_path):
    """Code default: the outer step is Adam (first step ω − β ĝ/(|ĝ|+ε)), each client keeps its own Adam state."""
    beta, k = 0.01, 2
    run = _run(tmp_path, f"algorithm.outer_lr={beta}")
    algo = run.algorithm
    expected, grads = _hand_update(run, k, 5, 6, float(algo.hp.inner_lr), beta, True)
    algo.round(1, torch.tensor([k]))
    for n, g in grads.items():
        live = g.abs() > 1e-12  # a conv bias before BatchNorm gets no gradient (round-off only; Adam would amplify it)
        w0 = expected[n] + beta * g
        assert torch.allclose(algo.w[n][live], (w0 - beta * g / (g.abs() + 1e-8))[live], atol=1e-10, rtol=0), n
    steps = algo.opt_state["step"]
    assert steps[k] == 1 and steps.sum() == 1
    algo.round(2, torch.tensor([1, k]))
    assert steps[k] == 2 and steps[1] == 1 and steps.sum() == 3


def test_whole_runs_agree_across_executors(tmp_path):
    """Rounds, sampling with held-out new clients and their fine-tuning curve: the same in both executors (fp64)."""
    out = {}
    for ex in ("sequential", "vectorized"):
        cfg = make_cfg(
            *BASE,
            f"hardware.executor={ex}",
            "rounds=2",
            "participation=0.5",
            "eval.new_clients.enabled=true",
            "eval.new_clients.steps=2",
            "eval.new_clients.fraction=0.34",
            "eval.personalized=false",
            "eval.global_model=false",
        )
        out[ex] = run_cfg(cfg, tmp_path / ex)
    a, b = out["sequential"], out["vectorized"]
    assert a["newclients/client_curves"] == b["newclients/client_curves"]
    assert len(a["newclients/curve"]) == 3


@pytest.mark.parametrize("first_order", [True, False])
def test_sequential_equals_vectorized(tmp_path, first_order):
    """The global model after a FO / SO round (torch.func.grad inside vmap) is the same in both executors (fp64)."""
    ws = []
    for ex in ("sequential", "vectorized"):
        run = _run(
            tmp_path / ex,
            f"hardware.executor={ex}",
            f"algorithm.first_order={first_order}",
            "algorithm.inner_steps=2",
            "algorithm.outer_batches=2",
        )
        run.algorithm.round(1, torch.tensor([0, 2, 5]))
        ws.append(run.algorithm.w)
    for n in ws[0]:
        assert torch.allclose(ws[0][n], ws[1][n], atol=1e-10, rtol=0), n


def test_paper_variant_labels_support_context_film_and_split(tmp_path):
    """Paper options: one-hot labels into the modulator, ζ from the support batch, FiLM, disjoint D_pers/D_eval."""
    net = _net(labels=True)
    x = torch.randn(6, 1, 8, 8, dtype=torch.float64)
    y = torch.arange(6)
    assert not torch.allclose(net.body.gates(x, y)[0], net.body.gates(x, (y + 1) % 10)[0])  # labels change ζ
    s = run_cfg(
        make_cfg(
            *BASE,
            "algorithm.modulator_uses_labels=true",
            "algorithm.context=support",
            "algorithm.modulation=film",
            "algorithm.pers_split=0.5",
            "rounds=2",
            "eval.new_clients.enabled=true",
            "eval.new_clients.steps=2",
            "eval.new_clients.fraction=0.34",
        ),
        tmp_path,
    )
    assert s["status"] == "complete" and 0 <= s["newclients/acc"] <= 1


@pytest.mark.parametrize(
    "override,key",
    [
        (["algorithm.modulator_uses_labels=true"], "algorithm.modulator_uses_labels"),  # needs context=support
        (["algorithm.inner_steps=0"], "algorithm.inner_steps"),
        (["algorithm.pers_split=1.5"], "algorithm.pers_split"),
    ],
)
def test_bad_config_fails_in_setup(tmp_path, override, key):
    with pytest.raises(ConfigError) as e:
        _run(tmp_path, *override)
    assert e.value.key == key


def test_needs_a_modulated_network(tmp_path):
    with pytest.raises(ConfigError) as e:
        Run(make_cfg("algorithm=cafeme", "model=mlp"), tmp_path).setup()
    assert e.value.key == "model"


def test_packed_schedule_gives_consecutive_equal_batches():
    """batches_per_step=k: each step = k consecutive batches of the ordinary schedule, all of size min(B, n)."""
    import numpy as np

    idx = [np.arange(100, 150), np.arange(7)]
    plain = make_schedule(idx, [0, 1], 8, 0, "train", 1, steps=6, drop_last=True)
    packed = make_schedule(idx, [0, 1], 8, 0, "train", 1, steps=2, batches_per_step=3)
    assert [len(s) for s in packed[0]] == [24, 24]
    assert torch.equal(torch.cat(packed[0]), torch.cat(plain[0]))  # the same batches, grouped
    assert [len(s) for s in packed[1]] == [21, 21]  # a client smaller than B: b = n = 7
    assert all(len(set(s.tolist())) == 7 for p in packed[1] for s in p.unflatten(0, (3, -1)))


@pytest.mark.parametrize("shape", [(7, 5), (6, 5, 3, 3), (1, 5)])
def test_plain_op_batch_norm_equals_the_fused_kernel(shape):
    """BatchStatNorm (batch statistics always, code track_running_stats=False): the plain-op form used for
    second order gives the fused kernel's values and gradients (a one-sample batch: zero variance, no error)."""
    from fedbench.models.cafeme import BatchStatNorm

    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    fused, plain = BatchStatNorm(5).double(), BatchStatNorm(5).double()
    plain.plain = True
    with torch.no_grad():
        fused.weight.uniform_()
        plain.weight.copy_(fused.weight)
    out = [m(x) for m in (fused, plain)]
    grads = [torch.autograd.grad((o**3).sum(), [x, m.weight]) for o, m in zip(out, (fused, plain))]
    assert torch.allclose(out[0], out[1], atol=1e-12)
    for g, h in zip(*grads):
        assert torch.allclose(g, h, atol=1e-10)
    if shape[0] > 1:
        ref = (torch.nn.BatchNorm2d if len(shape) == 4 else torch.nn.BatchNorm1d)(5, track_running_stats=False).double()
        with torch.no_grad():
            ref.weight.copy_(fused.weight)
        assert torch.allclose(ref(x), out[0], atol=1e-12)


def test_modulator_context_is_the_batch_mean_of_the_per_sample_embeddings():
    """Paper §4.1: (A) per-sample h(x_b), (B) their MEAN over the batch, (C) the MLP. A batch and the same batch
    twice give the same gates (a mean; a sum would double), and the gates equal (C)(mean_b (A)(x_b))."""
    net = _net()
    mod = net.body.modulator
    x = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    once, twice = net.body.gates(x), net.body.gates(torch.cat([x, x]))
    for a, b in zip(once, twice):
        assert torch.allclose(a, b, atol=1e-10, rtol=0)
    per_sample = mod.per_sample(mod.features(x))  # (A): [B, 8]
    by_hand = mod.mlp(per_sample.sum(0) / len(x))  # (B) mean, then (C)
    assert torch.allclose(torch.cat(once), by_hand, atol=1e-12, rtol=0)
    assert not torch.allclose(by_hand, mod.mlp(per_sample.sum(0)), atol=1e-6)  # the test can tell a sum


def test_server_mean_is_unweighted_over_clients_of_different_sizes(tmp_path):
    """Alg. 1 line 11 (code aggregate_model_params): ω ← (1/M) Σ ω_i', not weighted by n_i, checked on two
    clients whose training sets differ in size (a size-weighted mean would move ω toward the larger one)."""
    S, O, alpha, beta = 2, 2, 0.3, 0.05
    run = _run(
        tmp_path,
        f"algorithm.inner_steps={S}",
        f"algorithm.outer_batches={O}",
        f"algorithm.inner_lr={alpha}",
        f"algorithm.outer_lr={beta}",
        "algorithm.outer_optimizer=sgd",
    )
    sizes = [len(i) for i in run.data.train_idx]
    a, b = int(torch.tensor(sizes).argmax()), int(torch.tensor(sizes).argmin())
    assert sizes[a] >= 1.3 * sizes[b]  # really different sizes
    ua, _ = _hand_update(run, a, S, O, alpha, beta, True)
    ub, _ = _hand_update(run, b, S, O, alpha, beta, True)
    run.algorithm.round(1, torch.tensor([a, b]))
    for n in ua:
        assert torch.allclose(run.algorithm.w[n], (ua[n] + ub[n]) / 2, atol=1e-10, rtol=0), n


@pytest.mark.parametrize("context", ["batch", "support"])
def test_new_clients_modulator_context(tmp_path, context):
    """New clients: the modulator reads the batch being classified (code, context=batch) or the client's latest
    fine-tuning batch D' (paper, context=support) — and the two give different logits."""
    run = _run(tmp_path, f"algorithm.context={context}")
    algo, data = run.algorithm, run.data
    x, support = data.x[:6], (data.x[10:18], data.y[10:18])
    out = algo.new_client_forward(algo.w, algo.bn, x, support)
    own = algo.forward(algo.w, algo.bn, x, None)
    from_support = algo.forward(algo.w, algo.bn, x, support)
    assert not torch.allclose(own, from_support, atol=1e-6)
    assert torch.allclose(out, own if context == "batch" else from_support, atol=1e-12, rtol=0)


def test_support_context_classifies_the_outer_batch_with_the_last_personalization_batchs_gates(tmp_path):
    """Paper variant (context=support, Alg. 2 line 8): ζ for the outer loss comes from the LAST of the S inner
    batches D' (not the first, not the outer batch itself); one SGD outer step by hand, S = 3."""
    S, O, alpha, beta, k = 3, 1, 0.3, 0.05, 2
    run = _run(
        tmp_path,
        "algorithm.context=support",
        f"algorithm.inner_steps={S}",
        f"algorithm.outer_batches={O}",
        f"algorithm.inner_lr={alpha}",
        f"algorithm.outer_lr={beta}",
        "algorithm.outer_optimizer=sgd",
    )
    expected, _ = _hand_update(run, k, S, O, alpha, beta, True, support_context=True)
    batch_ctx, _ = _hand_update(run, k, S, O, alpha, beta, True)
    assert any(not torch.allclose(expected[n], batch_ctx[n], atol=1e-8) for n in expected)  # the context matters
    run.algorithm.round(1, torch.tensor([k]))
    for n, v in expected.items():
        assert torch.allclose(run.algorithm.w[n], v, atol=1e-10, rtol=0), n


def test_new_clients_support_context_is_the_latest_finetuning_batch_by_hand(tmp_path):
    """Paper variant (context=support; Alg. 2 lines 3-8: ζ = g_μ'(D') with D' the batch of the LAST personalization
    step): a new client's curve point after s steps classifies its test batches with the gates of fine-tuning batch s
    (before any step: batch 1, the one step 1 will use). Hand-made for the 3 new clients: S = 4 plain-SGD steps on all
    parameters (the modulator's included), each step's loss with ζ from its own batch. The curves read with the first
    batch's gates, or with the next step's batch, differ on this data, so such a swap fails."""
    S, lr, B = 4, 0.5, 8
    run = _run(
        tmp_path,
        "algorithm.context=support",
        "clients=10",
        "eval.new_clients.enabled=true",
        "eval.new_clients.fraction=0.3",
        f"eval.new_clients.steps={S}",
        f"eval.new_clients.lr_pfl={lr}",
        "eval.new_clients.lr_decay_every=100",
    )
    nc, algo, data = run.new_clients, run.algorithm, run.data
    algo.w["body.modulator.mlp.2.weight"] *= 20  # a start model whose gates depend strongly on the context
    curves = nc.curves(algo, 4)

    def accuracy(p, k, s, ctx_batch):
        test = data.test_idx[k]
        order = test[seeding.rng(run.cfg.seed, "new_clients_test", 4, s, k).permutation(len(test))]
        ctx = (data.x[ctx_batch], data.y[ctx_batch])
        accs = [
            (
                algo.forward(p, algo.bn, data.x[data.tensor(order[i : i + B])], ctx).argmax(1)
                == data.y[data.tensor(order[i : i + B])]
            )
            .double()
            .mean()
            .item()
            for i in range(0, len(order), B)
            if len(order[i : i + B]) > 1
        ]
        return sum(accs) / len(accs)

    latest, first, upcoming = [], [], []
    for m, k in enumerate(nc.ids.tolist()):
        batches = [data.tensor(b) for b in nc.schedule(4, S)[m]]  # fine-tuning batches 1..S (its train split)
        p = {n: v.clone() for n, v in algo.w.items()}
        for s in range(S + 1):
            latest.append(accuracy(p, k, s, batches[max(s - 1, 0)]))  # after s steps: step s's batch (s = 0: step 1's)
            first.append(accuracy(p, k, s, batches[0]))
            upcoming.append(accuracy(p, k, s, batches[min(s, S - 1)]))  # the NEXT step's batch: not the paper's D'
            if s < S:
                q = {n: v.clone().requires_grad_(True) for n, v in p.items()}
                x, y = data.x[batches[s]], data.y[batches[s]]
                g = torch.autograd.grad(F.cross_entropy(algo.forward(q, algo.bn, x, (x, y)), y), list(q.values()))
                p = {n: p[n] - lr * gi for n, gi in zip(p, g)}
    assert latest != first and latest != upcoming  # the rule is visible on this data
    assert curves.reshape(-1).tolist() == pytest.approx(latest, abs=1e-12)
