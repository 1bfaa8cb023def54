"""pFedMe (Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020) —
official code ``CharlieDinh/pFedMe`` (``userpFedMe``, ``pFedMeOptimizer``)."""

from __future__ import annotations

import torch

from ..communication import Traffic, numel
from ..engine.optim import OptimSpec
from ..engine.schedule import make_schedule
from ..engine.stack import broadcast, rows, set_rows
from ..errors import ConfigError
from . import register
from .base import Algorithm
from .local import LocalInputs, LocalSpec


@register
class PFedMe(Algorithm):
    """pFedMe Algorithm 1. Round t, client k in S, starting from w_k = θ_k = w^t:

      for each local step r = 1..R (one mini-batch D_r each):
        θ_k ← K steps of SGD (lr ``personal_lr``) on  f_k(θ; D_r) + λ/2 ‖θ − w_k‖²   (inner problem, Eq. 7;
              θ continues from the previous step's θ, as ``pFedMeOptimizer`` does)
        w_k ← w_k − η λ (w_k − θ_k)                                                  (Alg. 1 line 8)
      server: w^{t+1} = (1 − β) w^t + β Σ_k n_k w_k / Σ_k n_k                        (Alg. 1 line 12)

    The personalized model of client k is its latest θ_k; the global model is w. R = ``local_steps`` batches
    (pFedMe code: 20), or with ``local_steps: null`` the batches of ``local_epochs`` passes (PFLlib; then θ_k
    comes from the epoch's last, possibly small, batch unless ``drop_last`` — PFLlib's loaders drop it).
    BatchNorm buffers (pFedMe's models have none) follow θ and are averaged like FedAvg.
    """

    name = "pfedme"
    state_attrs = ("w", "bn", "theta", "theta_bn")

    def setup(self):
        hp = self.hp
        for key, ok, allowed in (
            ("lam", _num(hp.lam) and hp.lam > 0, "a number > 0 (λ)"),
            ("inner_steps", _int(hp.inner_steps) and hp.inner_steps >= 1, "an integer >= 1 (K)"),
            ("personal_lr", _num(hp.personal_lr) and hp.personal_lr > 0, "a number > 0"),
            ("eta", _num(hp.eta) and hp.eta > 0, "a number > 0 (η)"),
            ("beta", _num(hp.beta) and hp.beta > 0, "a number > 0 (β)"),
            (
                "local_steps",
                hp.local_steps is None or _int(hp.local_steps) and hp.local_steps >= 1,
                "null (local_epochs passes) or an integer >= 1 (R)",
            ),
        ):
            if not ok:
                raise ConfigError(f"algorithm.{key}", hp[key], allowed)
        self.w, self.bn = self.initial_model()
        self.theta, self.theta_bn = broadcast(self.w, self.K), broadcast(self.bn, self.K)  # θ_k, all clients
        # θ's inner steps and w_k's moves, as pFedMeOptimizer does them: θ -= lr (∇f + λ (θ − w_k)), and
        # w_k -= ηλ (w_k − θ) after every K-th step (engine/optim.py, "pfedme"; its state "anchor:<param>" is w_k)
        self.inner_opt = OptimSpec(
            name="pfedme",
            lr=float(hp.personal_lr),
            prox=float(hp.lam),
            anchor_lr=float(hp.eta),
            anchor_every=int(hp.inner_steps),
        )
        self.inner_spec = LocalSpec("pfedme", opt=self.inner_opt)  # on the round's schedule (local_batches)

    def local_batches(self, t, clients) -> list[list[torch.Tensor]]:
        """Per client, the R mini-batches D_1..D_R of round t (sample indices into the data pool)."""
        ids = [int(k) for k in clients]
        steps = self.hp.local_steps
        return make_schedule(
            [self.data.train_idx[k] for k in ids],
            ids,
            int(self.cfg.batch_size),
            self.seed,
            "train",
            t,
            epochs=None if steps else int(self.cfg.local_epochs),
            steps=int(steps) if steps else None,
            drop_last=bool(self.cfg.drop_last),
        )  # host arrays

    def round(self, t, clients):
        """One local-training call for the whole round: each mini-batch D_r repeated K times (the inner steps); the
        optimizer moves w_k after each D_r's K-th step. train/loss is the mean cross-entropy f_k of the inner steps
        (the proximal term is in the optimizer's step, as in pFedMeOptimizer)."""
        m, K = len(clients), int(self.hp.inner_steps)
        inner = [[b for b in batches for _ in range(K)] for batches in self.local_batches(t, clients)]
        res = self.local_train(
            t, clients, (broadcast(self.w, m), broadcast(self.bn, m)), self.inner_spec, LocalInputs(schedule=inner)
        )
        set_rows(self.theta, clients, res.params)
        set_rows(self.theta_bn, clients, res.buffers)
        w_local = {k: res.opt_state[f"anchor:{k}"] for k in self.w}  # w_k after the round's R moves
        beta, avg = float(self.hp.beta), self.aggregate(w_local, clients)
        self.w = {k: (1 - beta) * self.w[k] + beta * avg[k] for k in self.w}
        self.bn = self.aggregate(res.buffers, clients)
        return {"train/loss": res.loss.mean().item()}

    def client_models(self, clients, t):
        return rows(self.theta, clients), rows(self.theta_bn, clients)

    def traffic(self, t, clients):
        """The model both ways: down w^t, up the local w_k (pFedMe Alg. 1; θ_k stays local)."""
        return Traffic.both_ways(clients, numel(self.w, self.bn))

    def global_model(self):
        return self.w, self.bn


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


__all__ = ["PFedMe"]
