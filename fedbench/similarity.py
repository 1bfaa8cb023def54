"""FedReMa's relevance diagnostics (Liang et al., ECAI 2024) beside ANY method: the soft-logit similarity S^(t) of the
round's trained local heads (Eq. 5), the MDS relevant sets A_k and gaps Δs*_k (Alg. 1) and their mean Δs̄_t (Eq. 8).
The paper's Figure 3 shows S^(t) while training FedAvg at t = 1, 50, 100, 150 (conf/experiment/fedrema/figure3.yaml).

Switched on by ``eval.similarity.enabled`` (conf/config.yaml); the run loop calls :meth:`SimilarityMonitor.before_round`
/ :meth:`after_round`. The local models are the last phase-"train" result of ``Algorithm.local_train`` in the round
(as for fedbench/forgetting.py). S, MDS and the probes are FedReMa's own functions (fedbench/algorithms/fedrema.py), so
beside FedReMa with the same options the monitor sees exactly what FedReMa sees.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from omegaconf import OmegaConf

from .algorithms.fedrema import mds, round_probes, soft_logit_similarity
from .checks import boolean, int_at_least, number
from .context import Context
from .errors import ConfigError
from .files import written

DIR = "head_similarity"


def draw_similarity_panels(panels: list[tuple[int, np.ndarray]], path, title: str):
    """One PNG with a heatmap of S per round (rows: client k, columns: client j), one shared colour scale, integer
    client ticks — the layout of FedReMa's Figure 3."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from . import plots  # (selects the Agg backend)

    n = len(panels)
    lo = min(float(np.nanmin(S)) for _, S in panels)
    fig, axes = plt.subplots(1, n, figsize=(max(plots.MIN_WIDTH_IN, 3.6 * n + 1.2), 3.9), squeeze=False)
    for ax, (t, S) in zip(axes[0], panels):
        im = ax.imshow(S, cmap="viridis", vmin=lo, vmax=1.0, interpolation="nearest")
        ax.set_title(f"t = {t}")
        ax.set_xlabel("client j")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(integer=True, nbins=min(S.shape[0], 10)))
    axes[0][0].set_ylabel("client k")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.85, label="s_kj (Eq. 5)")
    fig.suptitle(title, fontsize=10)
    try:
        with written(path):
            fig.savefig(path, dpi=plots.DPI)  # not cropped: >= 1000 px wide
    finally:
        plt.close(fig)
    return path


