"""MOON: ℓ_con on hand-made vectors, the full local loss against an independent nn.Module computation
(references in eval mode, untouched), the previous-model bookkeeping, executor equivalence."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from baseline_checks import batch, executors_agree_and_it_learns, perturbed, setup_run

from fedbench.algorithms.moon import model_contrastive
from fedbench.engine.stack import row, tagged


def test_model_contrastive_loss_by_hand():
    """z=(1,0): cos with z_glob=(1,1) is 1/√2, with z_prev=(0,2) is 0; second sample: z=(0,1), z_glob=(0,3)
    (cos 1), z_prev=(1,0) (cos 0). τ=0.5 → ℓ = mean(log(1+e^{−√2}), log(1+e^{−2}))."""
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    zg = torch.tensor([[1.0, 1.0], [0.0, 3.0]], dtype=torch.float64)
    zp = torch.tensor([[0.0, 2.0], [1.0, 0.0]], dtype=torch.float64)
    expected = (math.log(1 + math.exp(-math.sqrt(2))) + math.log(1 + math.exp(-2))) / 2
    assert abs(model_contrastive(z, zg, zp, 0.5).item() - expected) < 1e-15
    # previous == global: the term is the constant log 2 (no gradient), MOON's first round
    assert abs(model_contrastive(z, zg, zg, 0.5).item() - math.log(2)) < 1e-15


def _module(fm, p, b, train):
    net = copy.deepcopy(fm.net)
    net.load_state_dict({**p, **b})
    return net.train(train)


def _moon_parts(net):
    """(hidden head layers, projection head, classifier) of MOON's model, read off the module tree."""
    *hidden, projection, classifier = list(net.head)
    return torch.nn.Sequential(*hidden), projection, classifier


