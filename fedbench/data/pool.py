"""The dataset every loader returns (:class:`Dataset`): the pool ``official train split ++ official test split`` as
whole tensors, with labels, class names and optional per-sample attributes; :func:`from_splits` builds it from the
two splits. The loaders of fedbench/data/datasets.py and LEAF's FEMNIST reader (fedbench/data/leaf.py) share it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Dataset:
    name: str
    x: torch.Tensor  # float32 [N, C, H, W], normalised; pool = official train then official test
    y: torch.Tensor  # int64 [N]
    n_train: int  # x[:n_train] = official train split, x[n_train:] = official test split
    classes: list[str]
    attrs: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. {"rotation": int64 [N]}

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x.shape[1:])


def from_splits(name, train_x, train_y, test_x, test_y, classes, attrs=None) -> Dataset:
    """Concatenate the official splits into one pool (x may still be uint8)."""
    x = torch.cat([torch.as_tensor(train_x), torch.as_tensor(test_x)])
    y = torch.cat([torch.as_tensor(train_y), torch.as_tensor(test_y)]).long()
    return Dataset(name, x, y, len(train_y), [str(c) for c in classes], attrs or {})
