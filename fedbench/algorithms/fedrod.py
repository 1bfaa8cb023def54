"""FedRoD (Chen & Chao, "On Bridging Generic and Personalized Federated Learning", ICLR 2022) — a
baseline of ECL Table 1 and FedKA Table 9; PFLlib ``clientrod``/``serverrod``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engine.masking import pad_aware
from ..engine.optim import init_state
from ..engine.stack import broadcast
from ..losses import balanced_softmax_ce
from ..prototypes import client_outputs
from . import register
from .fedper import PartialAggregation
from .local import LocalInputs

PERSONAL = "personal."  # prefix of the personal head's parameter names in a client's parameter dict


@register
class FedRoD(PartialAggregation):
    """Two predictors on one shared body: the generic head h^G (shared) and a personal head h_k^P (local).

    Local step on a batch (x, y), z = body(x) (FedRoD Alg. 1; PFLlib ``clientrod.train``):
      * body + generic head: Balanced-Softmax CE of h^G(z) with the client's class counts n_{k,c};
      * personal head: CE of h^G(z) + h_k^P(z) with the body and h^G held fixed (both detached).
    Both terms are summed into one loss: their gradients touch disjoint parameters, so one SGD step on the sum
    is the paper's two updates (except that ``optim.clip_grad_norm`` would clip them jointly).
    Server: n_k-weighted average of body + generic head; h_k^P never leaves client k.
    Personalized prediction: h^G(z) + h_k^P(z); generic prediction (FedKA Table 9): h^G(z).

    ``head_scope`` = the layers h^P has: ``classifier`` (default; PFLlib's ``model.head``, the final Linear,
    fed the generic head's penultimate output) or ``head`` (a personal copy of all head layers). h^P starts
    as a copy of the initial generic head layers (PFLlib ``copy.deepcopy(self.model.head)``).
    """

    name = "fedrod"

    def is_local(self, name):
        return name.startswith(PERSONAL)

    def setup(self):
        super().setup()  # shared: the whole model (body + generic head); local: nothing yet
        w, _ = self.initial_model()
        self.personal_names = [n for n in self.fm.param_names if self.in_head(n)]
        self.local_w = broadcast({PERSONAL + n: w[n] for n in self.personal_names}, self.K)
        self.trainable = self.fm.param_names + list(self.local_w)  # body, generic head and personal head
        self.class_counts = torch.as_tensor(
            self.data.counts, dtype=w[self.personal_names[0]].dtype, device=w[self.personal_names[0]].device
        )  # n_{k,c} for the BSM loss
        self.train_spec = self.train_spec.replace(loss=self.loss, trainable=self.trainable)
        if self.cfg.optim.persistent_state:  # the base class would size the kept optimizer state for the model only
            full = {**w, **{PERSONAL + n: w[n] for n in self.personal_names}}
            self.opt_state = init_state(self.opt, broadcast(full, self.K), self.trainable, lead=(self.K,))

    def personal_logits(self, fm, p, b, h):
        """h_k^P(h): the head with the personal parameters in the personal scope; other head layers are the
        generic ones as constants. Runs on a copy of the buffers so head BatchNorm statistics update once."""
        q = {k: v.detach() for k, v in p.items() if k.startswith("head.")}
        q.update({n: p[PERSONAL + n] for n in self.personal_names})
        return fm.head(q, {k: v.clone() for k, v in b.items()}, h)

    @pad_aware
    def loss(self, fm, p, b, x, y, ctx):
        """ONE client, pure (runs under vmap): BSM(h^G(z)) + CE(sg[h^G(z)] + h^P(sg[z]))."""
        h = fm.features(p, b, x)
        g = fm.head(p, b, h)
        generic = balanced_softmax_ce(g, y, ctx["class_counts"])
        personal = F.cross_entropy(g.detach() + self.personal_logits(fm, p, b, h.detach()), y)
        return generic + personal

    def round(self, t, clients):
        res = self.local_train(
            t,
            clients,
            self.download(clients),
            self.train_spec,
            LocalInputs(ctx={"class_counts": self.class_counts[clients.long()]}),
        )
        self.upload(clients, res)
        return {"train/loss": res.loss.mean().item()}

    def predict_personalized(self, p, b, x):
        """h^G(z) + h_k^P(z) for one client (eval mode)."""
        h = self.fm.features(p, b, x)
        return self.fm.head(p, b, h) + self.personal_logits(self.fm, p, b, h)

    def client_logits(self, clients, idx, t):
        return client_outputs(self.ctx, self.predict_personalized, *self.download(clients), idx)

    def client_models(self, clients, t):
        """Plain per-client models where that is exact: a personal final Linear adds its logits to the generic
        one's, so h^G + h_k^P is one Linear with summed weights and biases (``head_scope=classifier``). A
        personal copy of a nonlinear multi-layer head has no such form (None; the evaluator uses
        :meth:`client_logits`)."""
        if self.hp.head_scope != "classifier":
            return None
        p, b = self.download(clients)
        for n in self.personal_names:
            p[n] = p[n] + p.pop(PERSONAL + n)
        return p, b

    def global_model(self):
        """The generic model: shared body + generic head."""
        return self.w, self.bn


__all__ = ["FedRoD"]
