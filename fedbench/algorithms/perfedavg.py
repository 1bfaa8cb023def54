"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): FedAvg of a MAML initialisation
(baseline of FedReMa Table 1, CAFeMe Tables 1-2; CAFeMe code PerFedAvg_Client)."""

from __future__ import annotations

import torch.nn.functional as F
from torch.func import grad, grad_and_value

from ..checks import int_at_least, number, one_of
from ..communication import Traffic, numel
from ..engine.masking import pad_aware
from ..engine.optim import OptimSpec
from ..engine.stack import broadcast
from . import register
from .base import Algorithm
from .cafeme import uniform_mean
from .local import LocalSpec


@register
class PerFedAvg(Algorithm):
    """Per-FedAvg Alg. 1 with the Hessian-free (HF) or first-order (FO) update, per local iteration on
    three fresh mini-batches D, D', D'' (one executor step, a pack of 3 batches):

        θ̃ = θ − α ∇f(θ; D)
        g = ∇f(θ̃; D')
        HF: θ ← θ − β (g − α d̂),  d̂ = [∇f(θ + δg; D'') − ∇f(θ − δg; D'')] / (2δ)   (Per-FedAvg Eq. 10)
        FO: θ ← θ − β g

    ``local_steps`` iterations per round (CAF code adapt_steps), then the server's unweighted mean.
    The step is taken by the executor's SGD (lr β, no momentum) on a surrogate loss whose gradient is
    exactly the update direction; its value is f(θ̃; D') (logged as the training loss).
    """

    name = "perfedavg"
    state_attrs = ("w", "bn")

    def setup(self):
        self.alpha = float(self.checked_hp("alpha", number(0, None, lo_open=True)))
        beta = float(self.checked_hp("beta", number(0, None, lo_open=True)))
        self.delta = float(self.checked_hp("delta", number(0, None, lo_open=True)))
        steps = self.hp.get("local_steps")  # null: local_epochs passes over the data (PFLlib, FL-bench)
        self.local_steps = None if steps is None else int(self.checked_hp("local_steps", int_at_least(1)))
        self.variant = self.checked_hp("variant", one_of("hf", "fo"))
        self.outer_opt = OptimSpec(name="sgd", lr=beta)
        self.w, self.bn = self.initial_model()
        # one outer step per pack of 2 (FO: inner + outer batch) or 3 (HF: + the Hessian batch) batches (Alg. 1)
        self.meta_spec = LocalSpec(
            loss=self.meta_loss,
            steps=self.local_steps,
            opt=self.outer_opt,
            epochs=int(self.cfg.local_epochs) if self.local_steps is None else None,
            batches_per_step=3 if self.variant == "hf" else 2,
        )
        self.personal_spec = LocalSpec(
            "personalize", steps=int(self.hp.get("eval_steps", 0)) or None, opt=OptimSpec(name="sgd", lr=self.alpha)
        )  # eval_steps steps of size α

    def round(self, t, clients):
        m = len(clients)
        res = self.local_train(t, clients, (broadcast(self.w, m), broadcast(self.bn, m)), self.meta_spec)
        self.w, self.bn = uniform_mean(res.params, m), uniform_mean(res.buffers, m)
        return {"train/loss": res.loss.mean().item()}

    def ce(self, p, b, x, y):
        return F.cross_entropy(self.fm(p, b, x), y)

    def direction(self, p, b, xs, ys):
        """(update direction g − α d̂ or g, value f(θ̃; D')) at the detached point θ = p."""
        theta = {k: v.detach() for k, v in p.items()}
        g0 = grad(self.ce)(theta, b, xs[0], ys[0])
        tilde = {k: theta[k] - self.alpha * g0[k] for k in theta}
        g, value = grad_and_value(self.ce)(tilde, b, xs[1], ys[1])
        if self.variant == "fo":
            return g, value
        plus = grad(self.ce)({k: theta[k] + self.delta * g[k] for k in theta}, b, xs[2], ys[2])
        minus = grad(self.ce)({k: theta[k] - self.delta * g[k] for k in theta}, b, xs[2], ys[2])
        return {k: g[k] - self.alpha * (plus[k] - minus[k]) / (2 * self.delta) for k in g}, value

    @pad_aware
    def meta_loss(self, fm, p, b, x, y, ctx):
        """value f(θ̃; D') with gradient (w.r.t. p) = the Per-FedAvg direction: ⟨p, d⟩ − ⟨p, d⟩.detach()."""
        k = 3 if self.variant == "hf" else 2
        d, value = self.direction(p, b, x.unflatten(0, (k, -1)), y.unflatten(0, (k, -1)))
        surrogate = sum((p[n] * d[n].detach()).sum() for n in d)
        return value.detach() + surrogate - surrogate.detach()

    def traffic(self, t, clients):
        """The model both ways (Per-FedAvg Alg. 1)."""
        return Traffic.both_ways(clients, numel(self.w, self.bn))

    def global_model(self):
        return self.w, self.bn

    def client_models(self, clients, t):
        """Personalized models: ``eval_steps`` SGD steps of size α from the global model on local data
        (PFLlib's Per-FedAvg evaluation, one step — FedReMa's Table 1); 0 = the global model itself."""
        m = len(clients)
        if self.personal_spec.steps is None:
            return broadcast(self.w, m), broadcast(self.bn, m)
        res = self.local_train(t, clients, (broadcast(self.w, m), broadcast(self.bn, m)), self.personal_spec)
        return res.params, res.buffers


__all__ = ["PerFedAvg"]