class SimilarityMonitor:
    """Every ``every`` rounds (and after the last): S over the round's clients, their MDS sets and Δs̄ as metrics
    (``similarity/mean_max_diff``, ``similarity/relevant_set_size_mean``, ``similarity/relevant_set_sizes`` by client
    id, 0 = not sampled). In the rounds of ``save_rounds``: ``diagnostics/head_similarity/round_<t>.npz`` (S, relevant
    sets, Δs*_k; NaN/False rows and columns = clients not sampled) and ``figure.png`` redrawn with all saved rounds."""

    def __init__(self, ctx: Context, cfg):
        """``ctx``: the run's context (its model, data, run dir, pictures; seed, rounds and names from ``ctx.cfg``),
        whose ``observers`` hear the local models; ``cfg``: the ``eval.similarity`` node."""
        checks = {
            "every": int_at_least(1),
            "temperature": number(0, lo_open=True),
            "probe_scale": number(0, lo_open=True),
            "symmetric_temperature": boolean(),
            "ignore_self_gap": boolean(),
        }
        for key, (ok, allowed) in checks.items():
            v = OmegaConf.select(cfg, key, default="<missing>")
            if v == "<missing>" or not ok(v):
                raise ConfigError(f"eval.similarity.{key}", v, allowed)
        rounds = OmegaConf.select(cfg, "save_rounds")
        if not OmegaConf.is_list(rounds) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in rounds
        ):
            raise ConfigError("eval.similarity.save_rounds", rounds, "a list of rounds >= 1, e.g. [1, 50, 100, 150]")
        late = sorted(r for r in set(rounds) if r > int(ctx.cfg.rounds))
        if late:  # a line, not a refusal: a sweep over rounds may share one list (and the docs' smoke runs shorten it)
            print(f"fedbench: eval.similarity.save_rounds {late} are after the last round (rounds={ctx.cfg.rounds}): "
                  "never saved", file=sys.stderr)  # fmt: skip
        net = ctx.fm.net
        self.head_names = ctx.fm.names("head")
        if not self.head_names:
            raise ConfigError(
                "eval.similarity.enabled", True, f"a model with a head (model={ctx.cfg.model.name} has none)"
            )
        self.head_bufs = [n for n in ctx.fm.buffer_names if net.part_of(n, "head")]
        self.ctx, self.dim, self.K = ctx, net.feature_dim, ctx.data.num_clients
        self.every, self.save_rounds, self.rounds = int(cfg.every), sorted(set(rounds)), int(ctx.cfg.rounds)
        self.temperature, self.probe_scale = float(cfg.temperature), float(cfg.probe_scale)
        self.symmetric, self.ignore_self_gap = bool(cfg.symmetric_temperature), bool(cfg.ignore_self_gap)
        self.dir = ctx.out_dir / "diagnostics" / DIR
        self.keep, self.local = False, None  # local: (t, client ids, LocalResult) of the round's local models
        ctx.observers.append(self.observe)

    def observe(self, t: int, clients: list[int], res, phase: str) -> None:
        """After every ``local_train`` call: keep the round's last phase-"train" result while asked to."""
        if self.keep and phase == "train":
            self.local = (t, clients, res)

    def due(self, t: int) -> bool:
        return t % self.every == 0 or t == self.rounds or t in self.save_rounds

    def before_round(self, algo, t: int) -> None:
        """Keep the round's local models (:meth:`observe`) when the round is due."""
        self.keep, self.local = self.due(t), None

    def after_round(self, algo, t: int) -> dict:
        """S, MDS and Δs̄ of the round's trained heads."""
        local, self.keep, self.local = self.local, False, None
        if local is None:
            return {}
        _, ids, res = local
        clients = torch.as_tensor(ids)
        heads = {n: res.params[n] for n in self.head_names}
        bufs = {n: res.buffers[n] for n in self.head_bufs}
        x = self.ctx.data.x
        probes = round_probes(self.ctx.cfg.seed, t, self.K, self.dim, self.probe_scale, clients, x.dtype).to(x.device)
        with torch.no_grad():
            S = soft_logit_similarity(self.ctx.fm, heads, bufs, probes, self.temperature, self.symmetric)  # Eq. 5
        A, gaps = mds(S, self.ignore_self_gap)  # Alg. 1
        sizes = np.zeros(self.K, dtype=np.int64)
        sizes[ids] = A.sum(1).cpu().numpy()
        if t in self.save_rounds:
            self.save(t, ids, S, A, gaps)
        return {
            "similarity/mean_max_diff": float(gaps.double().mean()),  # Δs̄ (Eq. 8, a mean)
            "similarity/relevant_set_size_mean": float(A.sum(1).double().mean()),
            "similarity/relevant_set_sizes": sizes.tolist(),
        }

    def save(self, t: int, ids: list[int], S, A, gaps) -> None:
        full_S = np.full((self.K, self.K), np.nan)
        full_S[np.ix_(ids, ids)] = S.double().cpu().numpy()
        full_A = np.zeros((self.K, self.K), dtype=bool)
        full_A[np.ix_(ids, ids)] = A.cpu().numpy()
        full_gaps = np.full(self.K, np.nan)
        full_gaps[ids] = gaps.double().cpu().numpy()
        self.dir.mkdir(parents=True, exist_ok=True)
        with written(self.dir / f"round_{t:05d}.npz") as path:
            np.savez(path, S=full_S, relevant=full_A, max_diff=full_gaps)
        panels = [(int(p.stem.split("_")[1]), np.load(p)["S"]) for p in sorted(self.dir.glob("round_*.npz"))]
        cfg = self.ctx.cfg
        name = f"{cfg.algorithm.name} | {cfg.dataset.name} | {cfg.partition.name}"
        png = draw_similarity_panels(
            panels, self.dir / "figure.png", f"soft-logit similarity S^(t) of the local heads ({name})"
        )
        self.ctx.publish("head_similarity", png, t)


__all__ = ["SimilarityMonitor", "draw_similarity_panels"]
