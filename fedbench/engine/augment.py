"""Batched training-time augmentation on tensors already on the device (no per-sample Python).

Random parameters come from a generator keyed by (seed, purpose, round, client, step), so the
sequential and vectorized executors augment identically.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class RandomCropFlip:
    """torchvision's ``RandomCrop(size, padding)`` + ``RandomHorizontalFlip()`` for a whole batch.

    Padding uses ``fill`` per channel (the normalised value of a black pixel, as torchvision pads
    before normalising).
    """

    def __init__(self, padding: int = 4, hflip: bool = True, fill=None):
        self.padding = int(padding)
        self.hflip = bool(hflip)
        self.fill = fill

    def __call__(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        B, C, H, W = x.shape
        p = self.padding
        oy = torch.randint(0, 2 * p + 1, (B,), generator=gen)
        ox = torch.randint(0, 2 * p + 1, (B,), generator=gen)
        flip = torch.rand(B, generator=gen) < 0.5 if self.hflip else torch.zeros(B, dtype=torch.bool)
        oy, ox, flip = oy.to(x.device), ox.to(x.device), flip.to(x.device)
        if p:
            xp = F.pad(x, (p, p, p, p))
            if self.fill is not None:
                border = torch.ones(1, 1, H, W, device=x.device, dtype=x.dtype)
                border = 1 - F.pad(border, (p, p, p, p))
                xp = xp + border * torch.as_tensor(self.fill, dtype=x.dtype, device=x.device).view(1, C, 1, 1)
        else:
            xp = x
        rows = oy[:, None] + torch.arange(H, device=x.device)
        cols = ox[:, None] + torch.arange(W, device=x.device)
        cols = torch.where(flip[:, None], cols.flip(1), cols)
        out = xp[torch.arange(B, device=x.device)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
        return out.permute(0, 3, 1, 2).contiguous()


def build_augment(cfg_dataset):
    """``dataset.augment: {crop_padding: 4, hflip: true}`` or null."""
    aug = cfg_dataset.get("augment")
    if not aug:
        return None
    norm = cfg_dataset.get("normalize")
    fill = None
    if norm:
        fill = [-m / s for m, s in zip(norm["mean"], norm["std"])]
    return RandomCropFlip(aug.get("crop_padding", 4), aug.get("hflip", True), fill)
