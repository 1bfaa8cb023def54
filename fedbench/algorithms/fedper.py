"""FedPer (Arivazhagan et al., arXiv 1912.00818, 2019), and the partial-aggregation pattern it shares with
LG-FedAvg, FedBABU and FedRoD: the server averages some of the model ("shared" names), every client keeps the
rest ("local" names) as its own (FedPer: baseline of FedReMa Tables 1-2, ECL Tables 1-2)."""

from __future__ import annotations

from ..communication import Traffic, numel
from ..engine.stack import broadcast, rows, select, set_rows
from ..errors import ConfigError
from . import register
from .base import Algorithm

HEAD_SCOPES = ("head", "classifier")


class PartialAggregation(Algorithm):
    """Per round t, for the sampled clients S:

    1. download: client k's model = the server's shared part w^t + its own local part v_k;
    2. local training with ``self.train_spec`` (``local_epochs`` of CE of all names unless a subclass says otherwise);
    3. upload: v_k <- trained local part;  w^{t+1} = Σ_{k∈S} n_k w_k / Σ n_k over the shared names only.

    Subclasses say which parameter/buffer names stay local (:meth:`is_local`). Client k's personalized model is
    what it would hold after the next download (shared w + own v_k). ``algorithm.head_scope`` picks the layers
    the method calls "head": ``head`` = all layers after the body (FedReMa's split: all FC layers),
    ``classifier`` = the final Linear only (ECL's split; PFLlib's ``model.head``).
    """

    state_attrs = ("w", "bn", "local_w", "local_bn")

    def is_local(self, name: str) -> bool:
        raise NotImplementedError

    def in_head(self, name: str) -> bool:
        """Whether parameter/buffer ``name`` is in the configured head scope."""
        return self.fm.net.part_of(name, self.hp.head_scope)

    def setup(self):
        if self.hp.head_scope not in HEAD_SCOPES:
            raise ConfigError("algorithm.head_scope", self.hp.head_scope, "one of " + ", ".join(HEAD_SCOPES))
        w, bn = self.initial_model()
        self.w = {k: v for k, v in w.items() if not self.is_local(k)}  # server: shared parameters
        self.bn = {k: v for k, v in bn.items() if not self.is_local(k)}  # server: shared buffers
        self.local_w = broadcast({k: v for k, v in w.items() if self.is_local(k)}, self.K)  # v_k, every client
        self.local_bn = broadcast({k: v for k, v in bn.items() if self.is_local(k)}, self.K)

    def download(self, clients):
        """Stacked models of ``clients``: shared part from the server + each client's local part."""
        m = len(clients)
        return (
            {**broadcast(self.w, m), **rows(self.local_w, clients)},
            {**broadcast(self.bn, m), **rows(self.local_bn, clients)},
        )

    def upload(self, clients, res) -> None:
        """Keep the trained local parts; n_k-weighted average of the shared parts (step 3)."""
        set_rows(self.local_w, clients, select(res.params, self.local_w))
        set_rows(self.local_bn, clients, select(res.buffers, self.local_bn))
        self.w = self.aggregate(select(res.params, self.w), clients)
        self.bn = self.aggregate(select(res.buffers, self.bn), clients)

    def round(self, t, clients):
        res = self.local_train(t, clients, self.download(clients), self.train_spec)
        self.upload(clients, res)
        return {"train/loss": res.loss.mean().item()}

    def client_models(self, clients, t):
        return self.download(clients)

    def traffic(self, t, clients):
        """The shared part both ways (FedPer: the body; LG-FedAvg: the head; FedBABU: the body, its frozen head
        never; FedRoD: body + generic head, the personal head never)."""
        return Traffic.both_ways(clients, numel(self.w, self.bn))


@register
class FedPer(PartialAggregation):
    """FedPer: clients train the whole model with CE; the server averages the body (base layers) only, the
    head (personalization layers) never leaves the client."""

    name = "fedper"

    def is_local(self, name):
        return self.in_head(name)


__all__ = ["FedPer", "PartialAggregation", "HEAD_SCOPES"]
