"""New clients (CAFeMe §5.3; code ``evaluate_fl``): clients held out of training that join afterwards.

A share ``eval.new_clients.fraction`` of the K clients (random by seed) never participates in a
round (``Run.sample_clients`` draws from :attr:`NewClients.participants`). After the last round
(and every ``every`` rounds if set) each new client starts from the algorithm's model
(``Algorithm.new_client_model``: the global model, IFCA-FT's lowest-loss cluster model, ...),
fine-tunes ALL its parameters for S SGD steps (no momentum, one train mini-batch per step, lr decayed
×``lr_decay`` every ``lr_decay_every`` steps) and is scored on its own test split before every step
and after the last: a curve of S+1 accuracies (CAFeMe Fig. 4), whose last point is Table 1's number.

Scoring follows the code's ``perfl_eval``: the client's test split in shuffled mini-batches of B
(batches of one sample skipped), accuracy = mean of the batch accuracies, the client's number = that
mean, the reported number = mean over the new clients. The models are called in eval mode; CAFeMe's
networks have no BatchNorm running statistics, so they normalise with the batch statistics of each
test batch exactly as the code's train-mode evaluation does.

Fine-tuning runs through ``Algorithm.local_train`` (either executor) on the clients' train splits
only; the test split is only ever read under ``torch.no_grad``. Algorithms whose config sets
``new_clients_finetune: false`` (FedAvg, IFCA) — Table 1's rows without FT — are scored on their start
model (S = 0).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from . import seeding
from .checks import int_at_least, number
from .data.federated import FederatedData
from .engine.optim import OptimSpec
from .engine.schedule import client_batches
from .engine.stack import row
from .errors import ConfigError

CHECKS = {
    "fraction": number(0, 1, lo_open=True, hi_open=True),
    "steps": int_at_least(0),
    "lr": number(0, None, lo_open=True),
    "lr_decay": number(0, 1, lo_open=True),
    "lr_decay_every": int_at_least(1),
    "batch_size": int_at_least(1),
    "every": int_at_least(0),
}


def held_out_clients(seed: int, num_clients: int, fraction: float) -> np.ndarray:
    """The new clients' ids: round(fraction·K) of them, a random choice keyed by the seed (sorted)."""
    n = int(round(fraction * num_clients))
    return np.sort(seeding.rng(seed, "new_clients").permutation(num_clients)[:n])


