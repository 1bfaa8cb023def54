"""Loss terms shared by several methods (one concept, one place). All are pure tensor functions
that run under ``torch.func.vmap``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .engine.masking import batch_mean, real, real_labels


def proximal(p: dict, ref: dict, names=None) -> torch.Tensor:
    """½‖w − w_ref‖² over ``names`` (all of ``ref`` by default): FedProx, Ditto, pFedMe, FedDyn, FedCOM."""
    keys = ref.keys() if names is None else names
    return 0.5 * sum(((p[k] - ref[k]) ** 2).sum() for k in keys)


def balanced_softmax_ce(
    logits: torch.Tensor, y: torch.Tensor, class_counts: torch.Tensor, empty_log: float = -13.815510557964274
) -> torch.Tensor:
    """Balanced Softmax CE (Ren et al. 2020): CE on ``z + log n_c``; absent classes get log(1e-6).

    Used by ECL's calibrated classifier (Eq. 3) and FedRoD's generic head.
    """
    log_prior = torch.where(
        class_counts > 0,
        torch.log(class_counts.clamp(min=1).to(logits.dtype)),
        torch.full_like(class_counts, empty_log, dtype=logits.dtype),
    )
    return F.cross_entropy(logits + log_prior, y)


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Logits with the true class removed: [B, C] -> [B, C-1] (FedNTD's "not-true" distribution)."""
    c = logits.shape[-1]
    j = torch.arange(c - 1, device=logits.device).unsqueeze(0)
    idx = j + (j >= y.unsqueeze(1)).long()  # skip the true class, keep order (vmap-friendly gather)
    return logits.gather(1, idx)


def kd_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, tau: float, y: torch.Tensor | None = None
) -> torch.Tensor:
    """τ² · KL(softmax(teacher/τ) ‖ softmax(student/τ)), batch-mean (Hinton et al.); with the batch's labels ``y``
    the mean is over its real samples (padded batches, fedbench/engine/masking.py)."""
    t = F.log_softmax(teacher_logits / tau, dim=-1)
    s = F.log_softmax(student_logits / tau, dim=-1)
    # written out (F.kl_div has no vmap batching rule; this is its log_target formula)
    return (tau**2) * batch_mean((t.exp() * (t - s)).sum(-1), y)


def reference_forward(fm, params: dict, buffers: dict, x: torch.Tensor, features: bool = False) -> torch.Tensor:
    """Logits (or body features with ``features=True``) of a *fixed* reference model on ``x`` — the
    round-start global model (FedNTD, MOON), a client's previous-round model (MOON), a teacher.

    Eval mode, as MOON's code runs its global and previous models (``net.eval()``): BatchNorm uses the
    reference's running statistics and never writes to its buffers. No gradient. Pure, so it can be
    called inside a local loss under ``vmap``; for nets without BN/dropout the mode changes nothing.
    """
    was = fm.net.training
    fm.set_mode(False)
    try:
        with torch.no_grad():
            out = (fm.features if features else fm)(params, buffers, x)
    finally:
        fm.set_mode(was)
    return out.detach()


def prototype_alignment(
    h: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, has_proto: torch.Tensor
) -> torch.Tensor:
    """Feature alignment to class prototypes: ``nn.MSELoss()(target, h)`` where ``target_i = P[y_i]`` for samples
    whose class has a prototype (``has_proto[y_i]``) and ``h_i`` otherwise (those add 0 but count in the mean).

    ``h`` [B, d] features, ``protos`` [C, d], ``has_proto`` [C] bool. FedReMa+F (FedReMa Table 4, code
    ``train_with_proto``), FedProto's / FedPAC's regularizer (PFLlib's pattern).
    """
    r = real(y)  # padding samples of a padded batch (engine/masking.py) neither add nor count
    yc = real_labels(y)
    w = (has_proto[yc] & r).to(h.dtype).unsqueeze(1)
    return (w * (h - protos[yc]) ** 2).sum() / (r.sum() * h.shape[1])
