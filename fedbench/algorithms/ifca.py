"""IFCA (Ghosh, Chung, Yin, Ramchandran, NeurIPS 2020): iterative federated clustering
(IFCA / IFCA-FT: baselines of CAFeMe Tables 1-2, as in the CAFeMe code)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .. import seeding
from ..checks import is_int
from ..communication import Traffic, numel
from ..engine.stack import mix, rows
from . import register
from .base import Algorithm


@register
class IFCA(Algorithm):
    """IFCA Alg. 2 (model averaging), per round:

    1. every sampled client k estimates its cluster ĵ_k = argmin_j F_k(θ_j), F_k = the sum of the
       cross-entropies of cluster model j over its train mini-batches (CAF code: the lowest train loss);
    2. it trains θ_ĵ with the run's local solver (CAF: 5 epochs of SGD, lr 0.001);
    3. server: θ_j = unweighted mean of the models trained from cluster j (unchanged if nobody chose it)
       — a matrix product of the normalised assignment matrix with the client stack.

    Evaluation (IFCA row): each client's lowest-train-loss cluster model, also for new clients; the
    IFCA-FT row (``new_clients_finetune: true``) fine-tunes that model.
    """

    name = "ifca"
    state_attrs = ("W", "WB")  # cluster stacks: leading axis = J clusters

    def setup(self):
        self.J = self.checked_hp(  # more clusters than clients: in every round some are trained by nobody
            "clusters", (lambda v: is_int(v) and 1 <= v <= self.K, f"an integer in [1, clients={self.K}]")
        )
        self.W, self.WB = self.initial_clusters()

    def initial_clusters(self):
        """J independently initialised models (IFCA: random initialisation of every θ_j), keyed by (seed, j)."""
        ps, bs = [], []
        for j in range(self.J):
            net = copy.deepcopy(self.fm.net)
            seeding.seed_everything(self.seed, "ifca_init", j)
            for mod in net.modules():
                if hasattr(mod, "reset_parameters") and mod is not net:
                    mod.reset_parameters()
            ps.append({k: v.detach() for k, v in net.named_parameters()})
            bs.append({k: v.detach() for k, v in net.named_buffers()})
        return (
            {k: torch.stack([p[k] for p in ps]) for k in ps[0]},
            {k: torch.stack([b[k] for b in bs]) for k in bs[0]} if bs and bs[0] else {},
        )

    @torch.no_grad()
    def cluster_losses(self, clients) -> torch.Tensor:
        """[M, J]: Σ over the client's train mini-batches (size B, in order) of CE of cluster model j (eval mode);
        computed on the device without reading a value on the host."""
        B, fm = int(self.cfg.batch_size), self.fm
        out = torch.zeros(len(clients), self.J, dtype=torch.float64, device=self.data.x.device)
        fm.set_mode(False)
        try:
            for m, k in enumerate(int(c) for c in clients):
                idx = self.data.tensor(self.data.train_idx[k])
                for j in range(self.J):
                    p, b = {n: v[j] for n, v in self.W.items()}, {n: v[j] for n, v in self.WB.items()}
                    for i in range(0, len(idx), B):  # summed in order in float64, as the batch losses come
                        out[m, j] += F.cross_entropy(
                            fm(p, b, self.data.x[idx[i : i + B]]), self.data.y[idx[i : i + B]]
                        ).double()
        finally:
            fm.set_mode(True)
        return out

    def assign(self, clients) -> torch.Tensor:
        """ĵ_k = argmin_j F_k(θ_j) (IFCA Alg. 2 line 6)."""
        return self.cluster_losses(clients).argmin(1)

    def round(self, t, clients):
        j = self.assign(clients)
        res = self.local_train(t, clients, (rows(self.W, j), rows(self.WB, j)), self.train_spec)
        A = F.one_hot(j, self.J).T.to(torch.float64)  # [J, M] cluster ← client
        size = A.sum(1)
        chosen = size > 0
        avg_p, avg_b = mix(res.params, A / size.clamp(min=1)[:, None]), mix(res.buffers, A / size.clamp(min=1)[:, None])
        for k in self.W:
            self.W[k] = torch.where(
                chosen.view(-1, *[1] * (self.W[k].dim() - 1)).to(self.W[k].device), avg_p[k], self.W[k]
            )
        for k in self.WB:
            if not self.WB[k].is_floating_point():  # integer counters (BN num_batches_tracked): kept per cluster
                continue
            self.WB[k] = torch.where(
                chosen.view(-1, *[1] * (self.WB[k].dim() - 1)).to(self.WB[k].device), avg_b[k], self.WB[k]
            )
        return {"train/loss": res.loss.mean().item(), "ifca/cluster_sizes": size.long().tolist()}

    def traffic(self, t, clients):
        """IFCA Alg. 2: down all J cluster models, up the one trained model (its cluster's index is not counted)."""
        m, model = len(clients), numel(self.W, self.WB, stacked=True)
        return Traffic(m * model, m * self.J * model)

    def client_models(self, clients, t):
        j = self.assign(clients)
        return rows(self.W, j), rows(self.WB, j)

    def new_client_model(self, clients):
        return self.client_models(clients, 0)


__all__ = ["IFCA"]
