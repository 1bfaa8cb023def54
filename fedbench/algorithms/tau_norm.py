"""FedAvg+τ-norm — τ-normalized classifier (Kang et al., ICLR 2020) as ECL's personalization baseline
(ECL Tables 1–2). No training in phase II."""

from __future__ import annotations

import numpy as np
import torch

from ..checks import number, one_of
from ..engine.stack import broadcast
from ..errors import ConfigError
from ..metrics import confusion_counts
from . import register
from .oneshot import OneShotPersonalization, classifier_names, run_children


def tau_normalize(weight: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """ŵ_c = w_c / ‖w_c‖^τ row-wise; ``weight`` [..., C, d], ``tau`` broadcast over the leading axes."""
    tau = torch.as_tensor(tau, dtype=weight.dtype, device=weight.device)
    return weight / weight.norm(dim=-1, keepdim=True).pow(tau.reshape(*tau.shape, 1, 1))


def balanced_accuracy(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> float:
    """Per-class accuracy averaged over the classes present in ``y`` (ECL's metric: our choice, FedAFA's)."""
    c, n = confusion_counts(logits, y, num_classes)
    return float((c[n > 0] / n[n > 0]).mean()) if (n > 0).any() else 0.0


def select_tau(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, grid) -> float:
    """The τ of ``grid`` whose τ-normalized classifier has the best balanced accuracy on (h, y) (first on ties)."""
    C = weight.shape[0]
    scores = [
        balanced_accuracy(h @ tau_normalize(weight, float(tau)).t() + (0 if bias is None else bias), y, C)
        for tau in grid
    ]
    return float(grid[int(np.argmax(scores))])


@register
class FedAvgTauNorm(OneShotPersonalization):
    """Phase I: FedAvg (``phase_one``). Phase II per client k: the global classifier's rows rescaled to
    ŵ_c = w_c/‖w_c‖^τ_k (Kang et al. §4); ``tau: null`` picks τ_k from ``tau_grid`` by the balanced accuracy on
    k's own training data (our choice: ECL gives no τ; no augmentation), a number uses it for every client.
    ``bias: drop`` follows the decoupling code's τ-norm logits (feature · ŵᵀ, no bias)."""

    name = "fedavg_taunorm"
    trains_phase_two = False

    def check_phase_two(self):
        self.tau = self.checked_hp("tau", number(0, optional=True))
        grid = self.hp.get("tau_grid")
        if self.tau is None and (not grid or not all(number(0)[0](g) for g in grid)):
            raise ConfigError("algorithm.tau_grid", grid, "a non-empty list of numbers ≥ 0 (used when tau is null)")
        self.tau_grid = [float(g) for g in grid or []]
        self.bias = self.checked_hp("bias", one_of("drop", "keep"))

    @torch.no_grad()
    def classifier_inputs(self, w, bn) -> list[torch.Tensor]:
        """Each client's training samples mapped to the classifier's input by the global model (eval mode):
        the body, then the head's layers below the final Linear."""
        fm, x, chunk = self.fm, self.data.x, int(self.executor.eval_batch)
        below = int(classifier_names(fm)[0].split(".")[1])  # "head.<j>.weight": head children [0, j)
        fm.set_mode(False)
        try:
            out = []
            for tr in self.data.train_idx:
                ids = self.data.tensor(tr)
                feats = [fm.features(w, bn, x.index_select(0, ids[a : a + chunk])) for a in range(0, len(ids), chunk)]
                out.append(torch.cat([run_children(fm, "head", w, bn, h, 0, below) for h in feats]))
            return out
        finally:
            fm.set_mode(True)

    def personalize(self, t, w, bn):
        K = self.K
        weight, bias = classifier_names(self.fm)
        W, b = w[weight], (w[bias] if bias else None)
        if self.tau is None:
            feats = self.classifier_inputs(w, bn)
            taus = [
                select_tau(h, self.data.y[self.data.tensor(tr)], W, b if self.bias == "keep" else None, self.tau_grid)
                for h, tr in zip(feats, self.data.train_idx)
            ]
        else:
            taus = [float(self.tau)] * K
        tau = torch.tensor(taus, dtype=W.dtype, device=W.device)
        P = broadcast(w, K)
        P[weight] = tau_normalize(P[weight], tau)
        if bias is not None and self.bias == "drop":
            P[bias] = torch.zeros_like(P[bias])
        self.components = [(P, broadcast(bn, K))]
        self.publish_matrix("taunorm_tau", t, tau.unsqueeze(1), xlabel="", ylabel="client", title="τ per client")
        return {"taunorm/tau_mean": float(tau.mean()), "taunorm/tau_std": float(tau.std()) if K > 1 else 0.0}


__all__ = ["FedAvgTauNorm", "tau_normalize", "select_tau", "balanced_accuracy"]
