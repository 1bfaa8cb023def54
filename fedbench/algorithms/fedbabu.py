"""FedBABU (Oh, Kim, Yun, ICLR 2022) — a baseline of FedReMa Tables 1-2; PFLlib ``clientbabu``/``serverbabu``."""

from __future__ import annotations

from ..errors import ConfigError
from . import register
from .fedper import PartialAggregation
from .local import LocalSpec

FT_SCOPES = ("all", "body", "head")


@register
class FedBABU(PartialAggregation):
    """FedBABU: the head is frozen at its (common) random initialisation during federated training; clients
    train the body only with CE and the server averages the body (FedBABU Alg. 1). Before a personalized
    evaluation every client fine-tunes the model for ``ft_epochs`` on its training data (FedBABU §3.3; PFLlib
    ``fine_tune``: the whole model, ``ft_scope=all``). The fine-tuned copies are evaluated, never kept.

    The head is never trained nor sent, so it stays identical across clients; it is kept as each client's
    local part only to reuse the partial-aggregation bookkeeping.
    """

    name = "fedbabu"

    def is_local(self, name):
        return self.in_head(name)

    def setup(self):
        super().setup()
        if self.hp.ft_scope not in FT_SCOPES:
            raise ConfigError("algorithm.ft_scope", self.hp.ft_scope, "one of " + ", ".join(FT_SCOPES))
        ft = self.hp.ft_epochs
        if isinstance(ft, bool) or not isinstance(ft, int) or ft < 0:
            raise ConfigError("algorithm.ft_epochs", ft, "an integer >= 0 (0: evaluate without fine-tuning)")
        self.trainable = [n for n in self.fm.param_names if not self.in_head(n)]  # body only: head frozen
        self.train_spec = self.train_spec.replace(trainable=self.trainable)
        scope, epochs = self.hp.ft_scope, int(ft)
        names = [n for n in self.fm.param_names if scope == "all" or self.in_head(n) == (scope == "head")]
        self.ft_spec = (
            None
            if epochs == 0
            else LocalSpec("finetune", trainable=names, epochs=epochs, opt=self.opt.replace(lr=float(self.hp.ft_lr)))
        )

    def client_models(self, clients, t):
        p, b = self.download(clients)
        if self.ft_spec is None:
            return p, b
        res = self.local_train(t, clients, (p, b), self.ft_spec)
        return res.params, res.buffers

    def global_model(self):
        """The averaged body with the (common, frozen) head: every client's model before fine-tuning."""
        p, b = self.download([0])
        return {k: v[0] for k, v in p.items()}, {k: v[0] for k, v in b.items()}


__all__ = ["FedBABU"]
