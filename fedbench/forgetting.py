"""Class-wise forgetting degree τ (FedKA, Chen et al. 2023, §3.1 Eq. 1) — a diagnostic for any method
whose clients train local models from a global model (FedAvg, FedProx, FedKA, ...).

    τ_{i,r}^k = (acc(θ_g^r; k) − acc(θ_i^r; k)) / (acc(θ_g^r; k) + ξ)

acc(θ; k) = accuracy on the global test set restricted to class k; θ_g^r = the round-start global
model, θ_i^r = client i's model after its local training in round r. τ > 0: client i forgot class k
during local training; τ < 0: it improved. Classes are grouped per client (FedKA Def. 1–2) into
dominant (n_i^k/n_i ≥ γ), non-dominant (0 < n_i^k/n_i < γ) and missing (n_i^k = 0).

Switched on by ``eval.forgetting.enabled`` (conf/config.yaml); the run loop calls
:meth:`ForgettingMonitor.before_round` / :meth:`after_round`. The local models are the last
phase-"train" result of ``Algorithm.local_train`` in the round (heard as an observer of the run's context).
"""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf

from .context import Context
from .engine.stack import clone
from .errors import ConfigError
from .files import written

DOMINANT, NON_DOMINANT, MISSING = 0, 1, 2
GROUP_NAMES = ("dominant", "non_dominant", "missing")


def class_groups(counts, gamma: float) -> np.ndarray:
    """[K, C] class type per client (FedKA Def. 1–2): DOMINANT if n_i^k/n_i ≥ γ, NON_DOMINANT if
    0 < n_i^k/n_i < γ, MISSING if n_i^k = 0."""
    counts = np.asarray(counts, dtype=np.float64)
    n = counts.sum(1, keepdims=True)
    share = np.divide(counts, n, out=np.zeros_like(counts), where=n > 0)
    groups = np.where(share >= gamma, DOMINANT, NON_DOMINANT)
    return np.where(counts == 0, MISSING, groups).astype(np.int64)


def forgetting_degree(acc_global, acc_local, xi: float) -> np.ndarray:
    """Eq. 1: τ[i, k] = (acc_global[k] − acc_local[i, k]) / (acc_global[k] + ξ); shapes [C], [M, C] -> [M, C]."""
    g = np.asarray(acc_global, dtype=np.float64)
    return (g[None, :] - np.asarray(acc_local, dtype=np.float64)) / (g[None, :] + xi)


def group_means(acc_global, acc_local, groups) -> dict:
    """{type: (mean acc_g, mean acc_l)} over the type's (client, class) cells of the participants (clients with NaN
    rows, absent this round, left out; types without cells too): the absolute accuracies behind τ_type."""
    g = np.broadcast_to(np.asarray(acc_global, dtype=np.float64)[None, :], np.shape(acc_local))
    local = np.asarray(acc_local, dtype=np.float64)
    out = {}
    for k, name in enumerate(GROUP_NAMES):
        cells = (np.asarray(groups) == k) & np.isfinite(local)
        if cells.any():
            out[name] = (float(g[cells].mean()), float(local[cells].mean()))
    return out


def group_forgetting(acc_global, acc_local, groups, xi: float) -> dict:
    """τ per class type: Eq. 1 applied to the type's mean class accuracy over its (client, class) cells
    (:func:`group_means`), τ_type = (mean acc_g − mean acc_l) / (mean acc_g + ξ). The paper defines τ per class only
    (Eq. 1, ξ "for numerical stability"); a plain mean of per-cell τ is swamped by a class the global model gets wholly
    wrong (acc_g = 0: τ = −acc_l/ξ ≈ −10⁸), while here such a class simply adds nothing to the denominator."""
    return {name: (mg - ml) / (mg + xi) for name, (mg, ml) in group_means(acc_global, acc_local, groups).items()}


