"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021): alternate head and body updates
(baseline of CAFeMe Tables 1-2). ``fedrep`` = the paper/code (epochs, heads stay local); ``fedrep_caf`` = the
CAFeMe code's variant (steps, Adam, all parameters averaged)."""

from __future__ import annotations

from ..checks import boolean, int_at_least, number, one_of
from ..communication import Traffic, numel
from ..engine.schedule import make_schedule
from ..engine.stack import broadcast, rows, select, set_rows
from ..errors import ConfigError
from . import register
from .base import Algorithm
from .cafeme import uniform_mean
from .local import LocalInputs, LocalSpec


@register
class FedRep(Algorithm):
    """FedRep Alg. 1, per sampled client and round:

    1. ``head_epochs`` passes over its train split (or ``head_steps`` mini-batches) on the head φ with the body
       θ frozen (FedRep code: ``local_ep`` − ``local_rep_ep`` epochs);
    2. ``body_epochs`` passes (or ``body_steps`` mini-batches) on the body with the head frozen (``local_rep_ep``);
    3. server: ``aggregate: body`` — mean of the bodies, each client keeps its head (FedRep); ``aggregate:
       all`` — unweighted mean of all parameters, head included (CAF code: 5 Adam steps on the head, 1 on the
       body, then aggregate_model_params). Step mode draws the two phases' batches as one run of consecutive
       mini-batches (CAF code: one loader iterator).

    Head = the model's ``head`` scope (for the CAFeMe base network: the ``fc`` block = all dense
    layers + output, docs/baselines.md). Each phase keeps its own per-client optimizer state (torch's Adam
    counts steps per tensor, and a head tensor is only stepped in phase 1).
    """

    name = "fedrep"
    state_attrs = ("w", "bn", "H", "phase_state")

    def setup(self):
        unit = "epochs" if self.hp.get("head_epochs") is not None or self.hp.get("body_epochs") is not None else "steps"
        other = "steps" if unit == "epochs" else "epochs"
        for part in ("head", "body"):
            if self.hp.get(f"{part}_{other}") is not None:
                raise ConfigError(
                    f"algorithm.{part}_{other}",
                    self.hp.get(f"{part}_{other}"),
                    f"null when the budget is given in {unit} (set head_{unit} and body_{unit} only)",
                )
        self.unit = unit
        self.head_budget = int(self.checked_hp(f"head_{unit}", int_at_least(1)))  # FedRep: epochs for the head φ
        self.body_budget = int(self.checked_hp(f"body_{unit}", int_at_least(1)))  # ... and for the representation θ
        self.mode = self.checked_hp("aggregate", one_of("all", "body"))
        self.checked_hp("optimizer", one_of("adam", "sgd"))
        lr = float(self.checked_hp("lr", number(0, None, lo_open=True)))
        self.persistent = self.checked_hp("persistent_state", boolean())
        self.local_opt = self.opt.replace(name=self.hp.optimizer, lr=lr)
        self.head = self.fm.names("head")
        self.body = [n for n in self.fm.param_names if n not in set(self.head)]
        self.w, self.bn = self.initial_model()
        self.H = broadcast(select(self.w, self.head), self.K) if self.mode == "body" else None  # local heads φ_k
        self.phase_state: dict = {}
        # the head φ, then the representation θ, each with its own optimizer (and kept state); in step mode both
        # phases follow one schedule of the round (phase "train"), split in round()
        epochs = unit == "epochs"
        spec = LocalSpec(opt=self.local_opt, persist_opt_state=bool(self.persistent))
        self.head_spec = spec.replace(
            phase="fedrep_head" if epochs else "train", trainable=self.head, epochs=self.head_budget if epochs else None
        )
        self.body_spec = spec.replace(trainable=self.body, epochs=self.body_budget if epochs else None)

    def round(self, t, clients):
        m, ids = len(clients), [int(k) for k in clients]
        P, B = broadcast(self.w, m), broadcast(self.bn, m)
        if self.H is not None:
            set_rows(P, slice(None), rows(self.H, clients))
        if self.unit == "steps":
            hs = self.head_budget
            sched = make_schedule(
                [self.data.train_idx[k] for k in ids],
                ids,
                int(self.cfg.batch_size),
                self.seed,
                "train",
                t,
                steps=hs + self.body_budget,
                drop_last=bool(self.cfg.drop_last),
                device=self.data.x.device,
            )
            head_in = LocalInputs(schedule=[s[:hs] for s in sched])
            body_in = LocalInputs(schedule=[s[hs:] for s in sched])
        else:
            head_in = body_in = None
        head = self.phase("head", t, clients, (P, B), self.head_spec, head_in)
        res = self.phase("body", t, clients, (head.params, head.buffers), self.body_spec, body_in)
        if self.H is None:
            self.w, self.bn = uniform_mean(res.params, m), uniform_mean(res.buffers, m)
        else:
            set_rows(self.H, clients, select(res.params, self.head))
            self.w = {**self.w, **uniform_mean(select(res.params, self.body), m)}
            self.bn = uniform_mean(res.buffers, m)
        return {"train/head_loss": head.loss.mean().item(), "train/loss": res.loss.mean().item()}

    def traffic(self, t, clients):
        """``aggregate: body``: the body (and the buffers, averaged) both ways, the heads stay local (FedRep Alg. 1);
        ``all``: the whole model."""
        sent = self.w if self.H is None else select(self.w, self.body)
        return Traffic.both_ways(clients, numel(sent, self.bn))

    def phase(self, name, t, clients, model, spec, inputs=None):
        """One phase of local training; ``self.opt_state`` is swapped so each phase persists its own state."""
        self.opt_state = self.phase_state.get(name)
        res = self.local_train(t, clients, model, spec, inputs)
        self.phase_state[name] = self.opt_state
        return res

    def global_model(self):
        """The averaged model (``aggregate: all``); none with local heads (FedRep: only the body is global)."""
        return (self.w, self.bn) if self.H is None else None

    def new_client_model(self, clients):
        """New clients start from the global body (+ the averaged head, or the initial head when heads are local:
        FedRep §5 trains a new client's head on the learned representation)."""
        return broadcast(self.w, len(clients)), broadcast(self.bn, len(clients))

    def client_models(self, clients, t):
        P, B = broadcast(self.w, len(clients)), broadcast(self.bn, len(clients))
        if self.H is not None:
            set_rows(P, slice(None), rows(self.H, clients))
        return P, B


__all__ = ["FedRep"]
