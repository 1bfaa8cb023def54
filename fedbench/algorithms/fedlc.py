"""FedLC — federated learning with logit calibration (Zhang et al., ICML 2022) — ECL Tables 1, 4."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..checks import number
from ..engine.masking import pad_aware
from . import register
from .fedavg import FedAvg


def calibration_margin(counts: torch.Tensor, tau: float, empty_count: float) -> torch.Tensor:
    """τ · n_{k,c}^{−1/4} per client and class ([K, C] counts -> [K, C]). A class the client does not hold
    counts as ``empty_count`` (FL-bench's FedLC: max(1e-8, n) → margin 100·τ, i.e. the class is all but
    removed from the client's softmax; PFLlib's n = 0 gives an infinite margin, the same limit)."""
    return tau * counts.clamp(min=empty_count).pow(-0.25)


@register
class FedLC(FedAvg):
    """FedLC: client k trains with CE on calibrated logits z_c − τ·n_{k,c}^{−1/4} (a label-count-dependent
    margin pushes rare local classes' logits down during training only); the server averages as FedAvg;
    evaluation uses the raw logits of the global model."""

    name = "fedlc"

    def setup(self):
        tau = float(self.checked_hp("tau", number(0)))  # τ
        empty = float(self.checked_hp("empty_count", number(0, lo_open=True)))
        super().setup()
        x = self.data.x
        counts = torch.as_tensor(self.data.counts, dtype=torch.float64)
        self.margin = calibration_margin(counts, tau, empty).to(dtype=x.dtype, device=x.device)  # [K, C]

    def client_context(self, clients):
        return {"margin": self.margin[clients.long().to(self.margin.device)]}, {}

    @pad_aware
    def local_loss(self, fm, p, b, x, y, ctx):
        """Calibrated CE: CE(z − τ·n_k^{−1/4}, y)."""
        return F.cross_entropy(fm(p, b, x) - ctx["margin"], y)


__all__ = ["FedLC", "calibration_margin"]
