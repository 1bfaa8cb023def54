"""Oracle: FedReMa+F and +A&F (Liang et al., ECAI 2024, Table 4) with BatchNorm and partial participation vs fedbench —
the paper's server rules (Eq. 5–10, as test_fedrema_server.py) with the official code's client (liangh68/FedReMa,
clientReMa.py), in plain PyTorch: one nn.Module per client, kept across rounds as the code keeps its clients' models.

Line by line (round t, the participants P = 3 of 5 clients of uneven sizes, BatchNorm in body and head):
  client k ∈ P: E epochs over its batches of                                      train_with_proto:
      rep = body(x); loss = CE(head(rep), y) + λ·MSE(proto_new, rep)               loss_mse(proto_new, rep) * lamda
      proto_new = rep.detach() with row i replaced by P̄[y_i] where class y_i has a prototype; rep is NOT detached,
      so the alignment term trains the body; no alignment before the first prototypes exist (round 1);
      SGD momentum kept across rounds, gradient-norm clipping before each step
      +A&F (train_separately_with_proto): E epochs head only (CE, no clipping), then E epochs body only as above
  client upload of class means: eval mode, one pass over its train split                 collect_protos, agg_func
  P̄_c = unweighted mean over the participants that have class c of their class-c means     proto_aggregation
  θ = Σ_{k∈P} n_k θ̂_k / Σ n_k (parameters)                                               Eq. 6
  S, MDS, Eq. 7 weights by n_i over A_k, G[k, A_k] += 1, Δs̄, Eq. 9 — over P, indexed by CLIENT ID
  after the CCP: W = G[P, P] row-normalised                                                Eq. 10
  φ_k = Σ_i W[k, i] φ̂_i for k ∈ P (the trained heads, simultaneous)                        Eq. 7 / 10
  BatchNorm running statistics (``algorithm.bn_stats``):
      local    — never leave the client (the code: set_base / set_head copy parameters only)
      averaged — travel with their layer: body n_k-weighted like θ, head mixed with the head weights
  the body goes to every client (send_models), a client outside P keeps its head (and, local, its statistics).
From fedbench: data, partition, model construction and the randomness (participants, batch order, probes).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedbench import seeding

from .common import (
    EXECUTORS,
    LOSS_TOL,
    Federation,
    Runs,
    assert_same_history,
    assert_same_models,
    client_optimizer,
    config,
    evaluate,
    moved,
    stacked,
    weighted_average,
)
from .test_fedrema_server import mds

COMMON = (
    "model=tiny_cnn",
    "participation=0.6",
    "rounds=4",
    "algorithm.lam=0.7",
    "algorithm.delta=1.0",
    "algorithm.plot_every=0",
    "optim.persistent_state=true",
    "optim.clip_grad_norm=1.0",
)
# (algorithm, bn_stats): +F with either statistics rule; +A&F (head phase, then body phase with the alignment)
CASES = (("fedrema_f", "local"), ("fedrema_f", "averaged"), ("fedrema_af", "averaged"))


def proto_steps(fed, model, opt, batches, lam, protos, clip: bool) -> float:
    """The code's step loop: ``rep = body(x); loss = CE(head(rep), y)`` [+ λ·MSE(proto_new, rep)] — ``proto_new`` =
    rep.detach() with row i replaced by P̄[y_i] where class y_i has a prototype; rep itself is NOT detached."""
    total = 0.0
    for idx in batches:
        x, y = fed.x[idx], fed.y[idx]
        rep = model.body(x)
        loss = F.cross_entropy(model.head(rep), y)
        if protos is not None:
            proto_new = copy.deepcopy(rep.detach())
            for i, yy in enumerate(y.tolist()):
                if yy in protos:
                    proto_new[i, :] = protos[yy]
            loss = loss + F.mse_loss(proto_new, rep) * lam
        opt.zero_grad()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), float(fed.cfg.optim.clip_grad_norm))
        opt.step()
        total += loss.item()
    return total / len(batches)


def train_with_proto(fed, model, k, t, lr, lam, protos, opt_state):
    """clientReMa.train_with_proto (+F) for client k: returns (mean step loss, optimizer state)."""
    opt = client_optimizer(fed, list(model.parameters()), lr, opt_state)
    model.train()
    loss = proto_steps(fed, model, opt, fed.batches([k], "train", t)[0], lam, protos, clip=True)
    return loss, copy.deepcopy(opt.state_dict())


def train_separately_with_proto(fed, model, k, t, lr, lam, protos, opt_state):
    """clientReMa.train_separately_with_proto (+A&F): E epochs of the head alone (CE, no clipping), then E epochs of
    the body alone with the alignment, one optimizer (a frozen part has no gradient, so SGD skips it)."""
    opt = client_optimizer(fed, list(model.parameters()), lr, opt_state)
    model.train()
    phases = (("head", "body", "train_head", None, False), ("body", "head", "train", protos, True))
    for part, other, phase, align, clip in phases:
        for p in getattr(model, part).parameters():
            p.requires_grad_(True)
        for p in getattr(model, other).parameters():
            p.requires_grad_(False)
        loss = proto_steps(fed, model, opt, fed.batches([k], phase, t)[0], lam, align, clip)
    for p in model.parameters():
        p.requires_grad_(True)
    return loss, copy.deepcopy(opt.state_dict())


@torch.no_grad()
def collect_protos(fed, model, batches) -> dict:
    """clientReMa.collect_protos + agg_func: eval mode, per class the mean of the body's outputs."""
    model.eval()
    reps: dict[int, list] = {}
    for idx in batches:
        rep = model.body(fed.x[idx])
        for i, yy in enumerate(fed.y[idx].tolist()):
            reps.setdefault(yy, []).append(rep[i])
    return {c: sum(v) / len(v) for c, v in reps.items()}


