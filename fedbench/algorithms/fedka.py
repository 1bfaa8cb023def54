"""FedKA — Federated Knowledge Anchor (Chen, Zhu, Zheng, arXiv 2312.02416; docs/fedka.md).

Algorithm 1: FedAvg whose clients add β · L_KA to the cross-entropy of every mini-batch (Eq. 3). L_KA keeps
the local model's logits on a tiny per-round *knowledge anchor* T_i^r (Eq. 2: one sample per non-dominant
class from the client's data, the shared sample of S for each missing class; down-sampled to μ) close to
the round-start global model's logits, with the logits of the client's dominant classes discarded (Φ).

BatchNorm: the paper does not say in which mode the logits on T are taken. Both sides use the same one —
eval mode (running statistics), the mode in which a model's knowledge is measured (test accuracy, the
forgetting degree of Eq. 1). Z_g: the round-start global model, once per round. Z_l: the local model with
the running statistics it holds at the start of the step, the anchors in a forward of their own (they
never enter the mini-batch's statistics). So L_KA = 0 while θ_i = θ_g. Nets without BN/dropout: the same
numbers as any other arrangement.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .. import seeding
from ..communication import Traffic, numel
from ..engine.masking import pad_aware
from ..engine.stack import broadcast
from ..errors import ConfigError
from ..files import written
from ..forgetting import DOMINANT, GROUP_NAMES, MISSING, NON_DOMINANT, class_groups
from . import register
from .base import Algorithm
from .local import LocalInputs

SAMPLING = ("random", "hard", "proficient")  # paper §5.7, Table 7: R / H (max loss) / P (min loss)
ANCHOR_CLASSES = ("both", "non_dominant", "missing")  # Table 6: FedKA / KA(N) / KA(M)


def shared_set(labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """S (§4, Def. 2): one random training sample per class (pool indices), fixed for the run; −1 for a class
    without training samples (it can then never be anchored). The paper has clients contribute S; we draw it
    from the global train split with a fixed seed and keep it in its owner's data too."""
    return np.array(
        [rng.choice(np.flatnonzero(labels == c)) if (labels == c).any() else -1 for c in range(num_classes)],
        dtype=np.int64,
    )


