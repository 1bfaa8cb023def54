"""FedALA (Zhang, Hua, Wang, Shen, Guan, AAAI 2023): adaptive local aggregation for personalized FL.

A baseline of FedKA Table 9 (docs/pfl_baselines_b.md).
Read with the official code ``TsingZ0/FedALA`` (utils/ALA.py, as in PFLlib).
Round t, for every participating client k (§3 of the paper, Alg. 1):

1. adaptive local aggregation (ALA, Eq. 4-6) of the received global model θ_g and the client's own model
   θ_k (its model after its last local training): the lower layers take θ_g, the top ``top_layers``
   layers become θ̂ = θ_k + (θ_g − θ_k) ⊙ W with element-wise weights W ∈ [0, 1], learned on a random
   ``rand_percent`` % of the local train data by projected SGD  W ← clip(W − η ∇_W L(θ̂), 0, 1)
   (∇_W = ∇_θ̂ L ⊙ (θ_g − θ_k)); W starts at 1 and is kept across rounds; in the client's first ALA
   ("start phase") the weights are trained until the loss settles (std of the last ``num_pre_loss`` epoch
   losses < ``threshold``), afterwards one epoch per round; skipped while θ_k == θ_g (first round);
2. ordinary local training (CE, E epochs) from θ̂;
3. server: FedAvg (n_k-weighted) of the trained models.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .. import seeding
from ..checks import int_at_least, number
from ..communication import Traffic, numel
from ..engine.masking import pad_aware
from ..engine.stack import Stack, broadcast, rows, select, set_rows, tagged, untagged
from ..errors import ConfigError
from . import register
from .base import Algorithm
from .local import LocalInputs, LocalSpec


def param_layers(names: list[str]) -> list[list[str]]:
    """Parameter names grouped into layers (one module's tensors, e.g. a Linear's weight and bias), in order."""
    layers: dict[str, list[str]] = {}
    for n in names:
        layers.setdefault(n.rsplit(".", 1)[0], []).append(n)
    return list(layers.values())


def ala_start(local: Stack, global_: Stack, W: Stack) -> Stack:
    """θ̂ = θ_k + (θ_g − θ_k) ⊙ W on the layers in ``W``, θ_g elsewhere (Eq. 4-5); works on stacks and single models."""
    return {n: (local[n] + (global_[n] - local[n]) * W[n]) if n in W else global_[n] for n in global_}


@register
class FedALA(Algorithm):
    """State: global model w, every client's own model θ_k (+ buffers), its ALA weights W_k and start-phase flag."""

    name = "fedala"
    state_attrs = ("w", "bn", "P", "B", "W", "started")

    def setup(self):
        hp = self.hp
        for key, check in (
            ("eta", number(0, lo_open=True)),
            ("rand_percent", number(0, 100, lo_open=True)),
            ("top_layers", int_at_least(1)),
            ("threshold", number(0, lo_open=True)),
            ("num_pre_loss", int_at_least(1)),
            ("max_start_epochs", int_at_least(1)),
        ):
            self.checked_hp(key, check)
        layers = param_layers(self.fm.param_names)
        if hp.top_layers > len(layers):
            raise ConfigError("algorithm.top_layers", hp.top_layers, f"at most the model's {len(layers)} layers")
        self.top = [n for layer in layers[-int(hp.top_layers) :] for n in layer]  # the p higher layers
        self.w, self.bn = self.initial_model()
        self.P, self.B = broadcast(self.w, self.K), broadcast(self.bn, self.K)  # θ_k after its last training
        self.W = broadcast({n: torch.ones_like(self.w[n]) for n in self.top}, self.K)  # W_k, init 1 (code)
        self.started = torch.zeros(self.K, dtype=torch.bool)  # start phase done
        opt = self.opt.replace(
            name="sgd",
            lr=float(hp.eta),
            momentum=0.0,
            weight_decay=0.0,
            nesterov=False,
            clip_grad_norm=None,
            bounds=(0.0, 1.0),
        )
        # one epoch of projected SGD on W_k (phase "ala<epoch>", set per epoch in learn_weights)
        self.ala_spec = LocalSpec(loss=self.ala_loss, trainable=tuple(self.top), epochs=1, opt=opt)

    def round(self, t, clients):
        theta_hat, metrics = self.adaptive_local_aggregation(t, clients)
        res = self.local_train(t, clients, (theta_hat, rows(self.B, clients)), self.train_spec)
        set_rows(self.P, clients, res.params)
        set_rows(self.B, clients, res.buffers)
        self.w, self.bn = self.aggregate(res.params, clients), self.aggregate(res.buffers, clients)
        return {"train/loss": res.loss.mean().item(), **metrics}

    def adaptive_local_aggregation(self, t, clients) -> tuple[Stack, dict]:
        """θ̂_k for the round's clients (step 1); learns and stores their W_k."""
        m = len(clients)
        local, glob = rows(self.P, clients), broadcast(self.w, m)
        same = torch.ones(m, dtype=torch.bool)
        for n in glob:  # the code skips ALA while the client's model equals the global one (first round)
            same &= (local[n] == glob[n]).flatten(1).all(1).cpu()
        theta_hat = ala_start(local, glob, {})  # lower layers: θ_g (top layers set below)
        for n in self.top:
            theta_hat[n] = local[n].clone()
        active = torch.nonzero(~same).flatten()
        if len(active) == 0:
            return theta_hat, {}
        ids = clients[active]
        W, epochs, losses = self.learn_weights(t, ids, rows(local, active), rows(glob, active))
        set_rows(self.W, ids, W)
        self.started[ids.long().cpu()] = True
        top_local, top_glob = select(rows(local, active), self.top), select(rows(glob, active), self.top)
        set_rows(theta_hat, active, ala_start(top_local, top_glob, W))
        return theta_hat, {
            "fedala/weight_mean": float(torch.cat([v.flatten(1) for v in W.values()], 1).mean()),
            "fedala/epochs": float(np.mean(epochs)),
            "fedala/loss": float(np.mean(losses)),
        }

    def learn_weights(self, t, ids, local: Stack, glob: Stack) -> tuple[Stack, list[int], list[float]]:
        """Projected SGD on W_k (code ``adaptive_local_aggregation``): one epoch on the s% sample, repeated in
        the start phase until the epoch losses settle. Runs through ``local_train`` (both executors)."""
        hp = self.hp
        sample = []
        for k in ids.tolist():  # a fresh random s% of the local train data each round (paper §3.2)
            idx = self.data.train_idx[k]
            size = max(1, int(float(hp.rand_percent) / 100 * len(idx)))
            sample.append(np.sort(seeding.rng(self.seed, "ala_sample", t, k).choice(idx, size, replace=False)))
        ctx = {**tagged(select(local, self.top), "local"), **tagged({n: glob[n] - local[n] for n in self.top}, "delta")}
        shared = tagged({n: v for n, v in self.w.items() if n not in self.top}, "global")  # lower layers: θ_g
        W = rows(self.W, ids)
        buffers = rows(self.B, ids)
        history: list[list[float]] = [[] for _ in ids]
        todo = torch.ones(len(ids), dtype=torch.bool)  # clients still training W this round
        epoch = 0
        while todo.any():
            sel = torch.nonzero(todo).flatten()
            spec = self.ala_spec.replace(phase=f"ala{epoch}")
            inputs = LocalInputs(ctx=rows(ctx, sel), shared=shared, indices=[sample[i] for i in sel.tolist()])
            res = self.local_train(t, ids[sel], (rows(W, sel), rows(buffers, sel)), spec, inputs)
            set_rows(W, sel, res.params)
            epoch += 1
            for j, i in enumerate(sel.tolist()):
                history[i].append(float(res.loss[j]))
                h, start = history[i], not bool(self.started[int(ids[i])])
                settled = len(h) > int(hp.num_pre_loss) and np.std(h[-int(hp.num_pre_loss) :]) < float(hp.threshold)
                if not start or settled or epoch >= int(hp.max_start_epochs):
                    todo[i] = False
        return W, [len(h) for h in history], [h[-1] for h in history]

    @pad_aware
    def ala_loss(self, fm, p, b, x, y, ctx):
        """CE of θ̂(W) for ONE client; ``p`` holds W (pure, runs under vmap)."""
        local, delta = untagged(ctx, "local"), untagged(ctx, "delta")
        theta = {**untagged(ctx, "global"), **{n: local[n] + delta[n] * p[n] for n in self.top}}
        return F.cross_entropy(fm(theta, b, x), y)

    def client_models(self, clients, t):
        return rows(self.P, clients), rows(self.B, clients)

    def traffic(self, t, clients):
        """The model both ways: down the global model (ALA runs on the client), up the trained model (FedALA Alg. 1)."""
        return Traffic.both_ways(clients, numel(self.w, self.bn))

    def global_model(self):
        return self.w, self.bn


__all__ = ["FedALA", "ala_start", "param_layers"]
