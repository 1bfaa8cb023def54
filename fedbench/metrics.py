"""Metrics shared by the evaluator (fedbench/evaluation.py), the diagnostics and the algorithms.

Plain functions of logits, labels and counts (numpy/torch); they import nothing of fedbench above the engine, so
algorithms may use them (tests/test_layers.py).
"""

from __future__ import annotations

import math

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


def client_spread(acc: np.ndarray) -> dict[str, float]:
    """The spread of per-client accuracies ``acc`` (the K' clients with test samples), in keys of ``pers/acc_*``:

    * ``worst10``: the mean of the ⌈0.1·K'⌉ lowest accuracies — the "worst 10 %" column of q-FFL's tables (Li et al.,
      "Fair Resource Allocation in Federated Learning", ICLR 2020); the rounding up, so that fewer than 10 clients
      still have their worst one, is our choice;
    * ``p10``, ``p50``, ``p90``: the 10th/50th/90th percentiles, numpy's default ``linear`` interpolation (Hyndman &
      Fan's type 7: the value at rank ``q·(K'−1)`` of the sorted accuracies, interpolated between neighbours)."""
    acc = np.sort(np.asarray(acc, dtype=float))
    if not len(acc):
        return dict.fromkeys(("worst10", "p10", "p50", "p90"), math.nan)
    p10, p50, p90 = np.percentile(acc, [10, 50, 90], method="linear")
    worst = acc[: math.ceil(0.1 * len(acc))]
    return {"worst10": float(worst.mean()), "p10": float(p10), "p50": float(p50), "p90": float(p90)}


MANY_ABOVE, FEW_BELOW = 100, 20  # training samples of a class: many-shot > 100, few-shot < 20 (OLTR)


def shot_groups(train_class_counts: np.ndarray) -> dict[str, np.ndarray]:
    """The classes of each long-tail group by their number n of training samples in the whole federation (the sum of
    the clients' train counts): many-shot n > 100, medium-shot 20 ≤ n ≤ 100, few-shot n < 20 — the split of the
    evaluation metrics of Liu et al., "Large-Scale Long-Tailed Recognition in an Open World" (OLTR, CVPR 2019), which
    the long-tail literature reports; the ECL paper and spec define none. Empty groups are left out."""
    n = np.asarray(train_class_counts)
    groups = {
        "many": np.flatnonzero(n > MANY_ABOVE),
        "medium": np.flatnonzero((n >= FEW_BELOW) & (n <= MANY_ABOVE)),
        "few": np.flatnonzero(n < FEW_BELOW),
    }
    return {g: c for g, c in groups.items() if len(c)}


def shot_accuracy(correct: np.ndarray, total: np.ndarray, train_class_counts: np.ndarray) -> dict[str, float]:
    """Per group of :func:`shot_groups`, the accuracy over all test samples of its classes, pooled over clients
    (``correct``, ``total``: [K, C] per client and class); a group whose classes have no test sample is left out."""
    out = {}
    for g, classes in shot_groups(train_class_counts).items():
        n = total[:, classes].sum()
        if n > 0:
            out[g] = float(correct[:, classes].sum() / n)
    return out


__all__ = [
    "class_counts",
    "client_spread",
    "confusion_counts",
    "present_class_accuracy",
    "designated_class_accuracy",
    "shot_accuracy",
    "shot_groups",
    "DESIGNATED",
]
