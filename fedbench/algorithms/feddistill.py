"""FedDistill / FD (Jeong et al., "Communication-efficient on-device machine learning: federated distillation
and augmentation under non-IID private data", arXiv 1811.11479, 2018) — baseline of FedReMa Table 1;
PFLlib ``clientdistill``/``serverdistill`` (the form FedReMa's Table 1 ran)."""

from __future__ import annotations

from . import register
from .fedproto import ClassMeanExchange


@register
class FedDistill(ClassMeanExchange):
    """FD: clients exchange per-class mean logits instead of weights. Local objective
    CE(f(x), y) + λ·MSE(f(x), L̄_y) with L̄_y the global average logit vector of class y (PFLlib's MSE form of
    FD's distillation regularizer); the server averages the clients' per-class mean logits. Each client is
    evaluated with its own model. (FD's federated augmentation, FAug, is not part of the baseline.)"""

    name = "feddistill"

    def outputs(self, fm, p, b, x):
        logits = fm(p, b, x)
        return logits, logits


__all__ = ["FedDistill"]
