"""FedFomo (Zhang, Sapra, Fidler, Yeung, Alvarez, ICLR 2021): personalized FL with first-order model optimization.

A baseline of FedKA Table 9 (docs/pfl_baselines_b.md).
Read with the official code ``NVlabs/FedFomo`` and PFLlib's clientfomo/serverfomo.
The server stores every client's latest uploaded model and only relays them; round t, client k (§3, Alg. 1):

1. download M peer models θ_j chosen ε-greedily from the affinity row P[k] (with probability ε_t a random
   peer, else the highest-affinity one not yet chosen; ε_t = max(0, ε − (t−1)·decay), official code);
2. first-order weights on the local validation split (``val_fraction`` of the client's train data):
   w_{k,j} = (L_k(θ_k) − L_k(θ_j)) / ‖θ_j − θ_k‖ (Eq. 6), and the update
   θ_k ← θ_k + Σ_j w̃_{k,j} (θ_j − θ_k) with w̃ = max(w, 0) / Σ_j max(w, 0) (Eq. 7; no positive weight: keep θ_k);
   the affinity row gets P[k, j] += w_{k,j};
3. local training (CE, E epochs) on the remaining train data; the trained model is uploaded.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .. import seeding
from ..checks import int_at_least, number, one_of
from ..communication import Traffic, numel
from ..engine.stack import Stack, broadcast, rows, set_rows, weighted_mean
from . import register
from .base import Algorithm
from .local import LocalInputs

DIST_EPS = 1e-5  # added to ‖θ_j − θ_k‖ (PFLlib ``weight_cal``), so identical models give w = 0, not 0/0


def fomo_weights(
    own_loss: torch.Tensor, peer_loss: torch.Tensor, dist: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6-7 for M clients and up to J peers each: (raw w [M, J], normalised w̃ [M, J]).

    ``own_loss`` [M] = L_k(θ_k), ``peer_loss`` [M, J] = L_k(θ_j), ``dist`` [M, J] = ‖θ_j − θ_k‖,
    ``valid`` [M, J] marks real peers (padding slots get 0). Rows without a positive weight are all 0.
    """
    w = torch.where(valid, (own_loss.unsqueeze(1) - peer_loss) / (dist + DIST_EPS), torch.zeros_like(peer_loss))
    pos = w.clamp(min=0)
    s = pos.sum(1, keepdim=True)
    return w, torch.where(s > 0, pos / s.clamp(min=1e-300), torch.zeros_like(pos))


def epsilon_greedy(
    affinity: np.ndarray, candidates: list[int], M: int, eps: float, rng: np.random.Generator
) -> list[int]:
    """M distinct peers from ``candidates``: per slot, with probability ``eps`` the next of a random order, else
    the next by ``affinity`` (descending, random tie-breaking) — official ``get_federating_clients``."""
    if not candidates:
        return []
    cand = np.asarray(candidates, dtype=np.int64)
    top = list(cand[np.lexsort((rng.random(len(cand)), affinity[cand]))[::-1]])
    rand = list(rng.permutation(cand))
    chosen: list[int] = []
    for _ in range(min(M, len(cand))):
        order = rand if rng.random() < eps else top
        while order[0] in chosen:
            order.pop(0)
        chosen.append(int(order.pop(0)))
    return chosen


def pair_distances(stack: Stack, a: torch.Tensor, b: torch.Tensor, norm: str = "l2") -> torch.Tensor:
    """‖stack[a_i] − stack[b_i]‖ over all float tensors, for every pair i (``norm`` l2 or l1)."""
    total = torch.zeros(len(a), dtype=torch.float64)
    for v in stack.values():
        if not v.is_floating_point():
            continue
        for s in range(0, len(a), 8):  # a few pairs at a time: bounded memory for large models
            d = (v[a[s : s + 8]] - v[b[s : s + 8]]).flatten(1)
            total[s : s + 8] += (d.abs().sum(1) if norm == "l1" else (d**2).sum(1)).double().cpu()
    return total if norm == "l1" else total.sqrt()


