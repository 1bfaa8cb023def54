"""The algorithm interface and the FedAvg-shaped helpers every method builds on.

An algorithm is the paper's math: per-client local objectives (run by the executor) and a
server rule over stacked client results. It never writes a training loop of its own:
``self.local_train`` runs any local objective for any set of clients, with either executor.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..engine.executor import LocalJob, LocalResult
from ..engine.functional import cross_entropy
from ..engine.optim import OptimSpec
from ..engine.schedule import make_schedule
from ..engine.stack import Stack, broadcast, rows, set_rows
from ..rundir import written


class Algorithm:
    """Base class. Subclasses set ``name`` and implement :meth:`setup` and :meth:`round`.

    ``state_attrs`` lists the attributes that make up the algorithm's state (saved in checkpoints).
    """

    name = "base"
    state_attrs: tuple[str, ...] = ()
    keep_local = False   # set by the forgetting diagnostic (fedbench/forgetting.py): remember the round's local models
    last_local = None    # (t, client ids, LocalResult) of the last purpose="train" local_train call when keep_local

    def __init__(self, run):
        self.run = run
        self.cfg = run.cfg
        self.hp = run.cfg.algorithm          # this algorithm's hyperparameters (conf/algorithm/<name>.yaml)
        self.fm = run.fm
        self.data = run.data
        self.executor = run.executor
        self.seed = int(run.cfg.seed)
        self.K = self.data.num_clients
        self.n = self.data.train_sizes()     # n_k, local training set sizes
        self.opt = OptimSpec.from_cfg(run.cfg.optim)
        self.opt_state: Stack | None = None  # per-client optimizer state when optim.persistent_state

    # ---- life cycle -------------------------------------------------------------------------
    def setup(self) -> None:
        """Create the initial server/client state."""

    def round(self, t: int, clients: torch.Tensor) -> dict:
        """Run round ``t`` for the sampled ``clients``; return metrics to log."""
        raise NotImplementedError

    def global_model(self) -> tuple[Stack, Stack] | None:
        """(params, buffers) of the global model, evaluated on the global test set; None if there is none."""
        return None

    def client_models(self, clients: torch.Tensor, t: int) -> tuple[Stack, Stack] | None:
        """Stacked personalized models of ``clients`` (evaluated on their own test splits)."""
        g = self.global_model()
        return None if g is None else (broadcast(g[0], len(clients)), broadcast(g[1], len(clients)))

    def new_client_model(self, clients: torch.Tensor) -> tuple[Stack, Stack] | None:
        """Stacked models that held-out new ``clients`` start from (fedbench/newclients.py); default: the global model."""
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
        return self.run.initial_params, self.run.initial_buffers

    def local_train(self, t: int, clients: torch.Tensor, params: Stack, buffers: Stack, *,
                    loss: Callable = cross_entropy, trainable: list[str] | None = None, epochs: int | None = None,
                    steps: int | None = None, ctx: Stack | None = None, shared: dict | None = None,
                    opt: OptimSpec | None = None, indices: list[np.ndarray] | None = None, batch_size: int | None = None,
                    purpose: str = "train", sample_weights: list[np.ndarray] | None = None,
                    persistent_state: bool | None = None, augment: bool = True, batches_per_step: int = 1,
                    schedule: list[list[torch.Tensor]] | None = None) -> LocalResult:
        """Train the stacked models of ``clients`` on their local data with the executor.

        Defaults: all parameters, ``local_epochs`` epochs of ``batch_size`` mini-batches of the
        clients' training sets, the run's optimizer, cross-entropy. ``purpose`` keys the batch
        order, so different phases of one round draw different batches. ``batches_per_step`` > 1:
        each step's x is a pack of that many consecutive batches (``make_schedule``). ``schedule``:
        an explicit per-client list of index tensors, one per step (then the batch options are unused).
        """
        ids = [int(k) for k in clients]
        trainable = self.fm.param_names if trainable is None else list(trainable)
        if epochs is None and steps is None:
            epochs = int(self.cfg.local_epochs)
        if indices is None:
            indices = [self.data.train_idx[k] for k in ids]
        if schedule is None:
            schedule = make_schedule(indices, ids, batch_size or int(self.cfg.batch_size), self.seed, purpose, t,
                                     epochs=epochs, steps=steps, drop_last=bool(self.cfg.drop_last),
                                     weights=sample_weights, batches_per_step=batches_per_step)   # host arrays:
            # the executor lays the whole schedule out on the device in one copy (engine/schedule.py plan)
        opt = opt or self.opt_at(t)
        persistent = bool(self.cfg.optim.persistent_state) if persistent_state is None else persistent_state
        state = None
        if persistent and (purpose == "train" or persistent_state):  # an explicit True also persists other phases
            if self.opt_state is None:
                from ..engine.optim import init_state

                full = broadcast(self.initial_model()[0], 1)
                self.opt_state = {k: v.repeat(self.K, *([1] * (v.dim() - 1))) for k, v in
                                  init_state(opt, full, self.fm.param_names, lead=(1,)).items()}
            sel = torch.tensor(ids)
            state = {k: v for k, v in rows(self.opt_state, sel).items() if k.split(":", 1)[-1] in set(trainable) or k == "step"}
        job = LocalJob(self.fm, params, buffers, trainable, schedule, self.data.x, self.data.y, opt, state,
                       loss, ctx or {}, shared or {}, augment=self.run.augment if augment else None,
                       aug_key=(self.seed, "augment", purpose, t), client_ids=ids, pack=batches_per_step)
        res = self.executor.train(job)
        if self.keep_local and purpose == "train":
            self.last_local = (t, ids, res)
        if state is not None:
            set_rows(self.opt_state, torch.tensor(ids), res.opt_state)
        self.run.check_finite(t, ids, res)
        return res

    def publish_matrix(self, name: str, t: int, matrix, *, draw: bool = True, title: str | None = None,
                       xlabel: str = "client", ylabel: str = "client", **kw) -> None:
        """Save a per-round diagnostic matrix (``diagnostics/<name>/round_<t>.npy``), draw it and log the picture."""
        from ..plots import heatmap

        m = np.asarray(matrix.detach().cpu() if torch.is_tensor(matrix) else matrix)
        d = self.run.run_dir / "diagnostics" / name
        d.mkdir(parents=True, exist_ok=True)
        with written(d / f"round_{t:05d}.npy") as path:   # a full disk: one line naming the file
            np.save(path, m)
        if draw:
            png = heatmap(m, d / f"round_{t:05d}.png", title or f"{name} (round {t})", xlabel, ylabel, **kw)
            self.run.image(name, png, t)

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
