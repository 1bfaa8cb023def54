"""Oracle: FedReMa (Liang et al., ECAI 2024, Algorithm 2) vs fedbench — written from the paper and the official code
(liangh68/FedReMa, serverReMa.py / clientReMa.py), in plain PyTorch: one nn.Module per client, kept across rounds as
the code keeps its clients' models.

Line by line (round t, every client participates):
  client k: E epochs of CE on its batches, SGD momentum 0.9 kept across rounds,  -> local_sgd (torch.optim.SGD,
            gradient-norm clipping before each step (clientReMa.train)               clip_grad_norm_)
  θ^(t) = Σ_k n_k θ̂_k / Σ_k n_k                                            Eq. 6 -> weighted_average(bodies, n)
  h_k ~ U[0, 0.5)^d, one fresh probe per client (code: rand_like(...) * 0.5)          -> probes (fedbench's draw)
  S[k, j] = cos(softmax(φ̂_k(h_k)/M), softmax(φ̂_j(h_k))), S[k, k] = 1      Eq. 5, with the code's temperatures
            (compute_similarity_guassian: M = 0.5 on client k's own soft logits, 1 on the peers')
  A_k, Δs*_k: sort s_k, diff, drop the last gap (to the self-entry), argmax;  Alg. 1 as the code's get_sort_grad
            A_k = the entries above the largest gap                                    + aggregate_heads_diff
  in the CCP: W[k, i] = n_i / Σ_{A_k} n (paper) or 1/|A_k| (code), i ∈ A_k  Eq. 7
              G[k, i] += 1 for i ∈ A_k                                      Alg. 2 l. 16
              Δs̄_t = mean_k Δs*_k; the CCP ends when Δs̄_t is not the max   Eq. 8 (a mean), Eq. 9 (check_critical)
              so far and Δs̄_t / max_τ Δs̄_τ < δ
  after it:   W[k, i] = G[k, i] / Σ_j G[k, j]                               Eq. 10
  φ_k^(t) = Σ_i W[k, i] φ̂_i:
     paper (head_update=simultaneous, head_pairing=by_id): every φ_k from the uploaded (trained) heads;   Eq. 7 / 10
     code  (sequential_inplace, upload_order): `for cid in sorted(uploaded_ids)`, weights indexed by client id
            zipped with `uploaded_heads` in random.sample order, and set_head writes into the very modules that
            list references, so later clients mix heads already replaced this round.
From fedbench: data, partition, model construction and the randomness (batch order, probes, upload order).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from fedbench import seeding

from .common import (
    EXECUTORS,
    LOSS_TOL,
    Federation,
    Runs,
    assert_same_history,
    assert_same_models,
    config,
    evaluate,
    local_sgd,
    moved,
    stacked,
    weighted_average,
)

COMMON = (
    "algorithm=fedrema",
    "model=tiny_cnn",
    "model.batch_norm=false",
    "optim.persistent_state=true",
    "optim.clip_grad_norm=1.0",
    "algorithm.delta=1.0",
    "algorithm.plot_every=0",
)
MODES = {
    "paper": (
        "algorithm.head_update=simultaneous",
        "algorithm.head_pairing=by_id",
        "algorithm.relevant_weights=samples",
    ),
    "code": (
        "algorithm.head_update=sequential_inplace",
        "algorithm.head_pairing=upload_order",
        "algorithm.relevant_weights=uniform",
    ),
}


def similarity(heads: list[torch.nn.Module], probes: torch.Tensor, M: float) -> np.ndarray:
    """Eq. 5 as the code computes it, one client pair at a time."""
    K = len(heads)
    S = np.ones((K, K))
    with torch.no_grad():
        for k in range(K):
            pk = torch.softmax(heads[k](probes[k]) / M, dim=0)
            for j in range(K):
                if j != k:
                    S[k, j] = torch.cosine_similarity(pk, torch.softmax(heads[j](probes[k]), dim=0), dim=0).item()
    return S


def mds(s: np.ndarray) -> tuple[list[int], float]:
    """Alg. 1 as the code: the clients above the largest gap (the gap to the self-entry excluded) and that gap."""
    order, diff = np.argsort(s), np.diff(np.sort(s))
    m = int(np.argmax(diff[:-1]))
    return [int(order[-i]) for i in range(1, len(s) - m)], float(diff[:-1].max())


def set_head(module: torch.nn.Module, new: torch.nn.Module) -> None:
    """clientReMa.set_head: ``old_param.data = new_param.data.clone()`` (same Parameter objects, new values)."""
    for new_p, old_p in zip(new.parameters(), module.parameters()):
        old_p.data = new_p.data.clone()


def weighted_head(weights, heads: list[torch.nn.Module]) -> torch.nn.Module:
    """serverReMa: ``new_head = deepcopy(uploaded_heads[0])``, zeroed, ``+= w * head`` over ``zip(weights, heads)``."""
    new = copy.deepcopy(heads[0])
    for p in new.parameters():
        p.data.zero_()
    for w, head in zip(weights, heads):
        for p, q in zip(new.parameters(), head.parameters()):
            p.data += q.data.clone() * float(w)
    return new


def oracle(mode: str):
    cfg = config(*COMMON, *MODES[mode])
    fed, hp, code = Federation(cfg), cfg.algorithm, mode == "code"
    K = fed.K
    models = [fed.new_model() for _ in range(K)]  # the code's clients, each with its own model
    opt_state: dict = {}
    G, H, in_ccp, ccp_end = np.zeros((K, K)), [], True, None  # dependency map, Δs̄ history, CCP flag
    n = np.array(fed.n, dtype=np.float64)
    history = [{"round": 0, **evaluate(fed, lambda k: models[k], None)}]
    d = next(m for m in models[0].head.modules() if isinstance(m, torch.nn.Linear)).in_features
    for t in range(1, fed.rounds + 1):
        clients = fed.participants(t)
        assert clients == list(range(K))
        losses = []
        for k, batches in zip(clients, fed.batches(clients, "train", t)):
            loss, opt_state[k] = local_sgd(fed, models[k], batches, fed.lr(t), opt_state=opt_state.get(k))
            losses.append(loss)
        bodies = [{k: v for k, v in m.state_dict().items() if k.startswith("body.")} for m in models]
        body = weighted_average(bodies, list(n))  # Eq. 6
        probes = torch.rand(K, d, generator=seeding.torch_generator(fed.seed, "probe", t), dtype=torch.float64)
        S = similarity([m.head for m in models], probes * float(hp.probe_scale), float(hp.temperature))  # Eq. 5
        W = np.zeros((K, K))
        if in_ccp:
            gaps = []
            for k in range(K):
                A, gap = mds(S[k])  # Alg. 1
                W[k, A] = 1.0 / len(A) if code else n[A] / n[A].sum()  # Eq. 7
                G[k, A] += 1  # G
                gaps.append(gap)
            H.append(float(np.mean(gaps)))  # Eq. 8
            if int(np.argmax(H)) != len(H) - 1 and H[-1] / max(H) < float(hp.delta):  # Eq. 9
                in_ccp, ccp_end = False, t
        else:
            W = G / G.sum(1, keepdims=True)  # Eq. 10
        if code:
            order = seeding.rng(fed.seed, "upload_order", t).permutation(K)  # random.sample order
            uploaded = [models[i].head for i in order]  # references
            for cid in range(K):  # sorted(uploaded_ids)
                set_head(models[cid].head, weighted_head(W[cid], uploaded))
        else:
            trained = [copy.deepcopy(m.head) for m in models]
            new = [weighted_head(W[k], trained) for k in range(K)]
            for k in range(K):
                set_head(models[k].head, new[k])
        for m in models:  # send_models(base=True)
            m.load_state_dict(body, strict=False)
        history.append({"round": t, "train/loss": float(np.mean(losses)), **evaluate(fed, lambda k: models[k], None)})
    return fed, models, G, H, ccp_end, history


@pytest.fixture(scope="module", params=list(MODES))
def case(request, tmp_path_factory):
    mode = request.param
    return mode, oracle(mode), Runs(tmp_path_factory.mktemp(f"fedrema_{mode}"), *COMMON, *MODES[mode])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedrema_server_step_equals_the_plain_pytorch_oracle(executor, case):
    mode, (fed, models, G, H, ccp_end, history), runs = case
    assert ccp_end is not None and ccp_end < fed.rounds  # both head rules ran: MDS (Eq. 7), then G (Eq. 10)
    states = [m.state_dict() for m in models]
    assert moved(states[0], fed.initial_state()) > 1e-2
    algo = runs(executor).algorithm
    assert_same_models(algo.theta, states[0], names=algo.body_names, what=f"{mode}: body θ")
    assert_same_models(algo.phi, stacked(states), names=algo.head_names, what=f"{mode}: heads φ_k")
    assert algo.G.numpy().tolist() == G.tolist()
    assert algo.history == pytest.approx(H, abs=1e-12) and algo.ccp_end_round == ccp_end
    assert_same_history(runs(executor).history, history, LOSS_TOL[executor], keys=("pers/acc", "pers/acc_mean"))
