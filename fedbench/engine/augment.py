"""Batched training-time augmentation on tensors already on the device (no per-sample Python).

Random parameters are drawn for a whole local-training job before its step loop, on the device, from a
generator keyed by (seed, purpose, round, client) (:func:`draw_job`), so the sequential and vectorized
executors augment every sample identically and the step loop never waits for the host.
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
        self._border: dict = {}  # (device, dtype, H, W) -> the fill of the padding border, made once

    def draw(self, n: int, gen: torch.Generator, device=None) -> torch.Tensor:
        """[n, 3] random parameters (row offset, column offset, flip) for n samples, drawn on ``gen``'s device."""
        device = gen.device if device is None else device
        span = 2 * self.padding + 1
        oy = torch.randint(0, span, (n,), generator=gen, device=device)
        ox = torch.randint(0, span, (n,), generator=gen, device=device)
        flip = (torch.rand(n, generator=gen, device=device) < 0.5).long() if self.hflip else torch.zeros_like(oy)
        return torch.stack([oy, ox, flip], dim=1)

    def apply(self, x: torch.Tensor, prm: torch.Tensor) -> torch.Tensor:
        """Crop and flip every sample of ``x`` [N, C, H, W] with its parameters ``prm`` [N, 3] (from :meth:`draw`)."""
        B, C, H, W = x.shape
        p = self.padding
        oy, ox, flip = prm[:, 0], prm[:, 1], prm[:, 2].bool()
        if p:
            xp = F.pad(x, (p, p, p, p))
            if self.fill is not None:
                xp = xp + self.border(x)
        else:
            xp = x
        rows = oy[:, None] + torch.arange(H, device=x.device)
        cols = ox[:, None] + torch.arange(W, device=x.device)
        cols = torch.where(flip[:, None], cols.flip(1), cols)
        out = xp[torch.arange(B, device=x.device)[:, None, None], :, rows[:, :, None], cols[:, None, :]]
        return out.permute(0, 3, 1, 2).contiguous()

    def border(self, x: torch.Tensor) -> torch.Tensor:
        """[1, C, H+2p, W+2p]: ``fill`` on the padding border, 0 inside (built once per device/dtype/size, so a
        step never copies the fill values from the host)."""
        B, C, H, W = x.shape
        key = (x.device, x.dtype, H, W)
        if key not in self._border:  # (draw_job makes it before a step loop: the loop itself never copies)
            p = self.padding
            inside = F.pad(torch.ones(1, 1, H, W, device=x.device, dtype=x.dtype), (p, p, p, p))
            self._border[key] = (1 - inside) * torch.as_tensor(self.fill, dtype=x.dtype, device=x.device).view(
                1, C, 1, 1
            )
        return self._border[key]

    def __call__(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return self.apply(x, self.draw(len(x), gen, x.device))


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


def draw_job(augment, plan, aug_key: tuple, client_ids: list[int], x_like: torch.Tensor) -> torch.Tensor:
    """Per-sample augmentation parameters of a whole job, aligned with ``plan.flat``: client m's block is drawn
    from its own device generator keyed by ``aug_key`` + (client id,)."""
    from .. import seeding

    dev = plan.flat.device
    if getattr(augment, "fill", None) is not None and augment.padding:
        augment.border(x_like)
    parts = []
    for m, k in enumerate(client_ids):
        n = plan.offsets[m][-1] - plan.offsets[m][0]
        if n:
            parts.append(augment.draw(n, seeding.torch_generator(*aug_key, int(k), device=dev), dev))
    return torch.cat(parts) if parts else torch.zeros((0, 3), dtype=torch.long, device=dev)
