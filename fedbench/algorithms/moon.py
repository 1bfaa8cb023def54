"""MOON — model-contrastive federated learning (Li, He, Song, CVPR 2021) — spec baselines.md, MOON row."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import number
from ..engine.stack import broadcast, rows, set_rows, tagged, untagged
from ..losses import reference_forward
from . import register
from .fedavg import FedAvg


def model_contrastive(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """ℓ_con (MOON Eq. 3), batch mean:

        −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) ),  sim = cosine similarity,

    i.e. a 2-way cross-entropy whose positive is the global model's representation."""
    pos = F.cosine_similarity(z.flatten(1), z_glob.flatten(1), dim=-1)
    neg = F.cosine_similarity(z.flatten(1), z_prev.flatten(1), dim=-1)
    logits = torch.stack([pos, neg], dim=1) / tau
    return -F.log_softmax(logits, dim=1)[:, 0].mean()


@register
class MOON(FedAvg):
    """MOON Algorithm 1: client k starts from w^t and minimises CE + μ·ℓ_con(z, z_glob, z_prev) for E
    epochs, z = representation of the local model, z_glob of the global model w^t, z_prev of the client's
    own model after its previous participation; the server averages as FedAvg.

    Representation = body output (the feature fed to the head): spec [REC] for nets without MOON's
    projection head. The global and previous models run in eval mode without gradient, as in MOON's
    code. Every client's previous model starts as the initial global model (then ℓ_con = log 2, a
    constant, in the client's first round — as MOON's code, which has no negative term in round 1).
    """

    name = "moon"
    state_attrs = ("w", "bn", "prev_w", "prev_bn")

    def setup(self):
        self.mu = float(self.checked_hp("mu", number(0)))                    # μ, weight of ℓ_con
        self.tau = float(self.checked_hp("tau", number(0, lo_open=True)))    # τ, temperature
        super().setup()
        self.prev_w, self.prev_bn = broadcast(self.w, self.K), broadcast(self.bn, self.K)   # w_k^{t-1}, all clients

    def round(self, t, clients):
        m = len(clients)
        ctx = {**tagged(rows(self.prev_w, clients), "w_prev"), **tagged(rows(self.prev_bn, clients), "bn_prev")}
        res = self.local_train(t, clients, broadcast(self.w, m), broadcast(self.bn, m), loss=self.loss, ctx=ctx,
                               shared={"w_global": self.w, "bn_global": self.bn})
        set_rows(self.prev_w, clients, res.params)
        set_rows(self.prev_bn, clients, res.buffers)
        self.w, self.bn = self.aggregate(res.params, clients), self.aggregate(res.buffers, clients)
        return {"train/loss": res.loss.mean().item()}

    def loss(self, fm, p, b, x, y, ctx):
        """MOON Eq. 4 on one batch: CE(head(z), y) + μ·ℓ_con(z, z_glob, z_prev)."""
        z = fm.features(p, b, x)
        z_glob = reference_forward(fm, ctx["w_global"], ctx["bn_global"], x, features=True)
        z_prev = reference_forward(fm, untagged(ctx, "w_prev"), untagged(ctx, "bn_prev"), x, features=True)
        return F.cross_entropy(fm.head(p, b, z), y) + self.mu * model_contrastive(z, z_glob, z_prev, self.tau)


__all__ = ["MOON", "model_contrastive"]