@torch.no_grad()
def similarity(heads: list[torch.nn.Module], probes: torch.Tensor, M: float) -> np.ndarray:
    """compute_similarity_guassian, one client pair at a time, heads in eval mode (after collect_protos)."""
    for h in heads:
        h.eval()
    S = np.ones((len(heads), len(heads)))
    for k, pk in enumerate(probes):
        own = torch.softmax(heads[k](pk.unsqueeze(0))[0] / M, dim=0)
        for j, head in enumerate(heads):
            if j != k:
                S[k, j] = torch.cosine_similarity(own, torch.softmax(head(pk.unsqueeze(0))[0], dim=0), dim=0).item()
    return S


def proto_aggregation(uploaded: list[dict]) -> dict:
    """serverReMa's proto_aggregation: per class, the plain mean of the uploaded class means that exist."""
    by_class: dict[int, list] = {}
    for protos in uploaded:
        for c, p in protos.items():
            by_class.setdefault(c, []).append(p)
    return {c: sum(v) / len(v) for c, v in by_class.items()}


def floating(state: dict, prefix: str, buffers: set[str], want_buffers: bool) -> dict:
    return {
        k: v
        for k, v in state.items()
        if k.startswith(prefix) and v.is_floating_point() and ((k in buffers) == want_buffers)
    }


