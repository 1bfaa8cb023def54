"""FedProto (Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous Clients", AAAI 2022) —
a baseline of FedReMa Tables 1-2; PFLlib ``clientproto``/``serverproto``. Also the base of FedDistill: clients
exchange per-class means of one of their outputs instead of model weights."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..communication import Traffic
from ..engine.masking import pad_aware
from ..engine.stack import broadcast, rows, set_rows
from ..errors import ConfigError
from ..losses import prototype_alignment
from ..prototypes import class_means, client_outputs, global_prototypes, nearest_prototype_logits
from . import register
from .base import Algorithm
from .local import LocalInputs


class ClassMeanExchange(Algorithm):
    """Every client keeps its own model (never averaged); only class means of an output z travel.

    Round t, client k in S (all from the same initial model):
      1. local training, ``local_epochs`` of  CE(logits) + λ · MSE(z(x), Z̄_y)  (``prototype_alignment``:
         samples whose class has no global mean yet add 0, as in PFLlib);
      2. upload Z_k^c = mean of z over k's class-c training samples (eval mode, the trained model);
      3. server: Z̄_c = unweighted mean of the Z_k^c of the clients in S that have class c.
    Subclasses define z (:meth:`outputs`). Deviation from PFLlib: it averages z over the training batches of
    all local epochs as the model moves; we take the means with the trained model (FedProto Eq. 4 as written),
    because the executor returns models, not per-step activations.
    """

    state_attrs = ("P", "B", "means", "has_mean")

    def outputs(self, fm, p, b, x) -> tuple[torch.Tensor, torch.Tensor]:
        """(z, logits) of ONE client's model on x."""
        raise NotImplementedError

    def setup(self):
        lam = self.hp.lam
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or lam < 0:
            raise ConfigError("algorithm.lam", lam, "a number >= 0 (the weight of the class-mean regularizer)")
        w, bn = self.initial_model()
        self.P, self.B = broadcast(w, self.K), broadcast(bn, self.K)  # every client's own model
        self.train_spec = self.train_spec.replace(loss=self.loss)
        z0 = client_outputs(self.ctx, self.z, broadcast(w, 1), broadcast(bn, 1), [np.arange(1)])[0].flatten(1)
        self.means = torch.zeros(self.data.num_classes, z0.shape[1], dtype=z0.dtype, device=z0.device)  # Z̄ (none yet)
        self.has_mean = torch.zeros(self.data.num_classes, dtype=torch.bool, device=z0.device)

    def z(self, p, b, x):
        return self.outputs(self.fm, p, b, x)[0]

    @pad_aware
    def loss(self, fm, p, b, x, y, ctx):
        """ONE client, pure (runs under vmap): CE + λ·MSE(z, Z̄_y)."""
        z, logits = self.outputs(fm, p, b, x)
        reg = prototype_alignment(z.flatten(1), y, ctx["means"], ctx["has_mean"])
        return F.cross_entropy(logits, y) + float(self.hp.lam) * reg

    def round(self, t, clients):
        res = self.local_train(
            t,
            clients,
            (rows(self.P, clients), rows(self.B, clients)),
            self.train_spec,
            LocalInputs(shared={"means": self.means, "has_mean": self.has_mean}),
        )
        set_rows(self.P, clients, res.params)
        set_rows(self.B, clients, res.buffers)
        idx = [self.data.train_idx[int(k)] for k in clients]
        z = client_outputs(self.ctx, self.z, res.params, res.buffers, idx)
        means, counts = class_means(z, [self.data.y[self.data.tensor(i)] for i in idx], self.data.num_classes)
        d, known = self.means.shape[1], int(self.has_mean.sum())  # the global means the clients received
        self.sent = Traffic(int((counts > 0).sum()) * d, len(clients) * known * d)
        self.means, self.has_mean = global_prototypes(means, counts)
        return {"train/loss": res.loss.mean().item(), "classes_with_mean": int(self.has_mean.sum())}

    def client_models(self, clients, t):
        return rows(self.P, clients), rows(self.B, clients)

    def traffic(self, t, clients):
        """Only class means travel (no weights): up, each client's mean of z for every class it holds; down, the
        global mean of every class that has one (their class labels are not counted)."""
        return self.sent


@register
class FedProto(ClassMeanExchange):
    """FedProto: z = the body's features f(x) (the prototype space; FedReMa's split: everything before the FC
    layers), logits = head(f(x)); λ·MSE(f(x), P̄_y) pulls features to the global class prototypes.

    Inference (``inference``): ``prototype`` = the class of the nearest global prototype (L2; PFLlib
    ``test_metrics``), ``model`` = the client model's own head (FedProto code reports both).
    """

    name = "fedproto"

    def setup(self):
        super().setup()
        if self.hp.inference not in ("prototype", "model"):
            raise ConfigError("algorithm.inference", self.hp.inference, "prototype or model")

    def outputs(self, fm, p, b, x):
        h = fm.features(p, b, x)
        return h, fm.head(p, b, h)

    def nearest_prototype(self, p, b, x):
        return nearest_prototype_logits(self.fm.features(p, b, x), self.means, self.has_mean)

    def client_logits(self, clients, idx, t):
        if self.hp.inference == "model":
            return self.ctx.predict(*self.client_models(clients, t), idx)
        return client_outputs(self.ctx, self.nearest_prototype, *self.client_models(clients, t), idx)


__all__ = ["ClassMeanExchange", "FedProto"]
