"""Metrics shared by the evaluator (fedbench/evaluation.py), the diagnostics and the algorithms.

Plain functions of logits, labels and counts (numpy/torch); they import nothing of fedbench above the engine, so
algorithms may use them (tests/test_layers.py).
"""

from __future__ import annotations

import numpy as np
import torch


def class_counts(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[2, C] on the device: (correct, total) per true class of predictions ``logits`` [n, C] for labels ``y`` [n].

    Sums of a [n, C] class-match table: no host read (``bincount`` and a boolean-mask index make the host wait for
    the size of their result), deterministic on any device; callers stack many and read them back once."""
    match = y.unsqueeze(1) == torch.arange(num_classes, device=y.device)
    hit = (logits.argmax(-1) == y).unsqueeze(1)
    return torch.stack([(match & hit).sum(0), match.sum(0)])


def confusion_counts(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(correct per class, total per class) on the host: :func:`class_counts` read back (one transfer)."""
    correct, total = class_counts(logits, y, num_classes).cpu().numpy()
    return correct, total


def present_class_accuracy(class_acc: np.ndarray, train_counts: np.ndarray, test_counts: np.ndarray) -> np.ndarray:
    """Per client, its per-class accuracy averaged over the classes it trains on and has test samples of ([K, C]
    inputs; NaN for a client with none). ECL's metric (ECL leaves it open; our choice: FedAFA's, code pxqian/FedAFA)."""
    present = (train_counts > 0) & (test_counts > 0)
    return np.array([class_acc[k, present[k]].mean() if present[k].any() else np.nan for k in range(len(class_acc))])


DESIGNATED = ("majority", "minority")  # the per-client classes a partition may designate (info["<part>_class"])


def designated_class_accuracy(class_acc: np.ndarray, info: dict) -> dict[str, np.ndarray]:
    """FedCOM §4.2's minority-class gains: per client, the accuracy on the class its partition designates as its
    majority / minority class (``info["majority_class"]``, ``info["minority_class"]``: the complementary_pairs
    partition); {} for a partition that designates none."""
    if not all(f"{part}_class" in info for part in DESIGNATED):
        return {}
    rows = np.arange(len(class_acc))
    return {part: class_acc[rows, np.asarray(info[f"{part}_class"])] for part in DESIGNATED}


__all__ = ["class_counts", "confusion_counts", "present_class_accuracy", "designated_class_accuracy", "DESIGNATED"]
