"""MOON — model-contrastive federated learning (Li, He, Song, CVPR 2021) —
baseline of FedReMa T1-2, FedKA T1, T3-5, T8; official code ``QinbinLi/MOON``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call

from .. import seeding
from ..checks import int_at_least, number
from ..engine.functional import FModel
from ..engine.masking import batch_mean, pad_aware
from ..engine.stack import broadcast, rows, set_rows, tagged, untagged
from ..errors import ConfigError
from ..models.base import with_projection_head
from . import register
from .fedavg import FedAvg


def model_contrastive(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float, y: torch.Tensor | None = None
) -> torch.Tensor:
    """ℓ_con (MOON Eq. 3), batch mean:

        −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) ),  sim = cosine similarity,

    i.e. a 2-way cross-entropy whose positive is the global model's representation (with the batch's labels ``y``:
    the mean over its real samples, fedbench/engine/masking.py)."""
    pos = F.cosine_similarity(z.flatten(1), z_glob.flatten(1), dim=-1)
    neg = F.cosine_similarity(z.flatten(1), z_prev.flatten(1), dim=-1)
    logits = torch.stack([pos, neg], dim=1) / tau
    return batch_mean(-F.log_softmax(logits, dim=1)[:, 0], y)


def representation(fm, p, b, x) -> torch.Tensor:
    """z: the output of everything before the classifier (the final Linear) — body, hidden head layers and, in
    MOON's model, the projection head (MOON code ``ModelFedCon.forward``'s ``x``; PFLlib's ``model.base``)."""
    rep = fm.net.head[:-1]
    n = len(rep)
    own = lambda d: {k[5:]: v for k, v in d.items() if k.startswith("head.") and int(k.split(".")[1]) < n}  # noqa: E731
    return functional_call(rep, (own(p), own(b)), (fm.features(p, b, x),))


def reference_representation(fm, p, b, x) -> torch.Tensor:
    """z of a fixed reference model (the global or a previous model): eval mode, no gradient, its BatchNorm
    statistics untouched — MOON's code runs ``global_net`` and the previous nets in eval mode."""
    was = fm.net.training
    fm.set_mode(False)
    try:
        with torch.no_grad():
            return representation(fm, p, b, x).detach()
    finally:
        fm.set_mode(was)


@register
class MOON(FedAvg):
    """MOON Algorithm 1: client k starts from w^t and minimises CE + μ·ℓ_con(z, z_glob, z_prev) for E
    epochs, z = representation of the local model, z_glob of the global model w^t, z_prev of the client's
    own model after its previous participation; the server averages as FedAvg.

    Representation = body output (the feature fed to the head): our choice for nets without MOON's
    projection head. The global and previous models run in eval mode without gradient, as in MOON's
    code. Every client's previous model starts as the initial global model (then ℓ_con = log 2, a
    constant, in the client's first round — as MOON's code, which has no negative term in round 1).
    """

    name = "moon"
    state_attrs = ("w", "bn", "prev_w", "prev_bn")

    def setup(self):
        self.mu = float(self.checked_hp("mu", number(0)))  # μ, weight of ℓ_con
        self.tau = float(self.checked_hp("tau", number(0, lo_open=True)))  # τ, temperature
        proj = self.hp.get("projection_dim")
        if proj is not None:
            proj = int(self.checked_hp("projection_dim", int_at_least(1)))
            if self.cfg.algorithm.name != self.name:  # built by another method (ECL's phase_one)
                raise ConfigError("algorithm.projection_dim", proj, "null when MOON is the phase one of another method")
            self.use_projection_head(proj)
        super().setup()
        self.prev_w, self.prev_bn = broadcast(self.w, self.K), broadcast(self.bn, self.K)  # w_k^{t-1}, all clients

    def client_context(self, clients):
        prev = {**tagged(rows(self.prev_w, clients), "w_prev"), **tagged(rows(self.prev_bn, clients), "bn_prev")}
        return prev, {"w_global": self.w, "bn_global": self.bn}

    def after_local(self, clients, res):
        set_rows(self.prev_w, clients, res.params)  # each client's previous local model, for its next round
        set_rows(self.prev_bn, clients, res.buffers)

    def use_projection_head(self, dim: int) -> None:
        """Replace the run's model by MOON's (:func:`with_projection_head`) in the context, so the whole run trains
        and evaluates it; the new layers are initialised from their own seed, so the shared layers start exactly as
        in every other method's run."""
        ctx = self.ctx
        with torch.random.fork_rng(devices=[]):
            seeding.seed_everything(self.seed, "moon_projection")
            net = with_projection_head(self.fm.net, dim)
        ctx.fm = self.fm = FModel(net)
        ctx.initial = self.fm.init_state(ctx.dtype, ctx.device)

    @pad_aware
    def local_loss(self, fm, p, b, x, y, ctx):
        """MOON Eq. 4 on one batch: CE(classifier(z), y) + μ·ℓ_con(z, z_glob, z_prev)."""
        z = representation(fm, p, b, x)
        z_glob = reference_representation(fm, ctx["w_global"], ctx["bn_global"], x)
        z_prev = reference_representation(fm, untagged(ctx, "w_prev"), untagged(ctx, "bn_prev"), x)
        cls = fm.net.classifier
        logits = F.linear(z, p[f"{cls}.weight"], p.get(f"{cls}.bias"))
        return F.cross_entropy(logits, y) + self.mu * model_contrastive(z, z_glob, z_prev, self.tau, y)


__all__ = ["MOON", "model_contrastive", "representation", "reference_representation"]
