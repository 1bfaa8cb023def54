"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020) —
baseline of FedReMa T1-2, FedKA T1, T3-5, T8, ECL T4."""

from __future__ import annotations

import torch.nn.functional as F

from ..checks import number
from ..engine.masking import pad_aware
from ..losses import proximal
from . import register
from .fedavg import FedAvg


@register
class FedProx(FedAvg):
    """FedProx Algorithm 2: each client approximately minimises h_k(w; w^t) = F_k(w) + (μ/2)‖w − w^t‖²
    (Eq. 2) with E epochs of the local optimizer from w^t; the server averages as FedAvg (n_k-weighted).
    The gradient of the local objective is ∇F_k(w) + μ(w − w^t)."""

    name = "fedprox"

    def setup(self):
        self.mu = float(self.checked_hp("mu", number(0)))  # μ, proximal weight
        super().setup()

    def client_context(self, clients):
        return {}, {"w_global": self.w}  # w^t

    @pad_aware
    def local_loss(self, fm, p, b, x, y, ctx):
        """h_k(w; w^t) on one batch: CE + (μ/2)‖w − w^t‖² over all parameters."""
        return F.cross_entropy(fm(p, b, x), y) + self.mu * proximal(p, ctx["w_global"])


__all__ = ["FedProx"]
