"""The algorithm interface and the FedAvg-shaped helpers every method builds on.

An algorithm is the paper's math: per-client local objectives (run by the executor) and a
server rule over stacked client results. It never writes a training loop of its own:
``self.local_train`` runs any local objective for any set of clients, with either executor.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import distributed
from ..communication import Traffic
from ..context import Context
from ..engine.executor import LocalJob, LocalResult
from ..engine.optim import OptimSpec
from ..engine.schedule import make_schedule
from ..engine.stack import Stack, broadcast, rows, set_rows
from ..files import written
from .local import LocalInputs, LocalSpec


class Algorithm:
    """Base class. Subclasses set ``name`` and implement :meth:`setup` and :meth:`round`.

    ``state_attrs`` lists the attributes that make up the algorithm's state (saved in checkpoints).
    """

    name = "base"
    state_attrs: tuple[str, ...] = ()

    def __init__(self, ctx: Context):
        self.ctx = ctx  # all the algorithm may use of its run (fedbench/context.py)
        self.cfg = ctx.cfg
        self.hp = ctx.cfg.algorithm  # this algorithm's hyperparameters (conf/algorithm/<name>.yaml)
        self.fm = ctx.fm
        self.data = ctx.data
        self.executor = ctx.executor
        self.seed = int(ctx.cfg.seed)
        self.K = self.data.num_clients
        self.n = self.data.train_sizes()  # n_k, local training set sizes
        self.opt = OptimSpec.from_cfg(ctx.cfg.optim)
        self.opt_state: Stack | None = None  # per-client optimizer state when optim.persistent_state
        # the FedAvg local solver: local_epochs of CE with the run's optimizer, its state kept per client when
        # optim.persistent_state
        self.train_spec = LocalSpec(persist_opt_state=bool(ctx.cfg.optim.persistent_state))

    # ---- life cycle -------------------------------------------------------------------------
    def setup(self) -> None:
        """Create the initial server/client state."""

    def round(self, t: int, clients: torch.Tensor) -> dict:
        """Run round ``t`` for the sampled ``clients``; return metrics to log."""
        raise NotImplementedError

    def traffic(self, t: int, clients: torch.Tensor) -> Traffic:
        """What round ``t`` sent over the network, called after :meth:`round`: the numbers the clients uploaded and
        downloaded, summed over the round's clients (fedbench/communication.py; docs/communication.md lists every
        method's). Every algorithm declares its own (tests/test_communication.py fails for one that does not)."""
        raise NotImplementedError(f"{type(self).__name__} declares no communication (Algorithm.traffic)")

    def global_model(self) -> tuple[Stack, Stack] | None:
        """(params, buffers) of the global model, evaluated on the global test set; None if there is none."""
        return None

    def client_models(self, clients: torch.Tensor, t: int) -> tuple[Stack, Stack] | None:
        """Stacked personalized models of ``clients`` (evaluated on their own test splits)."""
        g = self.global_model()
        return None if g is None else (broadcast(g[0], len(clients)), broadcast(g[1], len(clients)))

    def new_client_model(self, clients: torch.Tensor) -> tuple[Stack, Stack] | None:
        """Stacked models that held-out new ``clients`` start from (fedbench/newclients.py); default: the global
        model."""
        g = self.global_model()
        return None if g is None else (broadcast(g[0], len(clients)), broadcast(g[1], len(clients)))

    def new_client_forward(self, params: Stack, buffers: Stack, x: torch.Tensor, support: tuple) -> torch.Tensor:
        """Logits of ONE new client's model on ``x``; ``support`` = (x, y) of its latest fine-tuning batch
        (train split), for models conditioned on a labelled context (CAFeMe's paper variant). Default: plain call."""
        return self.fm(params, buffers, x)

    def finish(self, run_dir) -> dict:
        """Called once after the last round; may write extra artefacts and return extra summary entries."""
        return {}

    # ---- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {a: getattr(self, a) for a in ("opt_state", *self.state_attrs)}

    def load_state_dict(self, state: dict) -> None:
        for a, v in state.items():
            setattr(self, a, v)

    # ---- helpers ------------------------------------------------------------------------------
    def initial_model(self) -> tuple[Stack, Stack]:
        return self.ctx.initial

    def local_train(
        self,
        t: int,
        clients: torch.Tensor,
        model: tuple[Stack, Stack],
        spec: LocalSpec,
        inputs: LocalInputs | None = None,
    ) -> LocalResult:
        """Train the stacked models ``model`` = (params, buffers) of ``clients`` for one phase ``spec`` on their local
        data with the executor; every observer of the context hears of the result (t, client ids, result, phase).

        ``spec.phase`` keys the batch order, so different phases of one round draw different batches. Each
        step's x is a pack of ``spec.batches_per_step`` consecutive batches (``make_schedule``). ``inputs``: the
        loss's tensors, and the batches' indices and weights or an explicit schedule (then the batch options
        are unused).
        """
        inputs = inputs or LocalInputs()
        ids = [int(k) for k in clients]
        trainable = self.fm.param_names if spec.trainable is None else list(spec.trainable)
        epochs, steps = spec.epochs, spec.steps
        if epochs is None and steps is None:
            epochs = int(self.cfg.local_epochs)
        indices = inputs.indices
        if indices is None:
            indices = [self.data.train_idx[k] for k in ids]
        schedule = inputs.schedule
        if schedule is None:
            schedule = make_schedule(
                indices,
                ids,
                spec.batch_size or int(self.cfg.batch_size),
                self.seed,
                spec.phase,
                t,
                epochs=epochs,
                steps=steps,
                drop_last=bool(self.cfg.drop_last),
                weights=inputs.sample_weights,
                batches_per_step=spec.batches_per_step,
            )  # host
            # arrays: the executor lays the whole schedule out on the device in one copy (engine/schedule.py plan)
        opt = spec.opt or self.opt_at(t)
        state = None
        if spec.persist_opt_state:
            if self.opt_state is None:
                from ..engine.optim import init_state

                full = broadcast(self.initial_model()[0], 1)
                self.opt_state = {
                    k: v.repeat(self.K, *([1] * (v.dim() - 1)))
                    for k, v in init_state(opt, full, self.fm.param_names, lead=(1,)).items()
                }
            sel = torch.tensor(ids)
            state = {
                k: v
                for k, v in rows(self.opt_state, sel).items()
                if k.split(":", 1)[-1] in set(trainable) or k == "step"
            }
        params, buffers = model
        job = LocalJob(
            self.fm,
            params,
            buffers,
            trainable,
            schedule,
            self.data.x,
            self.data.y,
            opt,
            state,
            spec.loss,
            inputs.ctx,
            inputs.shared,
            augment=self.ctx.augment if spec.augment else None,
            aug_key=(self.seed, "augment", spec.phase, t),
            client_ids=ids,
            pack=spec.batches_per_step,
        )
        res = distributed.train(self.executor, job, self.ctx.world)  # the clients split over a run's processes
        if state is not None:
            set_rows(self.opt_state, torch.tensor(ids), res.opt_state)
        for observe in self.ctx.observers:  # the divergence guard, the forgetting/similarity monitors
            observe(t, ids, res, spec.phase)
        return res

    def publish_matrix(
        self,
        name: str,
        t: int,
        matrix,
        *,
        draw: bool = True,
        title: str | None = None,
        xlabel: str = "client",
        ylabel: str = "client",
        **kw,
    ) -> None:
        """Save a per-round diagnostic matrix (``diagnostics/<name>/round_<t>.npy``), draw it and log the picture."""
        from ..plots import heatmap

        m = np.asarray(matrix.detach().cpu() if torch.is_tensor(matrix) else matrix)
        d = self.ctx.out_dir / "diagnostics" / name
        d.mkdir(parents=True, exist_ok=True)
        with written(d / f"round_{t:05d}.npy") as path:  # a full disk: one line naming the file
            np.save(path, m)
        if draw:
            png = heatmap(m, d / f"round_{t:05d}.png", title or f"{name} (round {t})", xlabel, ylabel, **kw)
            self.ctx.publish(name, png, t)

    def opt_at(self, t: int) -> OptimSpec:
        """The run's optimizer in round ``t``: ``lr``, or ``optim.lr_decay_to`` after round ``optim.lr_decay_round``
        (a step decay, e.g. ECL §4.1: 0.1 -> 0.01 after round 200)."""
        d = self.cfg.optim.get("lr_decay_round")
        if d is not None and t > int(d):
            return self.opt.replace(lr=float(self.cfg.optim.lr_decay_to))
        return self.opt

    def aggregate(self, stack: Stack, clients: torch.Tensor) -> Stack:
        """FedAvg: the average weighted by local training-set sizes n_k (McMahan et al. 2017, Eq. 1)."""
        from ..engine.stack import weighted_mean

        return weighted_mean(stack, self.n[clients.long()])

    def checked_hp(self, key: str, check: tuple):
        """``algorithm.<key>`` after ``check`` = (ok, allowed) from :mod:`fedbench.config` (``number(0)``,
        ``one_of(...)``, ``boolean()``); a missing or bad value raises ConfigError — call it in ``setup()``."""
        from ..errors import ConfigError

        ok, allowed = check
        v = self.hp.get(key, "<missing>")
        if v == "<missing>" or not ok(v):
            raise ConfigError(f"algorithm.{key}", v, allowed)
        return v

    # ---- evaluation hooks (fedbench/evaluation.py) ----------------------------------------------
    def client_logits(self, clients: torch.Tensor, idx: list[np.ndarray], t: int) -> list[torch.Tensor] | None:
        """Logits of each client's predictor on its samples ``idx[i]``, for predictors that are not one plain model
        per client (FedProto's nearest prototype, FedRoD's generic + personal heads, ECL's mixture of experts).
        None (the default): the evaluator predicts with :meth:`client_models`."""
        return None

    def class_acc_metrics(self, class_acc: np.ndarray) -> dict:
        """The method's own evaluation metrics, from the [K, C] per-class test accuracies of its personalized
        predictors (NaN = no test sample); logged after the evaluator's ``pers/...`` metrics. Default: none."""
        return {}
