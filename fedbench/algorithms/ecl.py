"""ECL — Expert Collaborative Learning (Lv et al., arXiv 2408.02019): phase II of the two-phase skeleton
(``oneshot.py``, shared with the long-tail baselines of ECL's Tables 1–2) builds, per client, a calibrated global
model and M experts mixed per class (ECL §3.2, Eqs. 3–6)."""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..checks import int_at_least, number, one_of
from ..engine.masking import pad_aware
from ..engine.stack import broadcast, set_rows
from ..losses import balanced_softmax_ce
from . import register
from .local import LocalInputs
from .oneshot import OneShotPersonalization, class_balanced_weights, classifier_names, expert_groups

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- ECL math (ECL §3.2)
def tail_expert(groups: list[np.ndarray]) -> int:
    """Index of the tail expert ("the expert with tailed class data", ECL §3.2): the last non-empty group
    (−1 if the client has no class)."""
    return max((m for m, g in enumerate(groups) if len(g)), default=-1)


def expert_of_class(groups: list[list[np.ndarray]], num_classes: int) -> torch.Tensor:
    """[K, C] owner matrix: m ≥ 1 = expert m holds class c; 0 = class absent from the client's data."""
    owner = torch.zeros(len(groups), num_classes, dtype=torch.long)
    for k, gs in enumerate(groups):
        for m, g in enumerate(gs):
            owner[k, torch.as_tensor(g, dtype=torch.long)] = m + 1
    return owner


def logit_scales(u0: torch.Tensor, experts: torch.Tensor, mode: str) -> torch.Tensor:
    """Eq. 5 factors ‖u_m‖² / ‖u_0‖², shape [K, M, C].

    ``u0`` [K, C, d]: classifier weights of the calibrated global model; ``experts`` [M, K, C, d]: the
    experts'. ``norm``: whole-matrix (Frobenius) norms, one factor per expert (our reading of Eq. 5's "L2 norm");
    ``class_norm``: per-class rows ‖u_{m,c}‖² / ‖u_{0,c}‖² (our reading of Table 3 "with LWS");
    ``none``: 1 (Table 3 "without scaling")."""
    M, K, C, _ = experts.shape
    if mode == "none":
        return torch.ones(K, M, C, dtype=u0.dtype, device=u0.device)
    if mode == "norm":
        ratio = experts.pow(2).sum((-1, -2)) / u0.pow(2).sum((-1, -2))  # [M, K]
        return ratio.t().unsqueeze(-1).expand(K, M, C).clone()
    if mode == "class_norm":
        return (experts.pow(2).sum(-1) / u0.pow(2).sum(-1)).permute(1, 0, 2)  # [K, M, C]
    raise ValueError(mode)


def mixing_weights(owner: torch.Tensor, scales: torch.Tensor, lam: float) -> torch.Tensor:
    """[K, M+1, C] weights A with o^c = Σ_j A[j, c] z_j^c (j = 0 calibrated global model, j = m expert m):
    Eq. 6, o^c = λ·s_{m(c)}·z_{m(c)}^c + (1−λ)·z_0^c for a present class c owned by expert m(c);
    o^c = z_0^c for a class absent from the client's data (our choice; Eq. 6 is silent)."""
    K, M, C = scales.shape
    own = torch.nn.functional.one_hot(owner, M + 1).permute(0, 2, 1).to(scales.dtype)  # [K, M+1, C]
    present = owner > 0
    A = torch.zeros(K, M + 1, C, dtype=scales.dtype, device=scales.device)
    A[:, 0] = torch.where(present, torch.full_like(scales[:, 0], 1 - lam), torch.ones_like(scales[:, 0]))
    A[:, 1:] = lam * scales * own[:, 1:]
    return A


@pad_aware
def bsce_loss(fm, p, b, x, y, ctx):
    """Eq. 3: Balanced Softmax CE with the client's class counts n_k^c (absent classes: log 1e-6)."""
    return balanced_softmax_ce(fm(p, b, x), y, ctx["class_counts"])