class NewClients:
    """The protocol for one run: which clients are held out, and their fine-tune-and-score evaluation."""

    def __init__(self, data: FederatedData, cfg, seed: int, rounds: int, publish):
        """``data``: the run's federated data; ``cfg``: the ``eval.new_clients`` node; ``seed``, ``rounds``: the
        run's; ``publish(key, png, round)``: where the curves' picture goes (the run's loggers). The algorithm's own
        options (``new_clients_finetune``, ``new_clients_lr``) are read from the algorithm scored."""
        for key, (ok, allowed) in CHECKS.items():
            if not ok(cfg.get(key)):
                raise ConfigError(f"eval.new_clients.{key}", cfg.get(key), allowed)
        self.data, self.cfg, self.seed, self.rounds = data, cfg, int(seed), int(rounds)
        self.publish = publish
        c, K = cfg, data.num_clients
        self.ids = held_out_clients(self.seed, K, float(c.fraction))
        if not 1 <= len(self.ids) < K:
            raise ConfigError(
                "eval.new_clients.fraction",
                c.fraction,
                f"a share that holds out between 1 and {K - 1} of the {K} clients",
            )
        self.participants = np.setdiff1d(np.arange(K), self.ids)  # the only clients that ever train
        self.last: dict = {}

    def due(self, t: int) -> bool:
        every = int(self.cfg.every)
        return t == self.rounds or (every > 0 and t % every == 0)

    def steps_for(self, algo) -> int:
        """S, or 0 for an algorithm scored without fine-tuning (``algorithm.new_clients_finetune: false``:
        the FedAvg and IFCA rows of CAFeMe's Table 1)."""
        ft = OmegaConf.select(algo.hp, "new_clients_finetune", default=True)
        return int(self.cfg.steps) if ft else 0

    def lr_for(self, algo) -> float:
        """``algorithm.new_clients_lr`` if the algorithm sets one (CAFeMe: lr_ft_pfl), else ``eval.new_clients.lr``."""
        own = OmegaConf.select(algo.hp, "new_clients_lr", default=None)
        return float(self.cfg.lr if own is None else own)

    def schedule(self, t: int, steps: int) -> list[list[torch.Tensor]]:
        """Per new client, ``steps`` mini-batches of its TRAIN split, cycling through shuffled passes
        (the code's loader with ``drop_last``; batch = min(B, n_k) so small clients still train)."""
        data, B = self.data, int(self.cfg.batch_size)
        out = []
        for k in self.ids:
            idx = data.train_idx[k]
            g = seeding.rng(self.seed, "batches", "new_clients", t, int(k))
            out.append(
                [torch.from_numpy(b) for b in client_batches(idx, min(B, len(idx)), g, steps=steps, drop_last=True)]
            )
        return out

    def __call__(self, algo, t: int) -> dict:
        """Fine-tune and score every new client; returns the round's metrics (the full curves go to :attr:`last`)."""
        curves = self.curves(algo, t)
        if curves is None:
            return {}
        mean = np.nanmean(curves, axis=0)
        self.last = {
            "newclients/acc": float(mean[-1]),
            "newclients/curve": mean.tolist(),
            "newclients/round": t,
            "newclients/steps": curves.shape[1] - 1,
            "newclients/lr": self.lr_for(algo),
            "newclients/clients": self.ids.tolist(),
            "newclients/client_curves": curves.tolist(),
            # points of the curve as scalars (Fig. 4 tables): every lr_decay_every steps and the last
            **{
                f"newclients/step{s}_acc": float(mean[s])
                for s in sorted({*range(0, len(mean), int(self.cfg.lr_decay_every)), len(mean) - 1})
            },
        }
        return {
            "newclients/acc": float(mean[-1]),
            "newclients/step0_acc": float(mean[0]),
            "newclients/acc_std": float(np.nanstd(curves[:, -1])),
        }

    def curves(self, algo, t: int) -> np.ndarray | None:
        """[new clients, S+1] accuracies: before fine-tuning step s = 0..S-1 and after the last one."""
        clients = torch.as_tensor(self.ids)
        start = algo.new_client_model(clients)
        if start is None:
            return None
        P, Bf = start
        S, lr = self.steps_for(algo), self.lr_for(algo)
        batches = self.schedule(t, max(S, 1))
        n = len(self.ids)

        def finetune_loss(fm, p, b, x, y, ctx):
            return F.cross_entropy(algo.new_client_forward(p, b, x, (x, y)), y)

        from .algorithms.base import Algorithm  # padded batches are fine unless the forward reads the batch (CAFeMe)
        from .algorithms.local import LocalInputs, LocalSpec

        finetune_loss.pad_aware = type(algo).new_client_forward is Algorithm.new_client_forward
        spec = LocalSpec("new_clients", loss=finetune_loss)  # one SGD step per batch, lr decayed every few steps

        curves = []  # per step, [n] accuracies on the device: read once at the end
        for s in range(S + 1):
            support = [batches[m][max(s - 1, 0)] for m in range(n)]  # the latest fine-tuning batch (or the first)
            curves.append(self.accuracy(algo, P, Bf, support, t, s))
            if s < S:
                opt = OptimSpec(name="sgd", lr=lr * float(self.cfg.lr_decay) ** (s // int(self.cfg.lr_decay_every)))
                res = algo.local_train(
                    t,
                    clients,
                    (P, Bf),
                    spec.replace(opt=opt),
                    LocalInputs(schedule=[[batches[m][s]] for m in range(n)]),
                )
                P, Bf = res.params, res.buffers
        self.final_models = (P, Bf)
        return torch.stack(curves, dim=1).cpu().numpy()

    @torch.no_grad()
    def accuracy(self, algo, P, Bf, support: list[torch.Tensor], t: int, s: int) -> torch.Tensor:
        """Per new client: mean accuracy over its shuffled TEST mini-batches (size B, size-1 batches skipped), as a
        float64 tensor on the device (nan for a client without such a batch); no value is read on the host."""
        data, fm, B = self.data, algo.fm, int(self.cfg.batch_size)
        out = []
        fm.set_mode(False)
        try:
            for m, k in enumerate(self.ids):
                idx = data.test_idx[k]
                order = data.tensor(idx[seeding.rng(self.seed, "new_clients_test", t, s, int(k)).permutation(len(idx))])
                p, b = row(P, m), row(Bf, m)
                sup = support[m].to(data.x.device)
                ctx = (data.x[sup], data.y[sup])
                accs = []
                for i in range(0, len(order), B):
                    bi = order[i : i + B]
                    if len(bi) < 2:
                        continue
                    logits = algo.new_client_forward(p, b, data.x[bi], ctx)
                    accs.append((logits.argmax(-1) == data.y[bi]).double().mean())
                out.append(
                    torch.stack(accs).mean()
                    if accs
                    else torch.tensor(np.nan, dtype=torch.float64, device=data.x.device)
                )
        finally:
            fm.set_mode(True)
        return torch.stack(out)

    def state_dict(self) -> dict:  # checkpoints (Run._monitors): the last evaluation survives a resume
        return {"last": self.last}

    def load_state_dict(self, state: dict) -> None:
        self.last = dict(state.get("last", {}))

    def summary(self, run_dir) -> dict:
        """Summary entries of the last evaluation; draws the clients × steps accuracy map."""
        if not self.last:
            return {}
        from .plots import heatmap

        png = heatmap(
            np.asarray(self.last["newclients/client_curves"]),
            run_dir / "newclients_curves.png",
            "new clients: test accuracy vs fine-tuning steps",
            "step",
            "new client",
            annotate=False,
        )
        self.publish("newclients/curves", png, int(self.last["newclients/round"]))
        return dict(self.last)
