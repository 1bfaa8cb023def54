"""FedDyn — federated learning based on dynamic regularization (Acar et al., ICLR 2021);
baseline of FedKA Tables 1, 3-5."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..checks import boolean, number
from ..engine.masking import pad_aware
from ..engine.stack import Stack, broadcast, rows, set_rows, tagged, untagged, weighted_mean
from ..losses import proximal
from . import register
from .fedavg import FedAvg
from .local import LocalInputs


@register
class FedDyn(FedAvg):
    """FedDyn Algorithm 1. Client k keeps the linear-term state g_k = ∇L_k(w_k^{prev}) (initially 0):

        local:   w_k = argmin  L_k(w) − ⟨g_k, w⟩ + (α/2)‖w − w^t‖²      (E epochs of the local optimizer)
                 g_k ← g_k − α (w_k − w^t)
        server:  h ← h − α (1/N) Σ_{k∈S} (w_k − w^t)                      (N = all clients, h_0 = 0)
                 w^{t+1} = (1/|S|) Σ_{k∈S} w_k − h/α

    With ``adaptive_alpha`` the client uses α_k = α / (n_k · N / Σ_j n_j), as the official code
    (``alpha_coef_adpt``); the server formulas keep α. Buffers (BN statistics) are averaged over S.
    """

    name = "feddyn"
    state_attrs = ("w", "bn", "h", "grad_state")

    def setup(self):
        self.alpha = float(self.checked_hp("alpha", number(0, lo_open=True)))  # α
        adaptive = bool(self.checked_hp("adaptive_alpha", boolean()))
        super().setup()
        self.train_spec = self.train_spec.replace(loss=self.loss)
        self.h = {k: torch.zeros_like(v) for k, v in self.w.items()}  # server state h
        self.grad_state = broadcast(self.h, self.K)  # g_k, all clients
        rel = self.n * self.K / self.n.sum() if adaptive else torch.ones(self.K, dtype=torch.float64)
        self.client_alpha = self.alpha / rel  # α_k [K]

    def round(self, t, clients):
        m = len(clients)
        x = self.data.x
        ctx = {
            **tagged(rows(self.grad_state, clients), "lin"),
            "alpha": self.client_alpha[clients.long()].to(dtype=x.dtype, device=x.device),
        }
        res = self.local_train(
            t,
            clients,
            (broadcast(self.w, m), broadcast(self.bn, m)),
            self.train_spec,
            LocalInputs(ctx=ctx, shared={"w_global": self.w}),
        )
        self.server_update(clients, res.params, res.buffers)
        return {"train/loss": res.loss.mean().item()}

    @pad_aware
    def loss(self, fm, p, b, x, y, ctx):
        """L_k(w) − ⟨g_k, w⟩ + (α_k/2)‖w − w^t‖² on one batch (FedDyn Alg. 1, client objective)."""
        lin = untagged(ctx, "lin")
        return (
            F.cross_entropy(fm(p, b, x), y)
            - sum((p[k] * lin[k]).sum() for k in lin)
            + ctx["alpha"] * proximal(p, ctx["w_global"])
        )

    def server_update(self, clients: torch.Tensor, params: Stack, buffers: Stack) -> None:
        """g_k for the participants, h and w^{t+1} (stacks over the round's clients)."""
        m = len(clients)
        ones = torch.ones(m, dtype=torch.float64)
        alpha_k = self.client_alpha[clients.long()]
        delta = {k: params[k] - w.unsqueeze(0) for k, w in self.w.items()}  # w_k − w^t
        g = rows(self.grad_state, clients)
        a = {k: alpha_k.to(d.dtype).to(d.device).view(-1, *([1] * (d.dim() - 1))) for k, d in delta.items()}
        set_rows(self.grad_state, clients, {k: g[k] - a[k] * d for k, d in delta.items()})
        self.h = {k: h - self.alpha / self.K * delta[k].sum(0) for k, h in self.h.items()}
        mean = weighted_mean(params, ones)
        self.w = {k: mean[k] - self.h[k] / self.alpha for k in self.w}
        self.bn = weighted_mean(buffers, ones)


__all__ = ["FedDyn"]