# ---------------------------------------------------------------------------- ECL
@register
class ECL(OneShotPersonalization):
    """ECL Algorithm 1, phase II for every client k (all clients stacked per model):

    1. data grouping: present classes by descending n_k^c into C_1 … C_M (:func:`expert_groups`);
    2. calibrated global model w_k^T: w^T with only the classifier trained, Balanced Softmax CE on D_k (Eq. 3);
    3. experts v_k^m from w^T (frozen layers in eval mode): an expert before the tail trains the last block +
       classifier with CE on {(x, y) ∈ D_k : y ∈ C_m} (Eq. 4); the tail expert — the last non-empty group,
       "usually the last expert (M-th expert)" (§3.2) — trains only the classifier with class-balanced
       sampling of its samples; an empty group has no expert;
    4. inference (Eqs. 5–6): o^c = λ·(‖u_m‖²/‖u_0‖²)·z_m^c + (1−λ)·z_0^c with m the expert owning c.

    Executor calls: 1 (calibrated) + per expert position one call for the clients whose tail it is and one for
    the others (each with those clients stacked; a call with no client is skipped).
    """

    name = "ecl"
    state_attrs = ("components", "mix", "owner")

    def check_phase_two(self):
        self.num_experts = int(self.checked_hp("num_experts", int_at_least(1)))  # M
        self.lam = float(self.checked_hp("mix_lambda", number(0, 1)))  # λ, Eq. 6
        self.component_names = ("calibrated", *(f"expert{m + 1}" for m in range(self.num_experts)))
        self.scaling = self.checked_hp("logit_scaling", one_of("norm", "class_norm", "none"))  # Eq. 5 / Table 3
        self.grouping = self.checked_hp("grouping", one_of("ceil", "even"))
        self.classifier = self.fm.names("classifier")
        last = self.fm.names("last_block")
        if not last:  # e.g. mlp / cnn: no residual block declared → the head's layers (our choice for the CNN)
            log.warning(
                "ECL: model %s declares no last block; experts train its head layers %s",
                self.cfg.model.name,
                self.fm.names("head"),
            )
            last = self.fm.names("head")
        chosen = set(last) | set(self.classifier)
        self.expert_layers = [n for n in self.fm.param_names if n in chosen]
        self.owner = None

    def personalized_names(self):
        return self.expert_layers

    def class_groups(self):
        return [expert_groups(c, self.num_experts, self.grouping) for c in self.data.counts]

    def personalize(self, t, w, bn):
        K, M, C = self.K, self.num_experts, self.data.num_classes
        # Eq. 3: the calibrated global model w_k^T (classifier only, BSCE with the client's counts)
        calibrate = self.phase2_spec.replace(phase="ecl_calibrate", trainable=self.classifier, loss=bsce_loss)
        calibrated = self.phase_two_train(
            t, (broadcast(w, K), broadcast(bn, K)), calibrate, LocalInputs(ctx={"class_counts": self.client_counts()})
        )
        # data grouping, then Eq. 4 for expert m = 1..M: per client, the tail expert is its last non-empty group
        # (classifier only, class-balanced sampling), the experts before it train the last block + classifier, and
        # an empty group has no expert (its rows stay w^T, weight 0 in Eq. 6). Clients stacked per (expert, role).
        groups = self.class_groups()
        tails = [tail_expert(g) for g in groups]
        active = torch.tensor([[len(g[m]) > 0 for m in range(M)] for g in groups])  # [K, M]
        experts = []
        for m in range(M):
            P, B = broadcast(w, K), broadcast(bn, K)
            for tail in (False, True):
                sel = [k for k in range(K) if active[k, m] and (tails[k] == m) == tail]
                if not sel:
                    continue
                idx = [self.data.train_idx[k][np.isin(self.labels[self.data.train_idx[k]], groups[k][m])] for k in sel]
                spec = self.phase2_spec.replace(
                    phase=f"ecl_expert{m + 1}", trainable=self.classifier if tail else self.expert_layers
                )
                weights = [class_balanced_weights(self.labels[i]) for i in idx] if tail else None
                Pm, Bm = self.phase_two_train(
                    t,
                    (broadcast(w, len(sel)), broadcast(bn, len(sel))),
                    spec,
                    LocalInputs(indices=idx, sample_weights=weights),
                    clients=sel,
                )
                set_rows(P, sel, Pm)
                set_rows(B, sel, Bm)
            experts.append((P, B))
        # Eqs. 5-6: per-class mixing weights of (calibrated, expert 1..M); an empty expert has no scale (0)
        weight, _ = classifier_names(self.fm)
        scales = logit_scales(calibrated[0][weight], torch.stack([e[0][weight] for e in experts]), self.scaling)
        scales = scales * active.to(scales.device, scales.dtype).unsqueeze(-1)
        self.owner = expert_of_class(groups, C)
        self.mix = mixing_weights(self.owner.to(scales.device), scales, self.lam)
        self.components = [calibrated, *experts]
        used = scales[:, :, 0] if self.scaling != "class_norm" else scales.mean(-1)
        self.publish_matrix(
            "ecl_expert_of_class",
            t,
            self.owner,
            xlabel="class",
            ylabel="client",
            title="ECL: expert owning each class (0 = absent)",
        )
        self.publish_matrix(
            "ecl_logit_scale",
            t,
            used,
            xlabel="expert",
            ylabel="client",
            title="ECL Eq. 5 scale ‖u_m‖²/‖u_0‖² (0 = no expert)",
        )
        sizes = torch.tensor([[len(g[m]) for m in range(M)] for g in groups], dtype=torch.float64)

        def over_clients_with(m: int, v: torch.Tensor) -> float:  # mean over the clients that have an expert m
            return float(v[active[:, m]].mean()) if active[:, m].any() else float("nan")

        return {
            **{f"ecl/scale_expert{m + 1}": over_clients_with(m, used[:, m].cpu()) for m in range(M)},
            **{f"ecl/classes_expert{m + 1}": over_clients_with(m, sizes[:, m]) for m in range(M)},
            **{f"ecl/clients_expert{m + 1}": int(active[:, m].sum()) for m in range(M)},
        }


__all__ = ["ECL", "tail_expert", "expert_of_class", "logit_scales", "mixing_weights", "bsce_loss"]
