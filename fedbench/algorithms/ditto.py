"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): FedAvg for a global model + one proximally regularised
personal model per client (FedCOM builds on it). ``algorithm=ditto_caf``: the CAFeMe code's Ditto
(its own global solver and an unweighted server mean), the Ditto row of CAFeMe's Tables 1-2."""

from __future__ import annotations

import torch

from ..checks import int_at_least, number, one_of
from ..communication import Traffic, numel
from ..engine.executor import LocalResult
from ..engine.masking import pad_aware
from ..engine.optim import OptimSpec
from ..engine.stack import Stack, broadcast, rows, set_rows
from ..errors import ConfigError
from ..losses import proximal
from . import register
from .base import Algorithm
from .cafeme import uniform_mean
from .local import LocalInputs, LocalSpec


def _number(v, kind) -> bool:
    """``v`` is an int (``kind=int``) or an int/float (``kind=float``), not a bool."""
    return not isinstance(v, bool) and isinstance(v, int if kind is int else (int, float))


@register
class Ditto(Algorithm):
    """Ditto Algorithm 1, for every client k of round t (all as stacks over the round's clients):

    1. global copy: the FedAvg local solver (``local_epochs`` of CE with the run's optimizer) from w^t -> w_k^t,
       or ``global_steps`` mini-batch steps of ``global_optimizer`` (CAFeMe code: 5 Adam steps, lr 0.001, each
       client keeping its Adam state across rounds);
    2. personal model: s local iterations of  v_k <- v_k - eta (grad F_k(v_k) + lambda (v_k - w^t)),
       i.e. SGD on h_k(v; w^t) = F_k(v) + lambda/2 ||v - w^t||^2  (Ditto Eq. 2, FedCOM Eq. 3);
    3. server: w^{t+1} = sum_k n_k w_k^t / sum_k n_k (``aggregate: weighted``), or the unweighted mean of the
       w_k^t (``uniform``, CAFeMe code's aggregate_model_params).

    The personalized model evaluated for client k is v_k. The server keeps every v_k (FedCOM needs
    them for its peer merge; for Ditto it is just where the clients' state lives in a simulation).
    ``optim.persistent_state`` keeps momentum only for the global copy; the personal update starts
    each round with a fresh optimizer state (Ditto's Alg. 1 is plain SGD).
    """

    name = "ditto"
    state_attrs = ("w", "bn", "V", "VB")

    def setup(self):
        hp = self.hp
        if not _number(hp.lam, float) or hp.lam < 0:
            raise ConfigError("algorithm.lam", hp.lam, "a number >= 0 (the proximal weight lambda)")
        if hp.personal_steps is None:
            if not _number(hp.personal_epochs, int) or hp.personal_epochs < 1:
                raise ConfigError(
                    "algorithm.personal_epochs", hp.personal_epochs, "an integer >= 1 (or set personal_steps)"
                )
        elif not _number(hp.personal_steps, int) or hp.personal_steps < 1:
            raise ConfigError(
                "algorithm.personal_steps", hp.personal_steps, "null (use personal_epochs) or an integer >= 1"
            )
        self.global_steps = self.checked_hp(
            "global_steps", (lambda v: v is None or int_at_least(1)[0](v), "null (local_epochs) or an integer >= 1")
        )
        opt = self.checked_hp("global_optimizer", one_of(None, "adam"))
        lr = self.checked_hp("global_lr", number(0, None, lo_open=True, optional=True))
        self.global_opt = None if opt is None else OptimSpec(name=opt, lr=float(self.cfg.lr if lr is None else lr))
        self.uniform = self.checked_hp("aggregate", one_of("weighted", "uniform")) == "uniform"
        self.w, self.bn = self.initial_model()  # global model w^t
        self.V, self.VB = broadcast(self.w, self.K), broadcast(self.bn, self.K)  # personal models v_k, all clients
        solver = self.train_spec if self.global_steps is None else self.train_spec.replace(steps=int(self.global_steps))
        if self.global_opt is not None:  # its own optimizer, per-client state kept across rounds (CAFeMe code)
            solver = solver.replace(opt=self.global_opt, persist_opt_state=True)
        self.global_spec = solver
        budget = (
            {"steps": int(hp.personal_steps)} if hp.personal_steps is not None else {"epochs": int(hp.personal_epochs)}
        )
        self.personal_spec = LocalSpec("personal", loss=self.personal_loss, **budget)

    def round(self, t, clients):
        m = len(clients)
        glob = self.local_train(t, clients, (broadcast(self.w, m), broadcast(self.bn, m)), self.global_spec)  # 1. w_k^t
        v, vb, diagnostics = self.personal_start(t, clients, glob)
        pers = self.local_train(
            t, clients, (v, vb), self.personal_spec, LocalInputs(shared={"w_global": self.w})
        )  # 2. v_k, anchored at w^t
        set_rows(self.V, clients, pers.params)
        set_rows(self.VB, clients, pers.buffers)
        self.w, self.bn = self.server_mean(glob.params, clients), self.server_mean(glob.buffers, clients)  # 3.
        return {"train/loss": glob.loss.mean().item(), "train/personal_loss": pers.loss.mean().item(), **diagnostics}

    def traffic(self, t, clients):
        """Ditto: the global model both ways; the personal models stay on the clients."""
        return Traffic.both_ways(clients, numel(self.w, self.bn))

    def server_mean(self, stack: Stack, clients: torch.Tensor) -> Stack:
        """Step 3 over the global copies: n_k-weighted (FedAvg) or unweighted (``aggregate: uniform``)."""
        return uniform_mean(stack, len(clients)) if self.uniform else self.aggregate(stack, clients)

    def personal_start(self, t: int, clients: torch.Tensor, glob: LocalResult) -> tuple[Stack, Stack, dict]:
        """The personal models the personal update starts from (Ditto: v_k as kept), plus diagnostics.

        FedCOM overrides this with its complementary matching and merge (FedCOM Alg. 1, Alg. 2 lines 5-6).
        """
        return rows(self.V, clients), rows(self.VB, clients), {}

    @pad_aware
    def personal_loss(self, fm, p, b, x, y, ctx):
        """h_k(v; w) = CE(v) + lambda/2 ||v - w||^2 for ONE client (pure: runs under vmap)."""
        ce = torch.nn.functional.cross_entropy(fm(p, b, x), y)
        return ce + float(self.hp.lam) * proximal(p, ctx["w_global"])

    def global_model(self):
        return self.w, self.bn

    def client_models(self, clients, t):
        return rows(self.V, clients), rows(self.VB, clients)


__all__ = ["Ditto"]
