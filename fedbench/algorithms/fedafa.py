"""FedAFA — personalization by adversarial feature augmentation (Qian, Lu et al.; ECL's baseline [11], Table 1;
semantics from the official code ``pxqian/FedAFA``, ``Update.py: train_fea``)."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from .. import seeding
from ..checks import boolean, int_at_least, number
from ..engine.stack import broadcast
from ..errors import ConfigError
from . import register
from .local import LocalInputs
from .oneshot import OneShotPersonalization, body_index, class_balanced_weights, run_children, upper_logits

log = logging.getLogger(__name__)


def l2_step(f: torch.Tensor, grad: torch.Tensor, step_size: float) -> torch.Tensor:
    """One descent step of length ``step_size`` along the per-sample L2-normalised gradient (code ``make_step``)."""
    norm = grad.flatten(1).norm(dim=1).view(-1, *([1] * (grad.dim() - 1)))
    return f - step_size * grad / (norm + 1e-10)


@register
class FedAFA(OneShotPersonalization):
    """Phase I: FedAvg. Phase II per client k (one pass of class-balanced "oversampled" batches of D_k): the
    layers below ``feature_layer`` are frozen (ResNet-32: conv1 + stages 1–2, the code's first 63 tensors);
    per batch, sample i becomes a generation slot with probability 1 − n_{y_i}/n_max; for each slot a seed
    sample j of the batch is drawn with weight 1 − relu(n_{y_j} − n_{y_i})/n_max; starting from the seed's
    frozen-global-model features plus random noise, ``attack_steps`` L2 steps of size ``attack_step_size``
    descend CE(global upper part(f), y_i); the feature is accepted if p(y_i | f) ≥ ``p``. Loss:
    c·CE(upper(features with accepted slots replaced), y) + (1 − c)·CE(model(x), y); plain CE when a batch
    has no slot.

    The local objective draws random numbers at every step and differentiates an inner attack, which
    ``torch.func.vmap`` cannot batch (random ops, data-dependent shapes): phase II always runs on the
    sequential executor (one logged warning when the run's executor is vectorized).
    """

    name = "fedafa"

    def check_phase_two(self):
        self.c = float(self.checked_hp("c", number(0, 1)))  # code --c 0.6
        self.p_threshold = float(self.checked_hp("p", number(0, 1)))  # code --p 0.5
        self.attack_steps = int(self.checked_hp("attack_steps", int_at_least(0)))  # code: 10
        self.attack_step_size = float(self.checked_hp("attack_step_size", number(0, lo_open=True)))  # code: 0.5
        self.nesterov = bool(self.checked_hp("nesterov", boolean()))
        n = len(self.fm.net.body)
        cut = self.hp.get("feature_layer")
        if cut is None:  # the body child holding the model's last block, else its last child with parameters
            last = self.fm.names("last_block") or [k for k in self.fm.names("body")][-1:]
            cut = min((body_index(k, n) for k in last), default=n)
        if not isinstance(cut, int) or not 1 <= cut <= n:
            raise ConfigError("algorithm.feature_layer", cut, f"null or a body child index in [1, {n}]")
        self.cut = cut
        self.trainable = [k for k in self.fm.param_names if body_index(k, n) >= cut]
        if self.ctx.executor.vectorized:
            log.warning(
                "FedAFA: phase II draws random numbers inside its local objective (not vmappable); "
                "it runs on the sequential executor"
            )
            self.executor = self.ctx.executor.sequential_twin(channels_last=False)

    def personalized_names(self):
        return self.trainable

    def personalize(self, t, w, bn):
        K = self.K
        dev = self.data.x.device
        self._t, self._gen, self._stats = t, {}, torch.zeros(2, device=dev)  # (slots, accepted), read after the phase
        weights = [class_balanced_weights(self.labels[i]) for i in self.data.train_idx]
        spec = self.phase2_spec.replace(
            phase="fedafa",
            trainable=self.trainable,
            loss=self.loss,
            opt=self.opt.replace(lr=self.phase2_lr, nesterov=self.nesterov),
        )
        inputs = LocalInputs(
            ctx={"class_counts": self.client_counts(), "client": torch.arange(K, device=dev)},
            shared={"w_global": w, "bn_global": bn},
            sample_weights=weights,
        )
        P, B = self.phase_two_train(t, (broadcast(w, K), broadcast(bn, K)), spec, inputs)
        self.components = [(P, B)]
        slots, accepted = self._stats.tolist()
        return {"fedafa/slots": slots, "fedafa/accept_rate": accepted / max(1.0, slots)}

    def generator(self, k: int, device) -> torch.Generator:
        """Client k's phase-II stream; its draws follow the (sequential) order of k's local steps."""
        if k not in self._gen:
            self._gen[k] = seeding.torch_generator(self.seed, "fedafa", self._t, k, device=device)
        return self._gen[k]

    def generate(self, fm, w, bn, x_seed, targets, g):
        """Adversarial features toward ``targets`` from the seeds' frozen global features (code ``generation``);
        returns the features and the acceptance mask p(target | f) ≥ p."""
        fm.set_mode(False)  # the code runs the global model in eval mode
        try:
            with torch.enable_grad():
                f0 = run_children(fm, "body", w, bn, x_seed, 0, self.cut).detach()
                r = (f0.max() + f0.min()) / 2
                noise = (torch.rand(f0.shape, generator=g, device=f0.device, dtype=f0.dtype) - r).renorm(2, 1, 1.0)
                f = (f0 + noise).clamp(min=0).minimum(f0.max())  # clamp(0, max f0) without reading it on the host
                for _ in range(self.attack_steps):
                    f = f.detach().requires_grad_(True)
                    (grad,) = torch.autograd.grad(F.cross_entropy(upper_logits(fm, w, bn, f, self.cut), targets), [f])
                    f = l2_step(f.detach(), grad, self.attack_step_size)
                    f = f.clamp(min=0).minimum(f.max())
            with torch.no_grad():
                prob = upper_logits(fm, w, bn, f, self.cut).softmax(-1).gather(1, targets.unsqueeze(1)).squeeze(1)
        finally:
            fm.set_mode(True)
        return f.detach(), prob >= self.p_threshold

    def loss(self, fm, p, b, x, y, ctx):
        """FedAFA ``train_fea`` on one batch of one client (sequential executor only)."""
        g = self.generator(int(ctx["client"]), x.device)
        n = ctx["class_counts"]
        n_max = n.max()
        plain = F.cross_entropy(fm(p, b, x), y)
        slot = (
            torch.rand(len(y), generator=g, device=x.device, dtype=n.dtype) >= n[y] / n_max
        )  # Bernoulli(1 − n_y/n_max)
        slots = slot.nonzero().flatten()
        if len(slots) == 0:
            return plain
        targets = y[slots]
        accept = 1 - torch.relu(n[y].unsqueeze(0) - n[targets].unsqueeze(1)) / n_max  # [slots, batch]
        seeds = torch.multinomial(accept, 1, replacement=True, generator=g).flatten()
        feats, ok = self.generate(fm, ctx["w_global"], ctx["bn_global"], x[seeds], targets, g)
        used = torch.zeros_like(slot).index_put((slots,), ok)  # accepted slots, as a mask (no host read)
        src = torch.arange(len(y), device=x.device).index_put((slots,), seeds)
        x_gen = torch.where(
            used.view(-1, *[1] * (x.dim() - 1)), x[src], x
        )  # the code feeds the seeds at accepted slots
        h = run_children(fm, "body", p, b, x_gen, 0, self.cut)
        gen = torch.zeros_like(h).index_put((slots,), feats.to(h.dtype))
        h = torch.where(used.view(-1, *[1] * (h.dim() - 1)), gen, h)
        self._stats += torch.stack([slot.sum(), ok.sum()]).to(self._stats.dtype)  # the slot draw itself (nonzero) is
        # the method's only host read per batch: which samples become slots decides the shapes
        return self.c * F.cross_entropy(upper_logits(fm, p, b, h, self.cut), y) + (1 - self.c) * plain


__all__ = ["FedAFA", "l2_step"]
