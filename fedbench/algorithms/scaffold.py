"""SCAFFOLD — stochastic controlled averaging (Karimireddy et al., ICML 2020) — phase I of ECL Table 4."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..checks import boolean, number
from ..communication import Traffic, numel
from ..engine.masking import pad_aware
from ..engine.stack import Stack, broadcast, rows, set_rows, tagged, untagged, weighted_mean
from . import register
from .fedavg import FedAvg
from .local import LocalInputs


def effective_steps(steps: torch.Tensor, momentum: float) -> torch.Tensor:
    """Number of plain-SGD steps that K momentum-SGD steps amount to (FedNTD's SCAFFOLD code,
    ``adaptive_divison``): (K − ρ(1 − ρ^K)/(1 − ρ)) / (1 − ρ); = K when ρ = 0."""
    if momentum == 0:
        return steps
    r = momentum
    return (steps - r * (1 - r**steps) / (1 - r)) / (1 - r)


@register
class SCAFFOLD(FedAvg):
    """SCAFFOLD Algorithm 1 (option II for c_k⁺):

    client k (from y_k = x):  E epochs of  y_k ← y_k − η (g_k(y_k) − c_k + c)
                              c_k⁺ = c_k − c + (x − y_k) / (K_k η)      (K_k = the client's actual number of steps)
    server (S = participants, N = all clients):
                              x ← x + η_g · mean_{k∈S}(y_k − x)
                              c ← c + (|S|/N) · mean_{k∈S}(c_k⁺ − c_k)

    The corrected gradient is written as a linear term in the local loss: ∇_w[CE(w) + ⟨w, c − c_k⟩] =
    g − c_k + c, so the executor's ordinary optimizer step (momentum/weight decay/clipping applied to the
    corrected gradient, as a hand-assigned ``.grad`` would get) is SCAFFOLD's step — vmap-friendly.
    K_k η is the plain-SGD path length of the client's K_k steps; with momentum ρ > 0 the steps are counted as
    :func:`effective_steps` (``momentum_corrected_steps``, FedNTD's code) — SCAFFOLD's K_k·η (Alg. 1) assumes plain
    SGD and makes SCAFFOLD diverge under momentum 0.9 (c_k over-estimated ~1/(1−ρ) times).
    Buffers (BN statistics) are averaged like x (with η_g = 1). ``weighted_average: true`` averages the
    model updates (and buffers) with weights n_k, as FedNTD's and NIID-Bench's SCAFFOLD code (FedAvg's
    aggregation); c always takes the plain mean.
    """

    name = "scaffold"
    state_attrs = ("w", "bn", "c", "c_local")

    def setup(self):
        self.server_lr = float(self.checked_hp("server_lr", number(0, lo_open=True)))  # η_g
        self.momentum_steps = bool(self.checked_hp("momentum_corrected_steps", boolean()))
        self.weighted = bool(self.checked_hp("weighted_average", boolean()))
        super().setup()
        self.train_spec = self.train_spec.replace(loss=self.loss)  # the run's optimizer in round t (opt_at)
        self.c = {k: torch.zeros_like(v) for k, v in self.w.items()}  # server control variate c
        self.c_local = broadcast(self.c, self.K)  # c_k, all clients

    def round(self, t, clients):
        m = len(clients)
        c_k = rows(self.c_local, clients)
        ctx = tagged({k: self.c[k].unsqueeze(0) - c_k[k] for k in self.c}, "correction")  # c − c_k per client
        opt = self.opt_at(t)  # the round's (possibly step-decayed) local lr η: the steps and c_k⁺ use the same η
        res = self.local_train(
            t, clients, (broadcast(self.w, m), broadcast(self.bn, m)), self.train_spec, LocalInputs(ctx=ctx)
        )
        self.server_update(clients, res.params, res.buffers, res.steps, lr=float(opt.lr))
        return {"train/loss": res.loss.mean().item()}

    @pad_aware
    def loss(self, fm, p, b, x, y, ctx):
        """CE + ⟨w, c − c_k⟩: its gradient is SCAFFOLD's corrected gradient g − c_k + c."""
        corr = untagged(ctx, "correction")
        return F.cross_entropy(fm(p, b, x), y) + sum((p[k] * corr[k]).sum() for k in corr)

    def traffic(self, t, clients):
        """SCAFFOLD Alg. 1: down (x, c), up (Δy_k, Δc_k): the model and one control variate (parameter-sized) each
        way; the buffers travel with the model."""
        return Traffic.both_ways(clients, numel(self.w, self.bn, self.c))

    def server_update(
        self, clients: torch.Tensor, params: Stack, buffers: Stack, steps: torch.Tensor, *, lr: float
    ) -> None:
        """c_k⁺ for the participants, then the server's x and c updates (stacks over the round's clients);
        ``lr`` = the local η the clients' steps used (under ``optim.lr_decay_round`` the decayed one)."""
        m = len(clients)
        steps = steps.to(torch.float64).clamp(min=1)
        if self.momentum_steps:
            steps = effective_steps(steps, float(self.opt.momentum))
        eta = float(lr)
        ones = torch.ones(m, dtype=torch.float64)
        c_old = rows(self.c_local, clients)
        c_new, dw, dc = {}, {}, {}
        for k, x in self.w.items():
            scale = (1.0 / (steps * eta)).to(x.dtype).to(x.device).view(-1, *([1] * x.dim()))
            c_new[k] = c_old[k] - self.c[k] + (x.unsqueeze(0) - params[k]) * scale
            dw[k] = params[k] - x
            dc[k] = c_new[k] - c_old[k]
        weights = self.n[clients.long()] if self.weighted else ones
        dw, dc = weighted_mean(dw, weights), weighted_mean(dc, ones)
        self.w = {k: x + self.server_lr * dw[k] for k, x in self.w.items()}
        self.c = {k: c + (m / self.K) * dc[k] for k, c in self.c.items()}
        set_rows(self.c_local, clients, c_new)
        self.bn = weighted_mean(buffers, weights)


__all__ = ["SCAFFOLD", "effective_steps"]