def oracle(algorithm: str, bn_stats: str):
    cfg = config(f"algorithm={algorithm}", *COMMON, f"algorithm.bn_stats={bn_stats}")
    client = train_separately_with_proto if cfg.algorithm.alternate else train_with_proto
    fed, hp = Federation(cfg), cfg.algorithm
    K, n = fed.K, np.array(fed.n, dtype=np.float64)
    models = [fed.new_model() for _ in range(K)]
    buffers = {name for name, _ in models[0].named_buffers()}
    opt_state: dict = {}
    G, H, in_ccp, ccp_end, protos = np.zeros((K, K)), [], True, None, None
    history = [{"round": 0, **evaluate(fed, lambda k: models[k], None)}]
    d = next(m for m in models[0].head.modules() if isinstance(m, torch.nn.Linear)).in_features
    participants = []
    for t in range(1, fed.rounds + 1):
        P = fed.participants(t)
        participants.append(P)
        losses = []
        for k in P:
            loss, opt_state[k] = client(fed, models[k], k, t, fed.lr(t), float(hp.lam), protos, opt_state.get(k))
            losses.append(loss)
        protos = proto_aggregation(
            [collect_protos(fed, models[k], b) for k, b in zip(P, fed.batches(P, "protos", t, epochs=1))]
        )
        states = [models[k].state_dict() for k in P]
        body = weighted_average([floating(s, "body.", buffers, False) for s in states], list(n[P]))  # Eq. 6
        if bn_stats == "averaged":
            body.update(weighted_average([floating(s, "body.", buffers, True) for s in states], list(n[P])))
        probes = torch.rand(K, d, generator=seeding.torch_generator(fed.seed, "probe", t), dtype=torch.float64)
        trained = [copy.deepcopy(models[k].head) for k in P]
        S = similarity(trained, probes[P] * float(hp.probe_scale), float(hp.temperature))  # Eq. 5 over P
        W = np.zeros((len(P), len(P)))
        if in_ccp:
            gaps = []
            for r, k in enumerate(P):
                A, gap = mds(S[r])  # positions within P
                W[r, A] = n[P][A] / n[P][A].sum()  # Eq. 7
                G[k, [P[a] for a in A]] += 1  # by client id
                gaps.append(gap)
            H.append(float(np.mean(gaps)))  # Eq. 8
            if int(np.argmax(H)) != len(H) - 1 and H[-1] / max(H) < float(hp.delta):  # Eq. 9
                in_ccp, ccp_end = False, t
        else:
            sub = G[np.ix_(P, P)]
            W = np.where(
                sub.sum(1, keepdims=True) > 0, sub / np.maximum(sub.sum(1, keepdims=True), 1e-300), np.eye(len(P))
            )
        heads = [h.state_dict() for h in trained]
        for r, k in enumerate(P):  # φ_k = Σ_i W[k, i] φ̂_i (parameters; averaged: the statistics too)
            new = {}
            for name, v in heads[r].items():
                if not v.is_floating_point() or (name in {b[len("head.") :] for b in buffers} and bn_stats == "local"):
                    continue
                new[name] = sum(float(W[r, i]) * heads[i][name] for i in range(len(P)))
            models[k].head.load_state_dict(new, strict=False)
        for m in models:  # send_models(base=True): θ (and, averaged, the body statistics) to every client
            m.load_state_dict({k: v.clone() for k, v in body.items()}, strict=False)
        history.append({"round": t, "train/loss": float(np.mean(losses)), **evaluate(fed, lambda k: models[k], None)})
    return fed, models, buffers, G, H, ccp_end, protos, participants, history


@pytest.fixture(scope="module", params=CASES, ids=["_".join(c) for c in CASES])
def case(request, tmp_path_factory):
    algorithm, bn_stats = request.param
    overrides = (f"algorithm={algorithm}", *COMMON, f"algorithm.bn_stats={bn_stats}")
    return bn_stats, oracle(algorithm, bn_stats), Runs(tmp_path_factory.mktemp(f"{algorithm}_{bn_stats}"), *overrides)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedrema_f_with_batchnorm_and_partial_participation_equals_the_code_client_oracle(executor, case):
    bn_stats, (fed, models, buffers, G, H, ccp_end, protos, participants, history), runs = case
    # the setting exercises what it is meant to: uneven clients, ids ≠ positions, both head rules, prototypes
    assert len(set(fed.n)) == fed.K and any(P != list(range(len(P))) for P in participants)
    assert ccp_end is not None and ccp_end < fed.rounds
    states = [m.state_dict() for m in models]
    assert moved(states[0], fed.initial_state()) > 1e-2
    run = runs(executor)
    algo = run.algorithm
    assert_same_models(algo.theta, states[0], names=algo.body_names, what=f"{bn_stats}: body θ")
    body_stats = [b for b in algo.body_bufs if states[0][b].is_floating_point()]
    head_stats = [b for b in algo.head_bufs if states[0][b].is_floating_point()]
    assert body_stats and head_stats  # BatchNorm in both parts
    if bn_stats == "local":
        assert_same_models(algo.body_buf, stacked(states), names=body_stats, what="each client's body statistics")
        assert not all(torch.equal(states[0][b], states[k][b]) for k in range(fed.K) for b in body_stats)
    else:
        assert_same_models(algo.theta_buf, states[0], names=body_stats, what="averaged body statistics")
    assert_same_models(algo.phi, stacked(states), names=algo.head_names, what=f"{bn_stats}: heads φ_k")
    assert_same_models(algo.phi_buf, stacked(states), names=head_stats, what=f"{bn_stats}: head statistics")
    assert algo.G.numpy().tolist() == G.tolist()
    assert algo.history == pytest.approx(H, abs=1e-12) and algo.ccp_end_round == ccp_end
    # the server's class prototypes of the last round (unweighted over the participants that have the class)
    assert sorted(protos) == torch.nonzero(algo.has_proto).flatten().tolist()
    for c, p in protos.items():
        assert torch.allclose(algo.protos[c], p, rtol=0, atol=1e-12), c
    assert_same_history(run.history, history, LOSS_TOL[executor], keys=("pers/acc", "pers/acc_mean"))