def knowledge_anchor_loss(
    z_local: torch.Tensor, z_global: torch.Tensor, kept: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """L_KA (below Eq. 3) = (1/|T|) ||Φ(z_g) − Φ(z_l)||² = (1/|T|) Σ_{a∈T} Σ_{k∉C_d} (z_g[a,k] − z_l[a,k])²: squared
    L2 summed over the kept logits (no mean over the logit dimension), divided by |T|. ``kept`` [C] = 1 for
    non-dominant and missing classes (Φ drops dominant columns); ``mask`` [A] = 1 for real anchors, 0 for
    padding. 0 when T = ∅."""
    sq = (z_global - z_local).pow(2) * kept.unsqueeze(0) * mask.unsqueeze(1)
    return sq.sum() / mask.sum().clamp(min=1)


def pad_anchor(anchor: np.ndarray, slots: int, filler: int) -> tuple[np.ndarray, np.ndarray]:
    """Anchors padded to ``slots`` so that ragged anchor sets stack (vmap); (indices, mask).

    Padding repeats the client's own anchors (the sample ``filler`` if it has none) and is masked out of L_KA; the
    anchors' forward is in eval mode, so padded slots never touch the real anchors' logits."""
    src = anchor if len(anchor) else np.array([filler], dtype=np.int64)
    idx = np.resize(src, slots)
    idx[: len(anchor)] = anchor
    return idx, (np.arange(slots) < len(anchor)).astype(np.float64)


@register
class FedKA(Algorithm):
    """Alg. 1: θ_i ← θ_g; build T_i^r; E epochs of SGD on CE + β·L_KA(T_i^r, θ_g, θ_i); FedAvg aggregation."""

    name = "fedka"
    state_attrs = ("w", "bn")  # S, the class groups and the per-class index tables are static (rebuilt by setup)

    def setup(self):
        hp = self.hp
        num = lambda v: isinstance(v, (int, float)) and np.isfinite(v)  # noqa: E731
        checks = (
            ("gamma", lambda v: num(v) and 0 < v <= 1, "a number in (0, 1]"),
            ("beta", lambda v: num(v) and v >= 0, "a number >= 0"),
            ("mu", lambda v: v is None or (isinstance(v, int) and v >= 1), "null or an integer >= 1"),
            ("sampling", lambda v: v in SAMPLING, "one of " + ", ".join(SAMPLING)),
            ("anchor_classes", lambda v: v in ANCHOR_CLASSES, "one of " + ", ".join(ANCHOR_CLASSES)),
        )
        for key, ok, allowed in checks:
            v = hp.get(key, "<missing>")
            if isinstance(v, bool) or v == "<missing>" or not ok(v):
                raise ConfigError(f"algorithm.{key}", v, allowed)
        self.w, self.bn = self.initial_model()
        self.train_spec = self.train_spec.replace(loss=self.loss)
        self.beta, self.sampling = float(hp.beta), str(hp.sampling)
        C = self.data.num_classes
        labels = self.data.y.cpu().numpy()
        self.S = shared_set(labels[: self.data.n_pool_train], C, seeding.rng(self.seed, "fedka_shared_set"))
        self.slots = min(int(hp.mu), C) if hp.mu is not None else C  # |T_i^r| ≤ min(μ, C)
        self.use = {
            NON_DOMINANT: hp.anchor_classes in ("both", "non_dominant"),
            MISSING: hp.anchor_classes in ("both", "missing"),
        }
        self.data_changed()

    def data_changed(self):
        """C_d / C_n / C_m per client (Def. 1–2, Alg. 1 line 2), Φ's kept columns and the non-dominant classes'
        samples (anchor candidates), from the clients' current data (once; again when a data schedule changes it)."""
        labels = self.data.y.cpu().numpy()
        self.groups = class_groups(self.data.counts, float(self.hp.gamma))
        self.kept = torch.as_tensor(self.groups != DOMINANT, dtype=self.data.x.dtype, device=self.data.x.device)  # Φ
        self.candidates = [
            {c: idx[labels[idx] == c] for c in np.flatnonzero(self.groups[k] == NON_DOMINANT)}
            for k, idx in enumerate(self.data.train_idx)
        ]

    # ---- the knowledge anchor (Alg. 1 lines 5–6) -----------------------------------------------------
    def candidate_losses(self, clients) -> dict:
        """Per-sample CE of the round-start global model on each non-dominant class's samples (§5.7, H / P)."""
        keys = [(int(k), c) for k in clients for c in self.candidates[int(k)]]
        if not keys:
            return {}
        idx = np.concatenate([self.candidates[k][c] for k, c in keys])
        logits = self.ctx.predict(broadcast(self.w, 1), broadcast(self.bn, 1), [idx])[0]
        loss = F.cross_entropy(logits, self.data.y[self.data.tensor(idx)], reduction="none").cpu().numpy()
        return dict(zip(keys, np.split(loss, np.cumsum([len(self.candidates[k][c]) for k, c in keys])[:-1])))

    def knowledge_anchor(self, t: int, k: int, losses: dict) -> tuple[np.ndarray, int, int]:
        """T_k^t as pool indices (class order), and its numbers of non-dominant / missing anchors.

        ψ(c): a sample of non-dominant class c from D_k (random, or max/min global-model loss), the
        shared sample S[c] for a missing class c; then a random subset of μ anchors if |T| > μ."""
        rng = seeding.rng(self.seed, "knowledge_anchor", t, k)
        anchor, kind = [], []
        for c in range(self.data.num_classes):
            g = self.groups[k, c]
            if g == NON_DOMINANT and self.use[NON_DOMINANT]:
                if self.sampling == "random":
                    i = rng.integers(len(self.candidates[k][c]))
                else:  # hard: max loss, proficient: min loss
                    i = (np.argmax if self.sampling == "hard" else np.argmin)(losses[k, c])
                anchor.append(self.candidates[k][c][i])
            elif g == MISSING and self.use[MISSING] and self.S[c] >= 0:
                anchor.append(self.S[c])
            else:
                continue
            kind.append(g)
        anchor, kind = np.asarray(anchor, dtype=np.int64), np.asarray(kind)
        if len(anchor) > self.slots:  # down-sample to μ, resampled every round
            keep = np.sort(rng.choice(len(anchor), self.slots, replace=False))
            anchor, kind = anchor[keep], kind[keep]
        return anchor, int((kind == NON_DOMINANT).sum()), int((kind == MISSING).sum())

    # ---- one round ---------------------------------------------------------------------------------------
    def round(self, t, clients):
        m = len(clients)
        losses = self.candidate_losses(clients) if self.sampling != "random" else {}
        built = [self.knowledge_anchor(t, int(k), losses) for k in clients]
        filler = int(self.S[self.S >= 0][0])
        padded = [pad_anchor(a, self.slots, filler) for a, _, _ in built]
        idx = np.stack([p[0] for p in padded])  # [m, A]
        x = self.data.x
        # Z_g: the global model's logits on the anchors, once per round, eval mode (like Z_l in loss), no grad
        z_g = self.ctx.predict(broadcast(self.w, 1), broadcast(self.bn, 1), [idx.reshape(-1)])[0]
        ctx = {
            "anchor_x": x[self.data.tensor(idx)],
            "anchor_mask": torch.as_tensor(np.stack([p[1] for p in padded]), dtype=x.dtype, device=x.device),
            "anchor_logits": z_g.reshape(m, self.slots, -1),
            "kept": self.kept[clients.long().to(x.device)],
        }
        res = self.local_train(
            t, clients, (broadcast(self.w, m), broadcast(self.bn, m)), self.train_spec, LocalInputs(ctx=ctx)
        )
        self.w = self.aggregate(res.params, clients)  # θ_g ← Σ |D_i| θ_i / Σ |D_j| over participants
        self.bn = self.aggregate(res.buffers, clients)
        sizes = np.array([[len(a), n, mm] for a, n, mm in built], dtype=float)
        return {
            "train/loss": res.loss.mean().item(),
            "fedka/anchor_size": sizes[:, 0].mean(),
            "fedka/anchor_non_dominant": sizes[:, 1].mean(),
            "fedka/anchor_missing": sizes[:, 2].mean(),
        }

    @pad_aware
    def loss(self, fm, p, b, x, y, ctx):
        """Eq. 3: CE(θ_i; B) + β · L_KA(T_i^r, θ_g^r, θ_i^r). Z_l = the local model's eval-mode logits on T with
        the running statistics of the step's start (a copy: the batch's train-mode forward updates them in place),
        as Z_g was taken (module docstring)."""
        fm.set_mode(False)
        try:
            z_l = fm(p, {k: v.clone() for k, v in b.items()}, ctx["anchor_x"])
        finally:
            fm.set_mode(True)
        ka = knowledge_anchor_loss(z_l, ctx["anchor_logits"], ctx["kept"], ctx["anchor_mask"])
        return F.cross_entropy(fm(p, b, x), y) + self.beta * ka

    def traffic(self, t, clients):
        """FedAvg's (the model both ways, FedKA Alg. 1) and, in round 1, the shared set S sent once to all K clients
        (one input per class, §4 Def. 2; as fp32 inputs)."""
        model = Traffic.both_ways(clients, numel(self.w, self.bn))
        if t != 1:
            return model
        per_input = self.data.x[0].numel()
        return model + Traffic(0, self.K * int((self.S >= 0).sum()) * per_input)

    def global_model(self):
        return self.w, self.bn

    def finish(self, run_dir):
        """Write the static class grouping (0 dominant, 1 non-dominant, 2 missing) and its mean sizes."""
        with written(run_dir / "fedka_class_groups.csv") as path:
            np.savetxt(path, self.groups, fmt="%d", delimiter=",", header=",".join(self.data.classes), comments="")
        per_client = {name: float((self.groups == g).sum(1).mean()) for g, name in enumerate(GROUP_NAMES)}
        return {"fedka_classes_per_client": per_client}


__all__ = ["FedKA", "knowledge_anchor_loss", "shared_set", "pad_anchor"]