def draw_forgetting(tau, groups, path, title: str):
    """Heatmap rows = clients, columns = classes (red = forgotten, blue = improved); class type
    marked per cell: D = dominant, N = non-dominant, M = missing (dots/crosses on large matrices)."""
    import matplotlib.pyplot as plt

    from . import plots  # (selects the Agg backend)

    h, w = tau.shape
    fig, ax = plt.subplots(figsize=(min(14, 2.0 + 0.5 * w), min(12, 1.5 + 0.4 * h)))
    im = ax.imshow(np.clip(tau, -1, 1), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    fig.colorbar(im, ax=ax, label="forgetting degree τ (clipped to [-1, 1])")
    if h * w <= 400:
        for i in range(h):
            for j in range(w):
                v = tau[i, j]
                v = "" if not np.isfinite(v) else ("\n<-1" if v < -1 else f"\n{v:.2f}")
                ax.text(
                    j,
                    i,
                    "DNM"[groups[i, j]] + v,
                    ha="center",
                    va="center",
                    fontsize=6,
                    color=plots.text_colour(
                        im.cmap(im.norm(np.clip(tau[i, j], -1, 1) if np.isfinite(tau[i, j]) else 0))
                    ),
                )
    else:
        for g, marker in ((DOMINANT, "o"), (MISSING, "x")):
            ii, jj = np.nonzero(groups == g)
            ax.scatter(jj, ii, s=4, marker=marker, c="k", linewidths=0.5, label=GROUP_NAMES[g])
        ax.legend(loc="upper right", fontsize=6)
    ax.set_title(title + "  (D dominant, N non-dominant, M missing)", fontsize=9)
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    plots.integer_ticks(ax, x=True, y=True)
    return plots.save(fig, path)


def draw_trace(rows: np.ndarray, path):
    """FedKA Fig. 3: τ of each scheduled (client, class) over the rounds (drawn clipped to [−1, 1], as the heatmap;
    trace.csv keeps the values), with its number of samples."""
    import matplotlib.pyplot as plt

    from . import plots  # (selects the Agg backend)

    fig, ax = plt.subplots(figsize=(plots.MIN_WIDTH_IN, 3.8))
    right = ax.twinx()
    for k, c in sorted({(int(r[1]), int(r[2])) for r in rows}):
        sel = rows[(rows[:, 1] == k) & (rows[:, 2] == c)]
        (line,) = ax.plot(sel[:, 0], np.clip(sel[:, 4], -1, 1), marker=".", label=f"client {k}, class {c}: τ")
        right.step(sel[:, 0], sel[:, 3], where="post", ls="--", color=line.get_color(), alpha=0.6)
    ax.set_xlabel("round")
    ax.set_ylabel("forgetting degree τ (clipped to [-1, 1])")
    ax.set_ylim(-1.05, 1.05)
    right.set_ylabel("samples (dashed)")
    ax.legend(fontsize=7)
    plots.integer_ticks(ax)
    return plots.save(fig, path)


class ForgettingMonitor:
    """Per-round τ for every participating client × class; τ per class type (:func:`group_forgetting`) as
    metrics (``forgetting/dominant|non_dominant|missing``), the [K, C] matrix (NaN rows = clients that did
    not train this round) saved as ``diagnostics/forgetting/round_<t>.npy``, a heatmap every
    ``draw_every`` rounds."""

    def __init__(self, ctx: Context, cfg, schedule=None):
        """``ctx``: the run's context (its data, predictions, run dir, pictures; rounds from ``ctx.cfg``), whose
        ``observers`` hear the local models; ``cfg``: the ``eval.forgetting`` node; ``schedule``: the run's
        :class:`~fedbench.data.schedule.DataSchedule` (``trace.csv`` of its shrinking classes) or None."""
        for key, ok, allowed in (
            ("every", lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
            ("draw_every", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 (0 = never)"),
            ("gamma", lambda v: isinstance(v, (int, float)) and 0 < v <= 1, "a number in (0, 1]"),
            ("xi", lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
        ):
            v = OmegaConf.select(cfg, key)
            if not ok(v) or isinstance(v, bool):
                raise ConfigError(f"eval.forgetting.{key}", v, allowed)
        self.ctx, self.schedule = ctx, schedule
        self.every, self.draw_every = int(cfg.every), int(cfg.draw_every)
        self.xi = float(cfg.xi)
        self.gamma = float(cfg.gamma)
        self.groups = class_groups(ctx.data.counts, self.gamma)
        self.rounds = int(ctx.cfg.rounds)
        self.dir = ctx.out_dir / "diagnostics" / "forgetting"
        self.global_start = None
        self.keep, self.local = False, None  # local: (t, client ids, LocalResult) of the round's local models
        ctx.observers.append(self.observe)

    def observe(self, t: int, clients: list[int], res, phase: str) -> None:
        """After every ``local_train`` call: keep the round's last phase-"train" result while asked to."""
        if self.keep and phase == "train":
            self.local = (t, clients, res)

    def write_trace(self, schedule, t: int, draw: bool) -> None:
        """``trace.csv`` (round, client, class, samples, τ) of the scheduled cells over the rounds computed so far,
        rebuilt from the saved matrices (so a resumed run writes the same file); ``trace.png`` when ``draw``."""
        rows = []
        for r in range(1, t + 1):
            f = self.dir / f"round_{r:05d}.npy"
            if f.exists():
                tau = np.load(f)
                rows += [[r, k, c, schedule.size(k, c, r), tau[k, c]] for k, c in sorted(schedule.order)]
        rows = np.array(rows, dtype=np.float64).reshape(-1, 5)
        with written(self.dir / "trace.csv") as path:
            np.savetxt(
                path,
                rows,
                fmt=["%d", "%d", "%d", "%d", "%.10g"],
                delimiter=",",
                header="round,client,class,samples,tau",
                comments="",
            )
        if draw and len(rows):
            self.ctx.publish("forgetting_trace", draw_trace(rows, self.dir / "trace.png"), t)

    def data_changed(self, t: int) -> None:
        """The clients' data changed before round t (data schedule): regroup the classes, keep the new grouping."""
        self.groups = class_groups(self.ctx.data.counts, self.gamma)
        self.dir.mkdir(parents=True, exist_ok=True)
        with written(self.dir / f"class_groups_round_{t:05d}.npy") as path:
            np.save(path, self.groups)

    def due(self, t: int) -> bool:
        return t % self.every == 0 or t == self.rounds

    def before_round(self, algo, t: int) -> None:
        """Snapshot θ_g^r (the round-start global model) and keep the round's local models (:meth:`observe`)."""
        g = algo.global_model() if self.due(t) else None
        self.global_start = None if g is None else (clone(g[0]), clone(g[1]))
        self.keep, self.local = self.global_start is not None, None

    def class_accuracy(self, params, buffers) -> np.ndarray:
        """[M, C] per-class accuracy of M stacked models on the global test set."""
        from .metrics import class_counts

        data = self.ctx.data
        idx = data.global_test_idx
        y = data.y[data.tensor(idx)]
        logits = self.ctx.predict(params, buffers, [idx] * len(next(iter(params.values()))))
        counts = torch.stack([class_counts(z, y, data.num_classes) for z in logits]).cpu().numpy()  # one read
        return np.stack([np.divide(c, tot, out=np.zeros(len(c)), where=tot > 0) for c, tot in counts])

    def after_round(self, algo, t: int) -> dict:
        local, self.keep, self.local = self.local, False, None
        if self.global_start is None or local is None:
            return {}
        _, clients, res = local
        p, b = self.global_start
        acc_g = self.class_accuracy(
            {k: v.unsqueeze(0) for k, v in p.items()}, {k: v.unsqueeze(0) for k, v in b.items()}
        )[0]
        acc_l = np.full(self.groups.shape, np.nan)
        acc_l[clients] = self.class_accuracy(res.params, res.buffers)
        tau = forgetting_degree(acc_g, acc_l, self.xi)
        self.global_start = None
        self.dir.mkdir(parents=True, exist_ok=True)
        with written(self.dir / f"round_{t:05d}.npy") as path:
            np.save(path, tau)
        if not (self.dir / "class_groups.npy").exists():
            with written(self.dir / "class_groups.npy") as path:
                np.save(path, self.groups)
        draw = self.draw_every and (t % self.draw_every == 0 or t == self.rounds)
        if draw:
            png = draw_forgetting(tau, self.groups, self.dir / f"round_{t:05d}.png", f"forgetting degree τ, round {t}")
            self.ctx.publish("forgetting", png, t)
        if self.schedule is not None:  # Fig. 3: τ of the shrinking classes over rounds
            self.write_trace(self.schedule, t, draw=t == self.rounds)
        means = {  # the absolute accuracies behind τ (τ is relative to the global model's own accuracy)
            f"forgetting/{k}_{who}_acc": v
            for k, pair in group_means(acc_g, acc_l, self.groups).items()
            for who, v in zip(("global", "local"), pair)
        }
        return {
            **{f"forgetting/{k}": v for k, v in group_forgetting(acc_g, acc_l, self.groups, self.xi).items()},
            **means,
        }


__all__ = [
    "DOMINANT",
    "NON_DOMINANT",
    "MISSING",
    "GROUP_NAMES",
    "class_groups",
    "forgetting_degree",
    "group_forgetting",
    "group_means",
    "draw_forgetting",
    "draw_trace",
    "ForgettingMonitor",
]
