"""Evaluation: personalized accuracy (each client's model on its own test split) and global-model
accuracy (on the global test set), with per-client and per-class detail, the spread over clients (worst 10 %,
percentiles; many/medium/few-shot classes on long-tailed data) and its picture; best/final summaries.

The same for every method: an algorithm's own predictors and metrics come in through its hooks
(:meth:`Algorithm.client_logits`, :meth:`Algorithm.class_acc_metrics`), the metrics from fedbench/metrics.py."""

from __future__ import annotations

import numpy as np
import torch

from .algorithms.base import Algorithm
from .context import Context
from .metrics import (
    class_counts,
    client_spread,
    confusion_counts,
    designated_class_accuracy,
    present_class_accuracy,
    shot_accuracy,
)

SUMMARIZED = ("acc", "acc_mean", "acc_present_classes", "acc_worst10", "acc_p10", "acc_p50", "acc_p90")  # key endings


class Evaluator:
    """The evaluations of a run's algorithm, from its :class:`~fedbench.context.Context` (the data, the model and the
    predictions, as the algorithm sees them) and ``cfg`` (the ``eval`` node: ``personalized``, ``global_model``)."""

    def __init__(self, ctx: Context, cfg):
        self.ctx, self.data, self.cfg = ctx, ctx.data, cfg
        self.last: dict = {}

    def personalized(self, algo, t: int) -> dict:
        data = self.data
        clients = torch.arange(data.num_clients)
        test_idx = [data.test_idx[k] for k in range(data.num_clients)]
        outputs = algo.client_logits(clients, test_idx, t)  # None: one plain model per client
        if outputs is None:
            outputs = self.client_model_logits(algo, clients, test_idx, t)
            if outputs is None:
                return {}
        C = data.num_classes
        labels = [data.y[i] for i in data.tensors(test_idx)]  # one upload of all clients' test indices
        counts = [class_counts(logits, y, C) for logits, y in zip(outputs, labels)]
        correct, total = torch.stack(counts).cpu().numpy().transpose(1, 0, 2)  # [K, C] each: ONE read for all clients
        n = total.sum(1)
        acc = np.divide(correct.sum(1), n, out=np.zeros(len(n)), where=n > 0)
        has = n > 0
        cls_acc = np.divide(correct, total, out=np.zeros_like(correct, dtype=float), where=total > 0)
        present_acc = present_class_accuracy(cls_acc, data.counts, total)
        self.last["pers_client_acc"], self.last["pers_round"] = acc.tolist(), t
        self.last["pers_class_acc"] = np.divide(
            correct.sum(0), total.sum(0), out=np.zeros(C), where=total.sum(0) > 0
        ).tolist()
        self.last["pers_client_class_acc"] = cls_acc.tolist()
        out = {
            "pers/acc": float(correct.sum() / max(1, n.sum())),
            "pers/acc_mean": float(acc[has].mean()),
            "pers/acc_std": float(acc[has].std()),
            "pers/acc_present_classes": float(np.nanmean(present_acc)),
        }
        out.update({f"pers/acc_{k}": v for k, v in client_spread(acc[has]).items()})  # over the K' clients
        if "class_sizes" in data.info:  # the long-tailed partition (ECL §4.1): many/medium/few-shot classes
            out.update({f"pers/{g}_acc": v for g, v in shot_accuracy(correct, total, data.counts.sum(0)).items()})
        self.keep_best(t, out["pers/acc"], acc)
        out.update(algo.class_acc_metrics(np.where(total > 0, cls_acc, np.nan)))  # the method's own
        for part, a in designated_class_accuracy(cls_acc, data.info).items():
            self.last[f"pers_client_{part}_acc"] = a.tolist()
            out[f"pers/{part}_acc"] = float(a.mean())
        return out

    def keep_best(self, t: int, pers_acc: float, client_acc: np.ndarray) -> None:
        """The per-client accuracies of the best evaluation so far by ``pers/acc`` (the first of equal ones, as
        :func:`summarize`'s ``best_round``) in ``last`` (``pers_client_acc_best``, round ``pers_best_round``): kept in
        checkpoints with the rest of ``last``, drawn with the last ones in ``client_spread.png``."""
        if "pers_best_round" not in self.last or pers_acc > self.last["pers_best_acc"]:
            self.last.update(pers_best_round=t, pers_best_acc=pers_acc, pers_client_acc_best=client_acc.tolist())

    def spread_figure(self, title: str | None = None):
        """The figure of ``client_spread.png`` (:func:`fedbench.plots.client_spread_figure`) from ``last`` (the clients
        with test samples) and the clients' train sizes now; None without a personalized evaluation."""
        from .plots import client_spread_figure

        last = self.last
        if "pers_client_acc_best" not in last:
            return None
        has = np.array([len(i) > 0 for i in self.data.test_idx])
        best, now = (np.asarray(last[k])[has] for k in ("pers_client_acc_best", "pers_client_acc"))
        sizes = self.data.counts.sum(1)[has]
        return client_spread_figure(best, last["pers_best_round"], now, last["pers_round"], sizes, title)

    def client_model_logits(self, algo, clients, test_idx: list[np.ndarray], t: int) -> list[torch.Tensor] | None:
        """Each client's model (:meth:`Algorithm.client_models`) on its test samples; None if there are no models."""
        if type(algo).client_models is Algorithm.client_models and not self.ctx.fm.eval_uses_batch_stats:
            # every client's model is the global model (FedAvg & co.): one pass over the distinct test samples
            g = algo.global_model()
            return None if g is None else self.shared_model_logits(g, test_idx)
        models = algo.client_models(clients, t)
        return None if models is None else self.ctx.predict(*models, test_idx)

    def shared_model_logits(self, model, idx: list[np.ndarray]) -> list[torch.Tensor]:
        """One model's logits on several clients' (possibly overlapping) test sets, each sample predicted once."""
        p, b = model
        flat = np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64)
        uniq, inverse = np.unique(flat, return_inverse=True)
        logits = self.ctx.predict(
            {k: v.unsqueeze(0) for k, v in p.items()}, {k: v.unsqueeze(0) for k, v in b.items()}, [uniq]
        )[0]
        per = logits[torch.as_tensor(inverse, device=logits.device)]
        return list(torch.split(per, [len(i) for i in idx]))

    def global_model(self, algo) -> dict:
        g = algo.global_model()
        if g is None:
            return {}
        data = self.data
        idx = data.global_test_idx
        if len(idx) == 0:
            return {}
        p, b = g
        logits = self.ctx.predict(
            {k: v.unsqueeze(0) for k, v in p.items()}, {k: v.unsqueeze(0) for k, v in b.items()}, [idx]
        )[0]
        c, tot = confusion_counts(logits, data.y[data.tensor(idx)], data.num_classes)
        class_acc = np.divide(c, tot, out=np.zeros(len(c)), where=tot > 0)
        self.last["global_class_acc"] = class_acc.tolist()
        return {"global/acc": float(c.sum() / max(1, tot.sum())), "global/class_acc": class_acc.tolist()}

    def __call__(self, algo, t: int) -> dict:
        out = {}
        if self.cfg.personalized:
            out.update(self.personalized(algo, t))
        if self.cfg.global_model:
            out.update(self.global_model(algo))
        return out


def summarize(history: list[dict], final_window: int) -> dict:
    """best (max over evaluations) and its round, last, and final: the mean of the last ``final_window`` evaluations
    after training began (round 0, the untrained model, counts only when nothing else was evaluated), with
    ``final_n`` the number of evaluations it averages."""
    out = {}
    keys = sorted({k for h in history for k in h if k.endswith(SUMMARIZED)})
    for k in keys:
        pts = [(h["round"], h[k]) for h in history if isinstance(h.get(k), (int, float))]
        if not pts:
            continue
        rounds, vals = zip(*pts)
        i = int(np.argmax(vals))
        trained = [v for r, v in pts if r > 0] or list(vals)
        window = trained[-final_window:]
        out[k] = {
            "best": float(vals[i]),
            "best_round": int(rounds[i]),
            "final": float(np.mean(window)),
            "final_n": len(window),
            "last": float(vals[-1]),
        }
    return out
