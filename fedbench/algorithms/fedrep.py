"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021): alternate head and body updates
(spec baselines.md, FedRep row; the CAFeMe code's variant is the default)."""
from __future__ import annotations

from ..config import boolean, int_at_least, number, one_of
from ..engine.schedule import make_schedule
from ..engine.stack import broadcast, rows, select, set_rows
from . import register
from .base import Algorithm
from .cafeme import uniform_mean


@register
class FedRep(Algorithm):
    """FedRep Alg. 1, per sampled client and round (consecutive mini-batches of its train split):

    1. ``head_steps`` optimizer steps on the head φ with the body θ frozen;
    2. ``body_steps`` optimizer steps on the body with the head frozen;
    3. server: ``aggregate: all`` — unweighted mean of all parameters, head included (CAF code:
       5 Adam steps on the head, 1 on the body, then aggregate_model_params); ``aggregate: body`` —
       mean of the bodies only, each client keeps its head (original FedRep).

    Head = the model's ``head`` scope (for the CAFeMe base network: the ``fc`` block = all dense
    layers + output, baselines.md). Each phase keeps its own per-client optimizer state (torch's Adam
    counts steps per tensor, and a head tensor is only stepped in phase 1).
    """

    name = "fedrep"
    state_attrs = ("w", "bn", "H", "phase_state")

    def setup(self):
        self.head_steps = self.checked_hp("head_steps", int_at_least(1))
        self.body_steps = self.checked_hp("body_steps", int_at_least(1))
        self.mode = self.checked_hp("aggregate", one_of("all", "body"))
        self.checked_hp("optimizer", one_of("adam", "sgd"))
        lr = float(self.checked_hp("lr", number(0, None, lo_open=True)))
        self.persistent = self.checked_hp("persistent_state", boolean())
        self.local_opt = self.opt.replace(name=self.hp.optimizer, lr=lr)
        self.head = self.fm.names("head")
        self.body = [n for n in self.fm.param_names if n not in set(self.head)]
        self.w, self.bn = self.initial_model()
        self.H = broadcast(select(self.w, self.head), self.K) if self.mode == "body" else None   # local heads φ_k
        self.phase_state: dict = {}

    def round(self, t, clients):
        m, ids = len(clients), [int(k) for k in clients]
        P, B = broadcast(self.w, m), broadcast(self.bn, m)
        if self.H is not None:
            set_rows(P, slice(None), rows(self.H, clients))
        sched = make_schedule([self.data.train_idx[k] for k in ids], ids, int(self.cfg.batch_size), self.seed, "train", t,
                              steps=self.head_steps + self.body_steps, drop_last=bool(self.cfg.drop_last),
                              device=self.data.x.device)
        head = self.phase("head", t, clients, P, B, self.head, [s[:self.head_steps] for s in sched])
        res = self.phase("body", t, clients, head.params, head.buffers, self.body, [s[self.head_steps:] for s in sched])
        if self.H is None:
            self.w, self.bn = uniform_mean(res.params, m), uniform_mean(res.buffers, m)
        else:
            set_rows(self.H, clients, select(res.params, self.head))
            self.w = {**self.w, **uniform_mean(select(res.params, self.body), m)}
            self.bn = uniform_mean(res.buffers, m)
        return {"train/head_loss": head.loss.mean().item(), "train/loss": res.loss.mean().item()}

    def phase(self, name, t, clients, P, B, trainable, schedule):
        """One phase of local training; ``self.opt_state`` is swapped so each phase persists its own state."""
        self.opt_state = self.phase_state.get(name)
        res = self.local_train(t, clients, P, B, trainable=trainable, schedule=schedule, opt=self.local_opt,
                               persistent_state=self.persistent)
        self.phase_state[name] = self.opt_state
        return res

    def global_model(self):
        return self.w, self.bn

    def client_models(self, clients, t):
        P, B = broadcast(self.w, len(clients)), broadcast(self.bn, len(clients))
        if self.H is not None:
            set_rows(P, slice(None), rows(self.H, clients))
        return P, B


__all__ = ["FedRep"]
