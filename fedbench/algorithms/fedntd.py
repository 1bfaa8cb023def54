"""FedNTD — federated not-true distillation (Lee, Jeong, Shin, Yun, NeurIPS 2022)."""

from __future__ import annotations

import torch.nn.functional as F

from ..checks import boolean, number
from ..engine.masking import pad_aware
from ..losses import kd_kl, not_true_logits, reference_forward
from . import register
from .fedavg import FedAvg


@register
class FedNTD(FedAvg):
    """FedNTD: client k starts from w^t and minimises

        L = CE(q_l, y) + β · τ² · KL(q̃_g^τ ‖ q̃_l^τ),   q̃^τ = softmax(logits/τ) over the not-true classes,

    the true class's logit removed from both the local (q̃_l) and the round-start global model's (q̃_g)
    logits; the server averages as FedAvg. The global model runs in eval mode without gradient (BN running
    statistics), the local model in train mode, as the official code's teacher copy in effect does.
    ``tau_squared: false`` drops the τ² factor, as the official ``criterion.py`` (same value at τ = 1).
    """

    name = "fedntd"

    def setup(self):
        self.beta = float(self.checked_hp("beta", number(0)))  # β
        self.tau = float(self.checked_hp("tau", number(0, lo_open=True)))  # τ
        scale = bool(self.checked_hp("tau_squared", boolean()))
        self.kd_weight = self.beta if scale else self.beta / self.tau**2  # kd_kl carries τ²
        super().setup()

    def client_context(self, clients):
        return {}, {"w_global": self.w, "bn_global": self.bn}  # the teacher: the round's global model

    @pad_aware
    def local_loss(self, fm, p, b, x, y, ctx):
        """CE + β·τ²·KL(not-true global ‖ not-true local) on one batch."""
        z = fm(p, b, x)
        z_glob = reference_forward(fm, ctx["w_global"], ctx["bn_global"], x)
        ntd = kd_kl(not_true_logits(z, y), not_true_logits(z_glob, y), self.tau, y)
        return F.cross_entropy(z, y) + self.kd_weight * ntd


__all__ = ["FedNTD"]
