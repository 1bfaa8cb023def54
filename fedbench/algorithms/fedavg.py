"""FedAvg (McMahan et al., AISTATS 2017) and Local (no communication)."""

from __future__ import annotations

from ..communication import NONE, Traffic, numel
from ..engine.functional import cross_entropy
from ..engine.stack import broadcast, rows, set_rows
from . import register
from .base import Algorithm
from .local import LocalInputs, LocalSpec


@register
class FedAvg(Algorithm):
    """Clients run E epochs of SGD from the global model; the server averages weighted by n_k."""

    name = "fedavg"
    state_attrs = ("w", "bn")

    def setup(self):
        self.w, self.bn = self.initial_model()  # global parameters and buffers
        self.train_spec = self.train_spec.replace(loss=self.local_loss)

    # the local objective of ONE client on one batch (runs under vmap): FedAvg's is plain cross-entropy; FedProx,
    # FedNTD, FedLC and MOON override it (and client_context / after_local) instead of copying round
    local_loss = staticmethod(cross_entropy)

    def round(self, t, clients):
        m = len(clients)
        ctx, shared = self.client_context(clients)
        res = self.local_train(
            t,
            clients,
            (broadcast(self.w, m), broadcast(self.bn, m)),
            self.train_spec,
            LocalInputs(ctx=ctx, shared=shared),
        )
        self.after_local(clients, res)
        self.w = self.aggregate(res.params, clients)
        self.bn = self.aggregate(res.buffers, clients)
        return {"train/loss": res.loss.mean().item()}

    def client_context(self, clients) -> tuple[dict, dict]:
        """What the local objective reads besides the batch: (per-client stacks [M, ...], tensors common to all)."""
        return {}, {}

    def after_local(self, clients, res) -> None:
        """Called with the round's local training result before the server averages it."""

    def global_model(self):
        return self.w, self.bn

    def traffic(self, t, clients):
        """The model both ways (parameters and buffers); FedProx, FedNTD, FedLC, MOON, FedDyn, FedAvg-FT alike."""
        return Traffic.both_ways(clients, numel(self.w, self.bn))


@register
class Local(Algorithm):
    """Each client trains its own model on its own data only (the "Local" rows of the papers)."""

    name = "local"
    state_attrs = ("P", "B")

    def setup(self):
        w, bn = self.initial_model()
        self.P, self.B = broadcast(w, self.K), broadcast(bn, self.K)

    def round(self, t, clients):
        res = self.local_train(t, clients, (rows(self.P, clients), rows(self.B, clients)), self.train_spec)
        set_rows(self.P, clients, res.params)
        set_rows(self.B, clients, res.buffers)
        return {"train/loss": res.loss.mean().item()}

    def client_models(self, clients, t):
        return rows(self.P, clients), rows(self.B, clients)

    def traffic(self, t, clients):
        return NONE  # no communication


@register
class FedAvgFT(FedAvg):
    """FedAvg whose global model each client fine-tunes locally before its personalized evaluation."""

    name = "fedavg_ft"

    def setup(self):
        super().setup()
        steps = int(self.hp.ft_steps) if self.hp.ft_steps else None
        self.ft_spec = LocalSpec(
            "finetune",
            opt=self.opt.replace(lr=float(self.hp.ft_lr)),
            epochs=None if steps else int(self.hp.ft_epochs),
            steps=steps,
        )

    def client_models(self, clients, t):
        m = len(clients)
        res = self.local_train(t, clients, (broadcast(self.w, m), broadcast(self.bn, m)), self.ft_spec)
        return res.params, res.buffers


__all__ = ["FedAvg", "Local", "FedAvgFT"]