@register
class FedFomo(Algorithm):
    """State: every client's latest model θ_k (the server's copy), the affinity matrix P, who has uploaded."""

    name = "fedfomo"
    state_attrs = ("P", "B", "affinity", "uploaded")

    def setup(self):
        for key, check in (
            ("M", int_at_least(1)),
            ("val_fraction", number(0, 1, lo_open=True, hi_open=True)),
            ("epsilon", number(0, 1)),
            ("epsilon_decay", number(0)),
            ("distance", one_of("l2", "l1")),
        ):
            self.checked_hp(key, check)
        w, bn = self.initial_model()
        self.P, self.B = broadcast(w, self.K), broadcast(bn, self.K)
        self.affinity = torch.zeros(self.K, self.K, dtype=torch.float64)  # P[k, j]: k's accumulated w_{k,j}
        self.uploaded = torch.zeros(self.K, dtype=torch.bool)
        self.val_idx, self.fit_idx = [], []  # fixed local split: validation (Eq. 6) / training
        for k in range(self.K):
            idx = self.data.train_idx[k]
            perm = idx[seeding.rng(self.seed, "fomo_val", k).permutation(len(idx))]
            nv = min(max(1, int(float(self.hp.val_fraction) * len(idx))), len(idx) - 1)
            self.val_idx.append(np.sort(perm[:nv]))
            self.fit_idx.append(np.sort(perm[nv:]))

    def round(self, t, clients):
        hp = self.hp
        eps = max(0.0, float(hp.epsilon) - (t - 1) * float(hp.epsilon_decay))
        avail = torch.nonzero(self.uploaded).flatten().tolist()
        affinity = self.affinity.cpu().numpy()
        peers = [
            epsilon_greedy(
                affinity[k], [j for j in avail if j != k], int(hp.M), eps, seeding.rng(self.seed, "fomo_peers", t, k)
            )
            for k in clients.tolist()
        ]
        self.peers_sent = sum(len(p) for p in peers)  # models downloaded this round (traffic)
        A, metrics = self.first_order_update(clients, peers)
        start = {n: torch.tensordot(A.to(v), v, dims=([1], [0])) for n, v in self.P.items()}  # Eq. 7 as W @ θ
        start_b = {
            n: (torch.tensordot(A.to(v), v, dims=([1], [0])) if v.is_floating_point() else v[clients])
            for n, v in self.B.items()
        }
        res = self.local_train(
            t,
            clients,
            (start, start_b),
            self.train_spec,
            LocalInputs(indices=[self.fit_idx[k] for k in clients.tolist()]),
        )
        set_rows(self.P, clients, res.params)
        set_rows(self.B, clients, res.buffers)
        self.uploaded[clients.long().cpu()] = True
        return {"train/loss": res.loss.mean().item(), **metrics}

    def first_order_update(self, clients, peers: list[list[int]]) -> tuple[torch.Tensor, dict]:
        """The mixing matrix A [m, K] of Eq. 7 (row i: client k_i's new model = A[i] @ θ) and diagnostics;
        updates the affinity rows."""
        m, K = len(clients), self.K
        ks = clients.tolist()
        A = torch.zeros(m, K, dtype=torch.float64)
        A[torch.arange(m), clients.long().cpu()] = 1.0
        J = max((len(p) for p in peers), default=0)
        if J == 0:
            return A, {}
        # every (client, model) pair to score on the client's validation split: the own model first, then peers
        pair_client = [i for i in range(m) for _ in range(1 + len(peers[i]))]
        pair_model = [j for i in range(m) for j in [ks[i], *peers[i]]]
        sel = torch.tensor(pair_model)
        logits = self.ctx.predict(rows(self.P, sel), rows(self.B, sel), [self.val_idx[ks[i]] for i in pair_client])
        losses = torch.stack(
            [
                F.cross_entropy(z, self.data.y[self.data.tensor(self.val_idx[ks[i]])]).double().cpu()
                for z, i in zip(logits, pair_client)
            ]
        )
        own_loss = torch.zeros(m, dtype=torch.float64)
        peer_loss = torch.zeros(m, J, dtype=torch.float64)
        dist = torch.zeros(m, J, dtype=torch.float64)
        valid = torch.zeros(m, J, dtype=torch.bool)
        own_sel = torch.tensor([ks[i] for i in range(m) for _ in peers[i]], dtype=torch.long)
        peer_sel = torch.tensor([j for i in range(m) for j in peers[i]], dtype=torch.long)
        d = pair_distances(self.P, peer_sel, own_sel, self.hp.distance)
        pos, q = 0, 0
        for i in range(m):
            own_loss[i] = losses[pos]
            n = len(peers[i])
            peer_loss[i, :n], dist[i, :n], valid[i, :n] = losses[pos + 1 : pos + 1 + n], d[q : q + n], True
            pos, q = pos + 1 + n, q + n
        w, wn = fomo_weights(own_loss, peer_loss, dist, valid)
        for i in range(m):
            n = len(peers[i])
            if n:
                self.affinity[ks[i], peers[i]] += w[i, :n].to(self.affinity.device)
                A[i, peers[i]] += wn[i, :n]
                A[i, ks[i]] -= wn[i, :n].sum()
        return A, {
            "fedfomo/positive_peers": float((w > 0).sum(1).double().mean()),
            "fedfomo/self_weight": float(A[torch.arange(m), clients.long().cpu()].mean()),
        }

    def traffic(self, t, clients):
        """Down: the M peer models each client chose (fewer while fewer have uploaded), up: its trained model (Alg. 1;
        the server only relays)."""
        model = numel(self.P, self.B, stacked=True)
        return Traffic(len(clients) * model, self.peers_sent * model)

    def client_models(self, clients, t):
        return rows(self.P, clients), rows(self.B, clients)

    def global_model(self):
        """No global model in FedFomo; the generic model (FedKA Table 9; averaging: our choice) is the n_k-weighted
        average of the uploaded client models (all clients' initial model before any upload)."""
        w = self.n * (self.uploaded.cpu().double() if self.uploaded.any() else 1.0)
        return weighted_mean(self.P, w), weighted_mean(self.B, w)

    def finish(self, run_dir) -> dict:
        self.publish_matrix(
            "fedfomo_affinity",
            int(self.cfg.rounds),
            self.affinity,
            title="FedFomo affinity P[k, j] (accumulated w_kj)",
            xlabel="peer j",
            ylabel="client k",
        )
        return {"fedfomo_affinity": self.affinity.tolist()}


__all__ = ["FedFomo", "epsilon_greedy", "fomo_weights", "pair_distances"]
