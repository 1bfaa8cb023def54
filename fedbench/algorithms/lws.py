"""FedAvg+LWS — learnable weight scaling (Kang et al., "Decoupling representation and classifier", ICLR 2020)
as ECL's personalization baseline (ECL Tables 1–2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engine.masking import pad_aware
from ..engine.stack import Stack, broadcast
from . import register
from .local import LocalInputs
from .oneshot import OneShotPersonalization, class_balanced_weights, classifier_names

SCALE = "lws.scale"  # the extra trainable tensor f [C] carried in the parameter stack during phase II


@pad_aware
def lws_loss(fm, p, b, x, y, ctx):
    """CE of the logits scaled per class, f_c·z_c = (f_c w_c)·h + f_c b_c; only f is trainable."""
    model = {k: v for k, v in p.items() if k != SCALE}
    return F.cross_entropy(fm(model, b, x) * p[SCALE], y)


def scale_classifier(params: Stack, weight: str, bias: str | None, f: torch.Tensor) -> Stack:
    """ŵ_c = f_c·w_c and b̂_c = f_c·b_c for every client row: the LWS classifier as a plain Linear."""
    out = dict(params)
    out[weight] = params[weight] * f.unsqueeze(-1)
    if bias is not None:
        out[bias] = params[bias] * f
    return out


@register
class FedAvgLWS(OneShotPersonalization):
    """Phase I: FedAvg (``phase_one``). Phase II per client k: backbone and classifier frozen, learn per-class
    scales f (init 1) with CE under class-balanced sampling of D_k (Kang et al. §4; 10 epochs,
    lr 0.01: our choice, ECL gives none); the personalized model is w^T with classifier rows scaled by f."""

    name = "fedavg_lws"

    def personalize(self, t, w, bn):
        K, C = self.K, self.data.num_classes
        params = broadcast(w, K)
        params[SCALE] = torch.ones(K, C, dtype=self.data.x.dtype, device=self.data.x.device)
        weights = [class_balanced_weights(self.labels[i]) for i in self.data.train_idx]
        spec = self.phase2_spec.replace(phase="lws", trainable=(SCALE,), loss=lws_loss)
        P, B = self.phase_two_train(t, (params, broadcast(bn, K)), spec, LocalInputs(sample_weights=weights))
        f = P.pop(SCALE)
        self.components = [(scale_classifier(P, *classifier_names(self.fm), f), B)]
        return {"lws/scale_mean": float(f.mean()), "lws/scale_std": float(f.std())}


__all__ = ["FedAvgLWS", "lws_loss", "scale_classifier"]