def test_moon_model_has_the_papers_projection_head():
    """MOON §3.2 / code ``ModelFedCon``: features h (everything before the classifier) -> Linear(d, d) -> ReLU ->
    Linear(d, 256) = the projection z; the classifier reads z. On the default MLP d = 128 (its hidden layer)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        run = setup_run(Path(d), "moon")
    hidden, projection, classifier = _moon_parts(run.fm.net)
    linears = [m for m in projection if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(128, 128), (128, 256)]
    assert any(isinstance(m, torch.nn.ReLU) for m in projection)
    assert (classifier.in_features, classifier.out_features) == (256, 10)
    assert run.fm.names("classifier") == [
        n for n in run.fm.param_names if n.startswith(f"head.{len(run.fm.net.head) - 1}.")
    ]


def test_local_loss_is_ce_plus_mu_contrastive_on_the_projection_with_eval_mode_references(tmp_path):
    """On the tiny CNN with BatchNorm (head: FC 32 + BN + ReLU, then MOON's projection 32 -> 32 -> 256, classifier):
    loss = CE(classifier(z), y) + μ·ℓ_con(z, z_glob, z_prev), z = projection(hidden(body(x))) of the local model in
    train mode, z_glob / z_prev of the global / previous models in eval mode (MOON's code), computed here
    independently with nn.Module copies. The references' BN statistics are not modified."""
    mu, tau = 2.0, 0.3
    run = setup_run(tmp_path, "moon", "model=tiny_cnn", f"algorithm.mu={mu}", f"algorithm.tau={tau}")
    algo, fm = run.algorithm, run.fm
    w_loc, w_prev = perturbed(algo.w, 0.05, 1), perturbed(algo.w, 0.05, 2)
    bn_prev = {k: (v + 0.1 if v.is_floating_point() else v) for k, v in algo.bn.items()}  # distinct running stats
    x, y = batch(run, n=12)
    ctx = {"w_global": algo.w, "bn_global": algo.bn, **tagged(w_prev, "w_prev"), **tagged(bn_prev, "bn_prev")}
    before = [{k: v.clone() for k, v in d.items()} for d in (algo.bn, bn_prev)]
    bn_loc = {k: v.clone() for k, v in algo.bn.items()}  # the local model's own statistics (updated)
    got = algo.local_loss(fm, w_loc, bn_loc, x, y, ctx)

    def z_of(net, x):
        hidden, projection, _ = _moon_parts(net)
        return projection(hidden(net.body(x)))

    local = _module(fm, w_loc, before[0], True)
    z = z_of(local, x)
    assert z.shape == (12, 256)
    with torch.no_grad():
        zg = z_of(_module(fm, algo.w, algo.bn, False), x)
        zp = z_of(_module(fm, w_prev, bn_prev, False), x)
    pos, neg = F.cosine_similarity(z, zg), F.cosine_similarity(z, zp)
    l_con = (-(pos / tau) + torch.logsumexp(torch.stack([pos, neg], 1) / tau, 1)).mean()
    expected = F.cross_entropy(_moon_parts(local)[2](z), y) + mu * l_con
    assert torch.allclose(got, expected, atol=1e-12, rtol=0)
    assert abs(l_con.item() - math.log(2)) > 1e-3  # the contrastive term is non-trivial here
    for now, then in zip((algo.bn, bn_prev), before):
        assert all(torch.equal(now[k], then[k]) for k in now)


def test_other_methods_keep_their_model_and_moon_shares_its_initial_layers(tmp_path):
    """The projection head exists only for algorithm=moon: FedAvg / FedProx / MOON as in FedReMa's tables
    (PFLlib's MOON, no projection) build the configured model unchanged, and MOON's body and hidden head layers
    start bit-identical to theirs (only the projection and the 256-wide classifier are new)."""
    init, classifier = {}, {}
    for algo in ("fedavg", "fedprox", "moon_rema", "moon"):
        run = setup_run(tmp_path / algo, algo, "model=tiny_cnn")
        init[algo], classifier[algo] = run.algorithm.initial_model()[0], run.fm.names("classifier")
    assert init["fedprox"].keys() == init["fedavg"].keys() == init["moon_rema"].keys()
    for a in ("fedprox", "moon_rema"):
        assert all(torch.equal(init[a][k], init["fedavg"][k]) for k in init["fedavg"])
    moon = init["moon"]
    shared = [k for k in init["fedavg"] if k not in classifier["fedavg"]]  # all but the classifier Linear
    assert all(torch.equal(moon[k], init["fedavg"][k]) for k in shared)
    assert len(moon) == len(init["fedavg"]) + 4  # + projection Linear(d, d), Linear(d, 256)
    assert moon[classifier["moon"][0]].shape == (10, 256)


def test_previous_model_is_the_clients_last_trained_model(tmp_path):
    """After a round, participants' previous models are exactly their trained models; others keep the
    initial global model (MOON initialises every previous model as the global model)."""
    run = setup_run(tmp_path, "moon", "model=tiny_cnn")
    algo = run.algorithm
    w0 = {k: v.clone() for k, v in algo.w.items()}
    clients = torch.tensor([1, 3])
    algo.round(1, clients)
    for k in w0:
        assert torch.equal(algo.prev_w[k][0], w0[k]) and torch.equal(algo.prev_w[k][2], w0[k])
    # the global model is the n_k-weighted average of the two previous (= trained) models
    n = algo.n[clients].to(torch.float64)
    for k in w0:  # every parameter, MOON's projection head included, is trained and averaged like the body
        avg = (n[0] * algo.prev_w[k][1] + n[1] * algo.prev_w[k][3]) / n.sum()
        assert torch.allclose(algo.w[k], avg, atol=1e-12), k
        assert not torch.equal(algo.w[k], w0[k]), k
    assert not torch.equal(row(algo.prev_w, 1)["head.0.weight"], w0["head.0.weight"])


def test_sequential_equals_vectorized_and_it_learns(tmp_path):
    executors_agree_and_it_learns(tmp_path, "moon", "algorithm.mu=1")


def test_resumed_moon_run_rebuilds_the_projection_head_and_equals_uninterrupted(tmp_path):
    """The projection head is re-installed (same seed) when a run resumes: a run resumed from its round-1
    checkpoint ends with the same global and previous models as the uninterrupted run."""
    import json

    from conftest import make_cfg

    from fedbench.run import Run

    args = ["algorithm=moon", "hardware.precision=fp64", "rounds=2", "checkpoint.every=1", "checkpoint.keep_complete=1"]
    full = Run(make_cfg(*args), tmp_path)
    full.execute()
    assert (tmp_path / "checkpoints" / "round_000001.pt").exists()  # kept (checkpoint.keep_complete=1)
    (tmp_path / "summary.json").unlink()  # as if killed during round 2
    status = json.loads((tmp_path / "status.json").read_text())
    (tmp_path / "status.json").write_text(json.dumps({**status, "status": "running"}))
    resumed = Run(make_cfg(*args, "resume=true"), tmp_path)
    resumed.execute()
    for attr in ("w", "prev_w"):
        a, b = getattr(full.algorithm, attr), getattr(resumed.algorithm, attr)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), attr
