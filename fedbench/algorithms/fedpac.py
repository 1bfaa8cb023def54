"""FedPAC (Xu, Tong, Huang, ICLR 2023): personalized FL with feature alignment and classifier collaboration.

Baseline of FedReMa Tables 1, 2, 4, FedKA Table 9 (docs/pfl_baselines_b.md).
Read with the official code ``JianXu95/FedPAC`` (methods/fedpac.py,
tools.py, running.py) and PFLlib's clientpac/serverpac (FedReMa's code base). Round t, clients k (Alg. 1):

1. statistics of the received model (global representation θ + own head φ_k) on the local train set
   (code ``statistics_extraction``): class priors π_k(c), class feature means μ_k(c), the head-independent
   terms H_k(c) = π_k(c) μ_k(c) and V_k = (Σ_c π_k(c) E[‖f‖² | c] − Σ_c ‖π_k(c) μ_k(c)‖²) / n_k;
2. local training (§4.1): the head with the representation frozen (``head_epochs``, CE), then the
   representation with the head frozen (E epochs, CE + λ·MSE(f(x), c_y)) — c = the server's class
   centroids of the previous round (a class without one: the client's own class mean from step 1); no
   alignment in the first round (nothing to align to yet);
3. server: θ ← n_k-weighted average; centroids c_y ← Σ_k n_{k,y} μ'_k(y) / Σ_k n_{k,y} from the trained
   models (§4.1, code ``protos_aggregation``); heads (§4.2, code ``get_head_agg_weight``): for every client i
   the quadratic program  min_α α^T (diag(V) + D_i) α  s.t. α ≥ 0, Σ_j α_j = 1  with
   D_i[j, j'] = Σ_c ⟨H_i(c) − H_j(c), H_i(c) − H_j'(c)⟩ (the estimated test loss of the combined head:
   variance + bias), solved by a real QP solver for every client every round; φ_i ← Σ_j α_ij φ̂_j.

"Feature" f(x) is the input of the personal head: ``head_scope: classifier`` (official code: the last
Linear is the head, f = its input) or ``head`` (the model's whole head, fedbench's ``fm.head``; FedReMa's
PFLlib fork treats all FC layers as the head for every method).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits
from torch.func import functional_call

from ..checks import int_at_least, number, one_of
from ..communication import Traffic, numel
from ..engine.masking import pad_aware
from ..engine.stack import broadcast, mix, rows, select, set_rows, weighted_mean
from ..errors import ConfigError
from ..losses import prototype_alignment
from ..prototypes import class_means, client_outputs
from . import register
from .base import Algorithm
from .local import LocalInputs, LocalSpec


# ---- the server's quadratic program (§4.2) -----------------------------------------------------------
def feature_statistics(means: torch.Tensor, counts: torch.Tensor, sq_norms: torch.Tensor):
    """(V [M], H [M, C, d]) of §4.2 from class means μ [M, C, d], counts n_{k,c} [M, C] and E[‖f‖² | c] [M, C]:
    π = n_{k,c}/n_k, H = π μ, V = (Σ_c π E‖f‖² − Σ_c ‖π μ‖²) / n_k (code ``statistics_extraction``)."""
    n = counts.sum(1, keepdim=True).clamp(min=1)
    prior = counts / n
    H = prior.unsqueeze(-1) * means
    V = ((prior * sq_norms).sum(1) - (H**2).sum((1, 2))) / n.squeeze(1)
    return V, H


def simplex_qp(P: np.ndarray) -> np.ndarray | None:
    """argmin_α α^T P α over the probability simplex (P symmetric PSD), by SciPy's SLSQP with the exact
    gradient; None if the solver fails. P is scaled to max|P| = 1 first (same argmin, better conditioning)."""
    m = len(P)
    scale = float(np.abs(P).max())
    if scale == 0.0:
        return np.full(m, 1.0 / m)
    from scipy.optimize import minimize  # (here: importing it costs ~0.6 s in every process that lists the methods)

    Q = P / scale
    res = minimize(
        lambda a: a @ Q @ a,
        np.full(m, 1.0 / m),
        jac=lambda a: 2.0 * Q @ a,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * m,
        constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0, "jac": lambda a: np.ones_like(a)}],
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    return np.clip(res.x, 0.0, None) if res.success else None


def bias_matrix(H: torch.Tensor, i: int, outer: bool = False) -> torch.Tensor:
    """D_i [M, M], D_i[j, j'] = Σ_c ⟨H_i(c) − H_j(c), H_i(c) − H_j'(c)⟩: one Gram matrix of Δ_j = vec(H_i − H_j);
    ``outer``: the official code's arithmetic, trace(Σ_c (H_i(c) − H_j(c)) (H_i(c) − H_j'(c))^T) with one d×d
    matrix per pair and class (same numbers, O(M² C d²) instead of O(M² C d): its runtime)."""
    delta = H[i].unsqueeze(0) - H  # [M, C, d]
    if not outer:
        flat = delta.flatten(1)
        return flat @ flat.T
    m, C, d = delta.shape
    D = torch.zeros(m, m, dtype=H.dtype)
    for j1 in range(m):
        for j2 in range(j1, m):
            acc = torch.zeros(d, d, dtype=H.dtype)
            for c in range(C):
                acc += torch.mm(delta[j1, c].reshape(d, 1), delta[j2, c].reshape(1, d))
            D[j1, j2] = D[j2, j1] = torch.trace(acc)
    return D


def combination_weights(
    V: torch.Tensor, H: torch.Tensor, eig_floor: float = 0.01, prune: float = 1e-3, outer: bool = False
) -> tuple[torch.Tensor, int]:
    """Head-combination weights A [M, M] (row i: client i's α over the M clients) and the number of failed solves.

    Row i solves the QP of §4.2 with P_i = diag(V) + D_i (:func:`bias_matrix`). As in the official code: a P_i
    with a negative eigenvalue (round-off) is rebuilt from its eigenpairs with eigenvalue ≥ ``eig_floor``;
    weights < ``prune`` are zeroed and the rest renormalised (``agg_classifier_weighted_p``); a failed solve
    keeps the own head.
    """
    m = len(V)
    H = H.double().cpu()
    v = V.double().cpu()
    A = torch.zeros(m, m, dtype=torch.float64)
    failed = 0
    # M x M matrices: one BLAS thread is fastest, and NumPy's BLAS pool ignores torch.set_num_threads (on a busy
    # machine an oversubscribed pool made these solves ~80x slower)
    with threadpool_limits(limits=1, user_api="blas"):
        for i in range(m):
            P = (torch.diag(v) + bias_matrix(H, i, outer)).numpy()
            P = (P + P.T) / 2
            lam, U = np.linalg.eigh(P)
            if lam.min() < 0:
                P = (U * np.where(lam >= eig_floor, lam, 0.0)) @ U.T
            alpha = simplex_qp(P)
            if alpha is None or alpha.sum() <= 0:
                A[i, i], failed = 1.0, failed + 1
                continue
            kept = np.where(alpha > prune, alpha, 0.0)
            alpha = kept if kept.sum() > 0 else alpha
            A[i] = torch.from_numpy(alpha / alpha.sum())
    return A, failed


def weighted_centroids(means: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """c_y = Σ_k n_{k,y} μ_k(y) / Σ_k n_{k,y} (§4.1, code ``protos_aggregation``) -> (c [C, d], has [C])."""
    tot = counts.sum(0)
    c = (counts.unsqueeze(-1) * means).sum(0) / tot.clamp(min=1).unsqueeze(-1)
    return c, tot > 0


# ---- the split into feature extractor f and personal head -------------------------------------------------
class FeatureSplit:
    """``features(p, b, x)`` = f(x), the input of the personal head, and ``head(p, b, h)``; pure (vmap-safe).

    ``scope="head"``: f = ``fm.features`` (the model's body). ``scope="classifier"``: the head's layers
    before its final Linear belong to f (FedPAC's code: f = input of the last Linear).
    """

    def __init__(self, fm, scope: str):
        self.fm, self.scope = fm, scope
        net = fm.net
        if scope == "classifier":
            last = len(net.head) - 1
            if net.classifier != f"head.{last}":
                raise ConfigError("algorithm.head_scope", scope, "head (the classifier is not the head's last layer)")
            self.pre, self.last, self.last_key = net.head[:-1], net.head[-1], f"head.{last}."
            self.pre_p = [n for n, _ in self.pre.named_parameters()]
            self.pre_b = [n for n, _ in self.pre.named_buffers()]
        self.personal = fm.names(scope)
        self.personal_buffers = [n for n in fm.buffer_names if net.part_of(n, scope)]

    def features(self, p, b, x):
        h = self.fm.features(p, b, x)
        if self.scope == "head":
            return h
        return functional_call(
            self.pre, ({n: p["head." + n] for n in self.pre_p}, {n: b["head." + n] for n in self.pre_b}), (h,)
        )

    def head(self, p, b, h):
        if self.scope == "head":
            return self.fm.head(p, b, h)
        k = self.last_key
        return functional_call(self.last, {n[len(k) :]: v for n, v in p.items() if n.startswith(k)}, (h,))


# ---- the algorithm -------------------------------------------------------------------------------------
@register
class FedPAC(Algorithm):
    """Alg. 1 of the paper. State: shared representation θ, personal heads φ_k, class centroids c."""

    name = "fedpac"
    state_attrs = ("theta", "theta_buf", "phi", "phi_buf", "centroids", "has_centroid")

    def setup(self):
        for key, check in (
            ("lam", number(0)),
            ("head_epochs", int_at_least(0)),
            ("head_lr", number(0, lo_open=True)),
            ("head_scope", one_of("classifier", "head")),
            ("eig_floor", number(0)),
            ("prune", number(0, 1, hi_open=True)),
            ("bias_term", one_of("gram", "outer")),
        ):
            self.checked_hp(key, check)
        self.split = FeatureSplit(self.fm, self.hp.head_scope)
        self.personal, self.personal_buf = self.split.personal, self.split.personal_buffers
        if not self.personal:
            raise ConfigError("model", self.cfg.model.name, "a model with a head (FedPAC's personal classifier)")
        self.shared = [n for n in self.fm.param_names if n not in self.personal]
        self.shared_buf = [n for n in self.fm.buffer_names if n not in self.personal_buf]
        w, bn = self.initial_model()
        self.theta, self.theta_buf = select(w, self.shared), select(bn, self.shared_buf)  # θ, global
        self.phi = broadcast(select(w, self.personal), self.K)  # φ_k, personal
        self.phi_buf = broadcast(select(bn, self.personal_buf), self.K)
        x = self.data.x
        self.fm.set_mode(False)
        with torch.no_grad():
            d = self.split.features(w, bn, x[:1]).flatten(1).shape[1]  # feature width (eval mode: BN-safe)
        self.fm.set_mode(True)
        self.centroids = torch.zeros(self.data.num_classes, d, dtype=x.dtype, device=x.device)  # c (none yet)
        self.has_centroid = torch.zeros(self.data.num_classes, dtype=torch.bool, device=x.device)
        # local training (Alg. 1): the head first (representation frozen), then the representation (head frozen)
        self.head_spec = LocalSpec(
            "fedpac_head",
            trainable=self.personal,
            epochs=int(self.hp.head_epochs),
            opt=self.opt.replace(lr=float(self.hp.head_lr)),
            persist_opt_state=bool(self.cfg.optim.persistent_state),
        )
        body = self.train_spec.replace(trainable=self.shared)
        self.body_specs = {True: body.replace(loss=self.aligned_loss), False: body.replace(loss=self.plain_loss)}

    def round(self, t, clients):
        hp, m = self.hp, len(clients)
        n = self.n[clients.long()]
        params = {**broadcast(self.theta, m), **rows(self.phi, clients)}
        buffers = {**broadcast(self.theta_buf, m), **rows(self.phi_buf, clients)}
        # 1. statistics of the received model, uploaded with the model (code: before local training)
        means0, counts, sq0 = self.class_statistics(clients, params, buffers)
        V, H = feature_statistics(means0, counts, sq0)
        # 2. local training: head first (representation frozen), then the representation (head frozen)
        metrics = {}
        if int(hp.head_epochs) > 0:
            first = self.local_train(t, clients, (params, buffers), self.head_spec)
            params, buffers = first.params, first.buffers
            metrics["train/loss_head_phase"] = first.loss.mean().item()
        aligned = bool(self.has_centroid.any()) and float(hp.lam) > 0
        ctx = {}
        if aligned:  # c_y, or the client's own pre-training class mean where the server has none (code)
            has_local = counts > 0
            target = torch.where(self.has_centroid.view(1, -1, 1), self.centroids.unsqueeze(0), means0)
            ctx = {"targets": target, "has_target": self.has_centroid.unsqueeze(0) | has_local}
        res = self.local_train(t, clients, (params, buffers), self.body_specs[aligned], LocalInputs(ctx=ctx))
        metrics["train/loss"] = res.loss.mean().item()
        # 3. server: representation (FedAvg), class centroids, per-client head combinations (QP)
        means1, counts1, _ = self.class_statistics(clients, res.params, res.buffers, second_moment=False)
        self.sent = self.round_traffic(clients, counts1)  # before the centroids change: the ones sent down
        self.centroids, self.has_centroid = weighted_centroids(means1, counts1)
        self.theta = weighted_mean(select(res.params, self.shared), n)
        self.theta_buf = weighted_mean(select(res.buffers, self.shared_buf), n)
        tic = time.perf_counter()
        A, failed = combination_weights(V, H, float(hp.eig_floor), float(hp.prune), hp.bias_term == "outer")
        metrics["fedpac/qp_seconds"] = time.perf_counter() - tic
        set_rows(self.phi, clients, mix(select(res.params, self.personal), A))
        set_rows(self.phi_buf, clients, mix(select(res.buffers, self.personal_buf), A))
        metrics.update(
            {
                "fedpac/self_weight": float(A.diagonal().mean()),
                "fedpac/peers_used": float((A > 0).sum(1).double().mean()),
                "fedpac/qp_failed": failed,
            }
        )
        return metrics

    def round_traffic(self, clients, counts) -> Traffic:
        """Up: θ and φ_k, V_k (1 number), H_k and the trained class means μ'_k (d numbers each per class held) and
        the class counts n_{k,c} (§4, code ``statistics_extraction`` / ``protos_aggregation``); down: θ, the
        client's combined head φ_k and the global centroids c_y that exist."""
        m, d = len(clients), self.centroids.shape[1]
        model = numel(self.theta, self.theta_buf) + numel(self.phi, self.phi_buf, stacked=True)
        held = int((counts > 0).sum())
        return Traffic(m * (model + 1) + held * (2 * d + 1), m * (model + int(self.has_centroid.sum()) * d))

    def traffic(self, t, clients):
        return self.sent

    def class_statistics(self, clients, params, buffers, second_moment: bool = True):
        """Per client: class means of f(x) on its train set, class counts, and class means of ‖f(x)‖² (eval mode)."""
        idx = [self.data.train_idx[int(k)] for k in clients]
        feats = [h.flatten(1) for h in client_outputs(self.ctx, self.split.features, params, buffers, idx)]
        labels = [self.data.y[self.data.tensor(i)] for i in idx]
        C = self.data.num_classes
        means, counts = class_means(feats, labels, C)
        sq = None
        if second_moment:  # E[‖f‖² | c]
            sq = class_means([(h**2).sum(1, keepdim=True) for h in feats], labels, C)[0][..., 0]
        return means, counts.to(means.dtype), sq

    @pad_aware
    def plain_loss(self, fm, p, b, x, y, ctx):
        return F.cross_entropy(self.split.head(p, b, self.split.features(p, b, x)), y)

    @pad_aware
    def aligned_loss(self, fm, p, b, x, y, ctx):
        """CE + λ·MSE(f(x), c_y) for ONE client (pure; §4.1 with the codes' ``nn.MSELoss`` mean over B·d)."""
        h = self.split.features(p, b, x)
        ce = F.cross_entropy(self.split.head(p, b, h), y)
        return ce + float(self.hp.lam) * prototype_alignment(h.flatten(1), y, ctx["targets"], ctx["has_target"])

    def client_models(self, clients, t):
        m = len(clients)
        return (
            {**broadcast(self.theta, m), **rows(self.phi, clients)},
            {**broadcast(self.theta_buf, m), **rows(self.phi_buf, clients)},
        )

    def global_model(self):
        """Generic model (FedKA Table 9; the averaging is our choice): θ with the n_k-weighted average of all personal
        heads."""
        return (
            {**self.theta, **weighted_mean(self.phi, self.n)},
            {**self.theta_buf, **weighted_mean(self.phi_buf, self.n)},
        )


__all__ = [
    "FedPAC",
    "FeatureSplit",
    "bias_matrix",
    "combination_weights",
    "feature_statistics",
    "simplex_qp",
    "weighted_centroids",
]
