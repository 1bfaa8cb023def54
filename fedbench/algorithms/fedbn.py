"""FedBN — federated learning with local batch normalization (Li et al., ICLR 2021); a baseline of ECL Table 1."""

from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ..communication import Traffic, numel
from ..engine.stack import broadcast, rows, select, set_rows, weighted_mean
from . import register
from .fedavg import FedAvg


def batchnorm_names(net: torch.nn.Module) -> tuple[list[str], list[str]]:
    """(parameter names, buffer names) of the net's BatchNorm layers: affine weight/bias and
    running_mean / running_var / num_batches_tracked."""
    params, buffers = [], []
    for mod_name, mod in net.named_modules():
        if isinstance(mod, _BatchNorm):
            params += [f"{mod_name}.{n}" for n, _ in mod.named_parameters(recurse=False)]
            buffers += [f"{mod_name}.{n}" for n, _ in mod.named_buffers(recurse=False)]
    return params, buffers


@register
class FedBN(FedAvg):
    """FedBN Algorithm 1: clients train the whole model with CE; the server averages (n_k-weighted)
    every parameter and buffer EXCEPT those of BatchNorm layers, which stay with their client. Client
    k's model = the shared weights + its own BN layers (all clients' BN start from the initial model).
    On a net without BatchNorm FedBN is FedAvg.

    ``global_model()`` (not part of FedBN, which has no single model) = the shared weights with the
    n_k-weighted mean of all clients' BN layers, so generic-accuracy tables can list FedBN.
    """

    name = "fedbn"
    state_attrs = ("w", "bn", "local_w", "local_bn")

    def setup(self):
        super().setup()
        self.bn_params, self.bn_buffers = batchnorm_names(self.fm.net)
        self.local_w = broadcast(select(self.w, self.bn_params), self.K)  # BN affine params, per client
        self.local_bn = broadcast(select(self.bn, self.bn_buffers), self.K)  # BN running statistics, per client

    def client_models(self, clients, t):
        m = len(clients)
        p, b = broadcast(self.w, m), broadcast(self.bn, m)
        p.update(rows(self.local_w, clients))
        b.update(rows(self.local_bn, clients))
        return p, b

    def round(self, t, clients):
        res = self.local_train(t, clients, self.client_models(clients, t), self.train_spec)
        set_rows(self.local_w, clients, select(res.params, self.bn_params))
        set_rows(self.local_bn, clients, select(res.buffers, self.bn_buffers))
        shared_p = {k: v for k, v in res.params.items() if k not in self.local_w}  # never the BN entries
        shared_b = {k: v for k, v in res.buffers.items() if k not in self.local_bn}
        self.w = {**self.w, **self.aggregate(shared_p, clients)}
        self.bn = {**self.bn, **self.aggregate(shared_b, clients)}
        return {"train/loss": res.loss.mean().item()}

    def traffic(self, t, clients):
        """The model both ways without its BatchNorm layers (their parameters and statistics stay local)."""
        return Traffic.both_ways(clients, numel(self.w, self.bn) - numel(self.local_w, self.local_bn, stacked=True))

    def global_model(self):
        return {**self.w, **weighted_mean(self.local_w, self.n)}, {**self.bn, **weighted_mean(self.local_bn, self.n)}


__all__ = ["FedBN", "batchnorm_names"]
