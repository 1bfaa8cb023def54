"""All client data of a run as a few big tensors on the run's device plus per-client index tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class FederatedData:
    x: torch.Tensor  # pool (official train split, then official test split), on device
    y: torch.Tensor
    n_pool_train: int  # x[:n_pool_train] is the official train split
    train_idx: list[np.ndarray]  # per client, indices into the pool
    test_idx: list[np.ndarray]
    counts: np.ndarray  # [K, C] train class counts per client
    num_classes: int
    classes: list[str]
    info: dict

    @classmethod
    def build(
        cls, dataset, partition, device: torch.device, dtype=torch.float32, pin_memory: bool = False
    ) -> "FederatedData":
        x = dataset.x.to(dtype)
        if device.type == "cuda" and pin_memory:
            x = x.pin_memory()
        return cls(
            x=x.to(device, non_blocking=True),
            y=dataset.y.to(device),
            n_pool_train=dataset.n_train,
            train_idx=[np.asarray(i, dtype=np.int64) for i in partition.train],
            test_idx=[np.asarray(i, dtype=np.int64) for i in partition.test],
            counts=np.asarray(partition.counts),
            num_classes=dataset.num_classes,
            classes=list(dataset.classes),
            info=dict(partition.info),
        )

    @property
    def num_clients(self) -> int:
        return len(self.train_idx)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def global_test_idx(self) -> np.ndarray:
        return np.arange(self.n_pool_train, len(self.y))

    def train_sizes(self, clients=None) -> torch.Tensor:
        """n_k: number of local training samples (FedAvg's aggregation weights)."""
        ids = range(self.num_clients) if clients is None else [int(k) for k in clients]
        return torch.tensor([len(self.train_idx[k]) for k in ids], dtype=torch.float64)

    def tensor(self, idx) -> torch.Tensor:
        return torch.as_tensor(np.asarray(idx), dtype=torch.long, device=self.x.device)

    def tensors(self, idx: list) -> list[torch.Tensor]:
        """Several index arrays on the device in ONE host-to-device copy (on a GPU a blocking copy waits for the
        device: one per evaluation, not one per client)."""
        if not idx:
            return []
        flat = self.tensor(np.concatenate([np.asarray(i, dtype=np.int64).reshape(-1) for i in idx]))
        return list(flat.split([len(i) for i in idx]))
