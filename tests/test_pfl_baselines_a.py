"""FedPer, LG-FedAvg, FedBABU, pFedMe, FedProto, FedDistill, FedRoD: each method's defining mechanism on a tiny
model (mlp with a two-layer head, so `head` and `classifier` scopes differ), fp64, against hand computations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_cfg

from fedbench.algorithms.local import LocalInputs, LocalSpec
from fedbench.engine.stack import weighted_mean
from fedbench.engine.syncs import HostSyncCounter
from fedbench.errors import ConfigError
from fedbench.prototypes import class_means, global_prototypes
from fedbench.run import Run

TINY = ["hardware.precision=fp64", "model.head_hidden=[16]", "clients=4"]
HEAD = ["head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias"]  # all FC layers after the body
CLASSIFIER = ["head.2.weight", "head.2.bias"]  # the final Linear
BODY = ["body.1.weight", "body.1.bias"]


def _run(tmp_path, algorithm, *overrides) -> Run:
    run = Run(make_cfg(f"algorithm={algorithm}", *TINY, *overrides), tmp_path)
    run.setup()
    return run


def _close(a, b, tol=1e-10):
    return torch.allclose(a, b, atol=tol, rtol=0)


# ---- partial aggregation: FedPer, LG-FedAvg, FedBABU ------------------------------------------------------------
@pytest.mark.parametrize(
    "algorithm,scope,local",
    [
        ("fedper", "head", HEAD),
        ("fedper", "classifier", CLASSIFIER),
        ("lgfedavg", "classifier", BODY + ["head.0.weight", "head.0.bias"]),
        ("lgfedavg", "head", BODY),
        ("fedbabu", "head", HEAD),
    ],
)
def test_partial_aggregation_averages_shared_part_and_keeps_local_part(tmp_path, algorithm, scope, local):
    """After a round the server holds only the shared names, = the n_k-weighted mean of the trained models; each
    client keeps exactly its own trained local part (FedPer: head, LG-FedAvg: body); the local part is never sent."""
    run = _run(
        tmp_path,
        algorithm,
        f"algorithm.head_scope={scope}",
        "algorithm.ft_epochs=0" if algorithm == "fedbabu" else "seed=0",
    )
    algo = run.algorithm
    clients = torch.arange(4)
    assert sorted(algo.local_w) == sorted(local) and not set(algo.w) & set(local)
    p, b = algo.download(clients)
    res = algo.local_train(1, clients, (p, b), algo.train_spec)  # what round 1 trains (same batches)
    algo.round(1, clients)
    expected = weighted_mean(res.params, algo.n)
    for k in algo.w:
        assert _close(algo.w[k], expected[k]), k
    for k in local:
        assert _close(algo.local_w[k], res.params[k]), k
    after, _ = algo.client_models(clients, 2)
    for k in algo.w:  # shared part: identical on every client
        assert all(_close(after[k][i], algo.w[k]) for i in range(4)), k
    if algorithm != "fedbabu":  # trained local parts differ across clients
        assert not _close(after[local[0]][0], after[local[0]][1], 1e-6)


def test_fedbabu_head_never_changes_during_federated_training(tmp_path):
    """FedBABU trains the body only: after rounds every client's head is bit-identical to the initial head, the body
    moved; fine-tuning for evaluation changes the head of the evaluated copy, never the stored model."""
    run = _run(tmp_path, "fedbabu", "algorithm.ft_epochs=1")
    algo = run.algorithm
    init = run.initial_params
    for t in (1, 2):
        algo.round(t, torch.arange(4))
    for k in HEAD:
        assert torch.equal(algo.local_w[k], init[k].expand_as(algo.local_w[k])), k
    assert not _close(algo.w["body.1.weight"], init["body.1.weight"], 1e-6)
    tuned, _ = algo.client_models(torch.arange(4), 2)
    assert not _close(tuned["head.2.weight"][0], init["head.2.weight"], 1e-6)  # ft_scope=all tunes the head
    assert torch.equal(algo.local_w["head.2.weight"][0], init["head.2.weight"])  # ... of a copy only
    g, _ = algo.global_model()
    assert torch.equal(g["head.2.weight"], init["head.2.weight"]) and torch.equal(
        g["body.1.weight"], algo.w["body.1.weight"]
    )


def test_fedbabu_fine_tune_scope(tmp_path):
    """ft_scope=head fine-tunes only the head (body of the evaluated model = global body); ft_epochs=0 = no tuning."""
    algo = _run(tmp_path / "a", "fedbabu", "algorithm.ft_scope=head").algorithm
    tuned, _ = algo.client_models(torch.arange(4), 1)
    assert _close(tuned["body.1.weight"][2], algo.w["body.1.weight"], 0) and not _close(
        tuned["head.0.weight"][2], algo.local_w["head.0.weight"][2], 1e-6
    )
    algo = _run(tmp_path / "b", "fedbabu", "algorithm.ft_epochs=0").algorithm
    assert torch.equal(algo.client_models(torch.arange(4), 1)[0]["head.0.weight"], algo.local_w["head.0.weight"])


def test_fedbabu_fine_tunes_with_ft_lr(tmp_path):
    """One fine-tuning epoch in one full batch (batch_size ≥ n_k): the evaluated model is θ − ft_lr·∇CE(θ; D_k) from the
    downloaded model, with ft_lr (0.3) and not the training lr (0.05)."""
    run = _run(tmp_path, "fedbabu", "algorithm.ft_epochs=1", "algorithm.ft_lr=0.3", "lr=0.05", "batch_size=1000")
    algo, fm, data = run.algorithm, run.fm, run.data
    p, b = algo.download(torch.arange(4))
    tuned, _ = algo.client_models(torch.arange(4), 1)
    for k in range(4):
        q = {n: v[k].clone().requires_grad_(True) for n, v in p.items()}
        i = data.tensor(data.train_idx[k])
        grads = torch.autograd.grad(F.cross_entropy(fm(q, {}, data.x[i]), data.y[i]), list(q.values()))
        for (n, v), g in zip(q.items(), grads):
            assert _close(tuned[n][k], v.detach() - 0.3 * g), (k, n)


# ---- pFedMe ----------------------------------------------------------------------------------------------------------
def test_pfedme_inner_problem_and_outer_updates_match_hand_computation(tmp_path):
    """R = 2 mini-batches, K = 2 inner steps: θ ← θ − plr(∇f(θ; D_r) + λ(θ − w_k)) (θ carried over between batches),
    w_k ← w_k − ηλ(w_k − θ) after each batch; server w ← (1−β)w + β Σ n_k w_k / Σ n_k. β = 0.7, not 0.5: at 0.5 the
    server rule cannot tell β from 1 − β."""
    lam, plr, eta, beta = 2.0, 0.1, 0.05, 0.7
    run = _run(
        tmp_path,
        "pfedme",
        f"algorithm.lam={lam}",
        f"algorithm.personal_lr={plr}",
        f"algorithm.eta={eta}",
        f"algorithm.beta={beta}",
        "algorithm.inner_steps=2",
        "algorithm.local_steps=2",
        "batch_size=16",
    )
    algo, fm, data = run.algorithm, run.fm, run.data
    clients = torch.arange(4)
    w0 = {k: v.clone() for k, v in algo.w.items()}
    batches = algo.local_batches(1, clients)
    algo.round(1, clients)
    local_models = []
    for k in range(4):
        theta, wk = dict(w0), dict(w0)
        for batch in batches[k]:
            idx = batch
            for _ in range(2):
                p = {n: v.clone().requires_grad_(True) for n, v in theta.items()}
                grads = torch.autograd.grad(
                    F.cross_entropy(fm(p, run.initial_buffers, data.x[idx]), data.y[idx]), list(p.values())
                )
                theta = {n: theta[n] - plr * (g + lam * (theta[n] - wk[n])) for n, g in zip(theta, grads)}
            wk = {n: wk[n] - eta * lam * (wk[n] - theta[n]) for n in wk}
        for n in theta:
            assert _close(algo.theta[n][k], theta[n]), (k, n)
        local_models.append(wk)
    avg = weighted_mean({n: torch.stack([m[n] for m in local_models]) for n in w0}, algo.n)
    for n in w0:
        assert _close(algo.w[n], (1 - beta) * w0[n] + beta * avg[n]), n
    assert not _close(algo.theta["head.2.weight"][0], algo.w["head.2.weight"], 1e-6)  # personal ≠ global
    personal, _ = algo.client_models(clients, 1)  # evaluated: θ_k, not w
    assert all(_close(personal[n], algo.theta[n]) for n in algo.theta)


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_pfedme_round_is_one_local_training_call_with_no_host_read_in_its_loop(tmp_path, executor):
    """Issue 21: R = 3 mini-batches x K = 2 inner steps per client make ONE executor call per round (the local-model
    step w_k <- w_k - ηλ(w_k - θ_k) runs inside it, every K-th step); before: one call per mini-batch, each followed by
    a host read of its loss. The step loop reads nothing on the host."""
    run = _run(
        tmp_path, "pfedme", "algorithm.local_steps=3", "algorithm.inner_steps=2", f"hardware.executor={executor}"
    )
    calls, train = [], run.executor.train
    run.executor.train = lambda job, *a: calls.append([len(s) for s in job.schedule]) or train(job, *a)
    counter = HostSyncCounter()
    run.executor.loop_mode = lambda: counter
    run.algorithm.round(1, torch.arange(4))
    assert calls == [[3 * 2] * 4]
    assert counter.count == 0, dict(counter.calls)


@pytest.mark.parametrize(
    "key,value", [("lam", 0), ("inner_steps", 0), ("personal_lr", -1), ("beta", 0), ("local_steps", 0)]
)
def test_pfedme_bad_hyperparameters_fail_in_setup(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        _run(tmp_path, "pfedme", f"algorithm.{key}={value}")


# ---- FedProto / FedDistill -------------------------------------------------------------------------------------------
def test_prototype_aggregation_on_hand_made_features():
    """Client prototypes are per-class feature means; the server averages them over the clients that have the class,
    unweighted by sample counts (FedProto Eq. 6); a class nobody has gets no prototype."""
    a = torch.tensor([[1.0, 1.0], [1.0, 3.0], [1.0, -1.0], [4.0, 0.0]])  # client A: class 0 x3, class 1 x1
    b = torch.tensor([[3.0, 3.0], [0.0, 2.0], [2.0, 2.0]])  # client B: class 0 x1, class 1 x2
    means, counts = class_means([a, b], [torch.tensor([0, 0, 0, 1]), torch.tensor([0, 1, 1])], 3)
    assert torch.equal(means[0], torch.tensor([[1.0, 1.0], [4.0, 0.0], [0.0, 0.0]])) and counts[0].tolist() == [3, 1, 0]
    protos, has = global_prototypes(means, counts)
    assert torch.equal(protos, torch.tensor([[2.0, 2.0], [2.5, 1.0], [0.0, 0.0]]))  # class 0: (1+3)/2, not (3+3)/4
    assert has.tolist() == [True, True, False]


@pytest.mark.parametrize("algorithm", ["fedproto", "feddistill"])
def test_uploaded_class_means_are_averaged_by_the_server(tmp_path, algorithm):
    """After a round the server's Z̄_c = unweighted mean over clients of the class-c mean of z on their training data,
    z = body features (FedProto) or logits (FedDistill) of the trained local model in eval mode.
    Models are never averaged."""
    run = _run(tmp_path, algorithm)
    algo, fm, data = run.algorithm, run.fm, run.data
    algo.round(1, torch.arange(4))
    sums, n_have = 0, 0
    for k in range(4):
        idx = data.tensor(data.train_idx[k])
        p, b = {n: v[k] for n, v in algo.P.items()}, {n: v[k] for n, v in algo.B.items()}
        z = (fm.features if algorithm == "fedproto" else fm)(p, b, data.x[idx])
        onehot = F.one_hot(data.y[idx], 10).double()
        sums = sums + (onehot.T @ z) / onehot.sum(0).clamp(min=1).unsqueeze(1)
        n_have = n_have + (onehot.sum(0) > 0).double()
    have = n_have > 0
    assert torch.equal(algo.has_mean, have)
    assert _close(algo.means[have], (sums / n_have.clamp(min=1).unsqueeze(1))[have])
    assert algo.means.shape[1] == (128 if algorithm == "fedproto" else 10)
    assert not _close(algo.P["head.2.weight"][0], algo.P["head.2.weight"][1], 1e-6)  # models stay personal


@pytest.mark.parametrize("algorithm", ["fedproto", "feddistill"])
def test_class_mean_regularizer(tmp_path, algorithm):
    """Local loss = CE + λ·MSE(z, Z̄_y): the squared error to the sample's class mean, averaged over all B·d entries;
    samples whose class has no global mean add 0 (PFLlib's pattern)."""
    lam = 0.7
    run = _run(tmp_path, algorithm, f"algorithm.lam={lam}")
    algo, fm, data = run.algorithm, run.fm, run.data
    p, b = run.initial_params, run.initial_buffers
    idx = data.tensor(data.train_idx[0][:12])
    x, y = data.x[idx], data.y[idx]
    z = fm.features(p, b, x) if algorithm == "fedproto" else fm(p, b, x)
    g = torch.Generator().manual_seed(0)
    means = torch.randn(10, z.shape[1], generator=g, dtype=z.dtype)
    has = torch.ones(10, dtype=torch.bool)
    has[y[0]] = False  # the first sample's class has no global mean
    got = algo.loss(fm, p, b, x, y, {"means": means, "has_mean": has})
    keep = has[y]
    reg = ((z[keep] - means[y[keep]]) ** 2).sum() / z.numel()
    assert keep.sum() < len(y)
    assert torch.allclose(got, F.cross_entropy(fm(p, b, x), y) + lam * reg, atol=1e-12, rtol=0)


def test_fedproto_inference_is_nearest_global_prototype(tmp_path):
    """Personalized prediction = argmin_c MSE(f(x), P̄_c) over classes with a prototype;
    `inference=model` uses the head."""
    run = _run(tmp_path, "fedproto")
    algo, fm, data = run.algorithm, run.fm, run.data
    algo.round(1, torch.arange(4))
    algo.has_mean[3] = False  # class 3: no prototype -> never predicted
    idx = [data.test_idx[k] for k in range(4)]
    logits = algo.client_logits(torch.arange(4), idx, 1)
    for k in range(4):
        h = fm.features(
            {n: v[k] for n, v in algo.P.items()}, {n: v[k] for n, v in algo.B.items()}, data.x[data.tensor(idx[k])]
        )
        d = ((h.unsqueeze(1) - algo.means.unsqueeze(0)) ** 2).mean(-1)
        d[:, 3] = float("inf")
        assert torch.equal(logits[k].argmax(1), d.argmin(1))
        assert (logits[k].argmax(1) != 3).all()
    algo.hp.inference = "model"
    own = run.predict(*algo.client_models(torch.arange(4), 1), idx)
    assert all(torch.equal(a, b) for a, b in zip(algo.client_logits(torch.arange(4), idx, 1), own))


# ---- FedRoD ----------------------------------------------------------------------------------------------------------
def test_fedrod_loss_trains_generic_head_with_balanced_softmax_and_personal_head_on_detached_sum(tmp_path):
    """∇(body, generic head) = ∇ BSM(h^G(z)) = ∇ CE(h^G(z) + log n_c);
    ∇(personal head) = ∇ CE(sg[h^G(z)] + h^P(sg[z]))."""
    run = _run(tmp_path, "fedrod")
    algo, fm, data = run.algorithm, run.fm, run.data
    p, b = algo.download(torch.tensor([1]))
    g = torch.Generator().manual_seed(0)
    p = {
        k: (v[0] + 0.1 * torch.randn(v[0].shape, generator=g, dtype=v.dtype)).requires_grad_(True) for k, v in p.items()
    }
    b = {k: v[0] for k, v in b.items()}
    idx = data.tensor(data.train_idx[1][:20])
    x, y = data.x[idx], data.y[idx]
    counts = algo.class_counts[1]
    assert (counts == 0).any()  # the BSM prior must handle absent classes
    loss = algo.loss(fm, p, b, x, y, {"class_counts": counts})
    got = dict(zip(p, torch.autograd.grad(loss, list(p.values()))))
    prior = torch.where(counts > 0, counts.clamp(min=1).log(), torch.full_like(counts, torch.tensor(1e-6).log().item()))
    shared = [k for k in p if not k.startswith("personal.")]
    bsm = F.cross_entropy(fm({k: p[k] for k in shared}, b, x) + prior, y)
    for k, gr in zip(shared, torch.autograd.grad(bsm, [p[k] for k in shared])):
        assert torch.allclose(got[k], gr, atol=1e-12, rtol=0), k
    h = fm.features(p, b, x).detach()
    gen = fm.head(p, b, h).detach()
    pers = fm.head(
        {
            **{k: p[k].detach() for k in HEAD},
            "head.2.weight": p["personal.head.2.weight"],
            "head.2.bias": p["personal.head.2.bias"],
        },
        b,
        h,
    )
    names = ["personal.head.2.weight", "personal.head.2.bias"]
    for k, gr in zip(names, torch.autograd.grad(F.cross_entropy(gen + pers, y), [p[k] for k in names])):
        assert torch.allclose(got[k], gr, atol=1e-12, rtol=0), k


def test_fedrod_personal_prediction_adds_personal_head_to_generic_logits(tmp_path):
    """After training: server = n_k-mean of body + generic head, personal heads stay local; client k predicts
    h^G(z) + h_k^P(z) (== its merged-classifier model); the generic model is the shared one."""
    run = _run(tmp_path, "fedrod")
    algo, fm, data = run.algorithm, run.fm, run.data
    clients = torch.arange(4)
    p0, b0 = algo.download(clients)
    res = algo.local_train(
        1,
        clients,
        (p0, b0),
        LocalSpec(loss=algo.loss, trainable=algo.trainable),
        LocalInputs(ctx={"class_counts": algo.class_counts}),
    )
    algo.round(1, clients)
    assert sorted(algo.w) == sorted(fm.param_names) and sorted(algo.local_w) == [
        "personal.head.2.bias",
        "personal.head.2.weight",
    ]
    mean = weighted_mean({k: res.params[k] for k in algo.w}, algo.n)
    assert all(_close(algo.w[k], mean[k]) for k in algo.w)
    assert _close(algo.local_w["personal.head.2.weight"], res.params["personal.head.2.weight"])
    assert not _close(algo.local_w["personal.head.2.weight"][0], run.initial_params["head.2.weight"], 1e-6)  # trained
    idx = [data.test_idx[k] for k in range(4)]
    logits = algo.client_logits(clients, idx, 1)
    merged = run.predict(*algo.client_models(clients, 1), idx)
    fm.set_mode(False)
    for k in range(4):
        x = data.x[data.tensor(idx[k])]
        h = fm.features(algo.w, algo.bn, x)
        wp = algo.local_w["personal.head.2.weight"][k]
        bp = algo.local_w["personal.head.2.bias"][k]
        penultimate = torch.relu(F.linear(h, algo.w["head.0.weight"], algo.w["head.0.bias"]))
        expected = fm.head(algo.w, algo.bn, h) + F.linear(penultimate, wp, bp)
        assert _close(logits[k], expected) and _close(merged[k], expected)
    fm.set_mode(True)
    assert algo.global_model()[0] is algo.w


def test_fedrod_head_scope_head_gives_a_full_personal_head(tmp_path):
    algo = _run(tmp_path, "fedrod", "algorithm.head_scope=head").algorithm
    assert sorted(algo.local_w) == sorted("personal." + k for k in HEAD)
    assert algo.client_models(torch.arange(4), 0) is None  # no single-model form: evaluated via client_logits


@pytest.mark.parametrize(
    "algorithm,key,value",
    [
        ("fedper", "head_scope", "body"),
        ("fedbabu", "ft_scope", "bias"),
        ("fedbabu", "ft_epochs", -1),
        ("fedproto", "lam", -1.0),
        ("fedproto", "inference", "knn"),
        ("lgfedavg", "head_scope", "all"),
    ],
)
def test_bad_values_fail_in_setup(tmp_path, algorithm, key, value):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        _run(tmp_path, algorithm, f"algorithm.{key}={value}")
