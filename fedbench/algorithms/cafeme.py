"""CAFeMe (Vettoruzzo, Bouguelia, Rögnvaldsson, SDM 2024): a federated modulator gating a base network,
trained by MAML-style personalization (CAFeMe §4, Alg. 1-2; code annaVettoruzzo/CAFeMe MultimodalFL_Client)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad

from .. import seeding
from ..checks import boolean, int_at_least, number, one_of
from ..communication import Traffic, numel
from ..engine.optim import OptimSpec
from ..engine.schedule import client_batches
from ..engine.stack import broadcast, weighted_mean
from ..errors import ConfigError
from ..models.cafeme import use_plain_batch_norm
from . import register
from .base import Algorithm
from .local import LocalInputs, LocalSpec


def uniform_mean(stack, m: int):
    """ω ← (1/M) Σ_i ω_i' (CAFeMe Alg. 1 line 11; the code's aggregate_model_params): all tensors, unweighted."""
    return weighted_mean(stack, torch.ones(m, dtype=torch.float64))


@register
class CAFeMe(Algorithm):
    """Alg. 1, for every sampled client i (stacked over the round's M clients by the executor):

    * Alg. 2: φ ← ω; S times: ζ = g_μ'(D'), φ ← φ − α ∇_φ CE(f_ψ'|ζ; D') on the next mini-batch D';
    * Alg. 1 line 8: one outer step on ω with the gradient of CE(f_φ; D_eval), D_eval = the next
      ``outer_batches`` mini-batches (code: 6·B samples of the same train loader). First-order (code):
      ∂L/∂ω = ∂L/∂φ; second-order: through the inner steps. Outer optimizer: per-client Adam, state kept
      across the rounds a client is sampled (code), or plain SGD ω − β∇ (paper's formula);
    * server: ω ← unweighted mean of the clients' ω_i'.

    One client update is ONE executor step whose batch is a pack of S + outer_batches consecutive
    mini-batches; the inner loop runs functionally (``torch.func.grad``) inside the loss, so both
    executors run it (the vectorized one under ``vmap``, also second-order).
    """

    name = "cafeme"
    state_attrs = ("w", "bn")

    def setup(self):
        self.S = self.checked_hp("inner_steps", int_at_least(1))
        self.alpha = float(self.checked_hp("inner_lr", number(0, None, lo_open=True)))
        beta = float(self.checked_hp("outer_lr", number(0, None, lo_open=True)))
        self.O = self.checked_hp("outer_batches", int_at_least(1))
        self.first_order = self.checked_hp("first_order", boolean())
        outer = self.checked_hp("outer_optimizer", one_of("adam", "sgd"))
        self.context = self.checked_hp("context", one_of("batch", "support"))
        self.checked_hp("modulation", one_of("sigmoid", "film", "additive"))
        labels = self.checked_hp("modulator_uses_labels", boolean())
        split = self.hp.get("pers_split")
        if split is not None and not number(0, 1, lo_open=True, hi_open=True)[0](split):
            raise ConfigError(
                "algorithm.pers_split",
                split,
                "null (code: inner and outer batches from one loader) or a number in (0, 1)",
            )
        if labels and self.context != "support":
            raise ConfigError(
                "algorithm.modulator_uses_labels",
                labels,
                "false with context=batch (test batches have no labels to feed the modulator); use context=support",
            )
        m = self.cfg.model
        if m.name != "cafeme_cnn" or m.get("modulation") != self.hp.modulation:
            raise ConfigError(
                "model",
                m.name,
                "cafeme_cnn (model=cafeme_mnist or cafeme_cifar) with model.modulation = "
                "algorithm.modulation (the model configs follow it by default)",
            )
        self.split = split
        # second order differentiates through BatchNorm twice; torch's fused kernel gets that wrong under vmap
        use_plain_batch_norm(self.fm.net, not self.first_order)
        self.outer_opt = OptimSpec(name="adam", lr=beta) if outer == "adam" else OptimSpec(name="sgd", lr=beta)
        self.w, self.bn = self.initial_model()  # ω = {μ, ψ}
        # one outer step per round over a pack of S support + O query batches (Alg. 1); Adam's moments persist
        self.meta_spec = LocalSpec(
            loss=self.meta_loss,
            steps=1,
            batches_per_step=self.S + self.O,
            opt=self.outer_opt,
            persist_opt_state=self.outer_opt.name == "adam",
        )

    # ---- Alg. 1 ----------------------------------------------------------------------------------------
    def round(self, t, clients):
        m = len(clients)
        res = self.local_train(
            t,
            clients,
            (broadcast(self.w, m), broadcast(self.bn, m)),
            self.meta_spec,
            LocalInputs(schedule=self.split_schedule(t, clients)),
        )
        self.w, self.bn = uniform_mean(res.params, m), uniform_mean(res.buffers, m)
        return {"train/loss": res.loss.mean().item()}  # the outer loss CE(f_φ; D_eval), CAFeMe Alg. 2

    def split_schedule(self, t, clients):
        """Paper variant (``pers_split`` = f): D_i split once into D_pers (a share f) and D_eval; the S inner
        batches come from D_pers, the outer ones from D_eval. None = the code's single loader (a pack)."""
        if self.split is None:
            return None
        out = []
        for k in (int(c) for c in clients):
            idx = self.data.train_idx[k]
            idx = idx[seeding.rng(self.seed, "cafeme_split", k).permutation(len(idx))]
            cut = min(max(1, int(round(self.split * len(idx)))), len(idx) - 1)
            pers, ev = idx[:cut], idx[cut:]
            b = min(int(self.cfg.batch_size), len(pers), len(ev))
            inner = client_batches(
                pers, b, seeding.rng(self.seed, "batches", "cafeme_pers", t, k), steps=self.S, drop_last=True
            )
            outer = client_batches(
                ev, b, seeding.rng(self.seed, "batches", "cafeme_eval", t, k), steps=self.O, drop_last=True
            )
            out.append([self.data.tensor(np.concatenate(inner + outer))])
        return out

    # ---- the client's objective (one client, pure: runs under vmap) -------------------------------------
    def forward(self, p, b, x, context):
        """f_ψ|ζ with ζ = g_μ(context); context None = the batch x itself (code)."""
        return functional_call(self.fm.net, (p, b), (x,), {"context": context})

    def ce(self, p, b, x, y, context):
        return F.cross_entropy(self.forward(p, b, x, context), y)

    def adapt(self, p, b, xs, ys):
        """Alg. 2 lines 1-7: S SGD steps of size α on consecutive batches; the modulator reads each batch
        (with its labels if ``modulator_uses_labels``). First-order: the steps start from a detached copy
        and are re-attached as φ = ω + stopgrad(φ − ω), so ∂φ/∂ω = I (the code: no create_graph)."""
        phi = {k: v.detach() for k, v in p.items()} if self.first_order else dict(p)
        for s in range(self.S):
            g = grad(self.ce)(phi, b, xs[s], ys[s], (xs[s], ys[s]))
            phi = {k: phi[k] - self.alpha * g[k] for k in phi}
        if self.first_order:
            phi = {k: p[k] + (phi[k] - p[k]).detach() for k in p}
        return phi

    def meta_loss(self, fm, p, b, x, y, ctx):
        """CE(f_φ; D_eval) after adaptation on the pack's first S batches (Alg. 1 line 8).

        ``context``: "batch" (code) = the modulator reads the outer batch itself; "support" (paper Alg. 2
        line 8) = ζ from the last personalization batch D'."""
        xs, ys = x.unflatten(0, (self.S + self.O, -1)), y.unflatten(0, (self.S + self.O, -1))
        phi = self.adapt(p, b, xs, ys)
        x_out, y_out = xs[self.S :].flatten(0, 1), ys[self.S :].flatten(0, 1)
        context = None if self.context == "batch" else (xs[self.S - 1], ys[self.S - 1])
        return self.ce(phi, b, x_out, y_out, context)

    # ---- evaluation ------------------------------------------------------------------------------------
    def traffic(self, t, clients):
        """The model both ways: down ω, up ω_i' (CAFeMe Alg. 1; all tensors, as the server averages them)."""
        return Traffic.both_ways(clients, numel(self.w, self.bn))

    def global_model(self):
        return self.w, self.bn

    def new_client_forward(self, params, buffers, x, support):
        """New clients: ζ from the batch being classified (code) or from the latest fine-tuning batch (paper)."""
        return self.forward(params, buffers, x, None if self.context == "batch" else support)


__all__ = ["CAFeMe", "uniform_mean"]
