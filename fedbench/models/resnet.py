"""ResNets: the CIFAR ResNet-32 (ECL §4.1, as in code pxqian/FedAFA) and torchvision's ResNet-50 (FedKA §5.1)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from .base import SplitNet


class _ShortcutA(nn.Module):
    """'Option A' shortcut: stride-2 subsample and zero-pad the channels (He et al. 2016, CIFAR)."""

    def __init__(self, planes: int):
        super().__init__()
        self.pad = planes // 4

    def forward(self, x):
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _ShortcutA(planes) if stride != 1 or in_planes != planes else nn.Identity()

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet32(input_shape, num_classes, blocks_per_stage: int = 5, widths=(16, 32, 64)) -> SplitNet:
    """CIFAR ResNet-32: conv3x3(16)+BN+ReLU, 3 stages x 5 BasicBlocks (16/32/64), avg-pool, Linear.

    Init as in the FedAFA/CReFF code: Kaiming-normal convs and Linear, BN gamma 1 beta 0.
    The experts' "last block" (ECL) is stage 3's last BasicBlock.
    """
    layers: list[nn.Module] = [
        nn.Conv2d(input_shape[0], widths[0], 3, 1, 1, bias=False),
        nn.BatchNorm2d(widths[0]),
        nn.ReLU(),
    ]
    in_planes = widths[0]
    for stage, w in enumerate(widths):
        blocks = []
        for b in range(blocks_per_stage):
            stride = 2 if (stage > 0 and b == 0) else 1
            blocks.append(BasicBlock(in_planes, w, stride))
            in_planes = w
        layers.append(nn.Sequential(*blocks))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    body = nn.Sequential(*layers)
    head = nn.Sequential(nn.Linear(in_planes, num_classes))
    for m in list(body.modules()) + list(head.modules()):
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    last_stage = 3 + len(widths) - 1  # index of the last stage inside body
    return SplitNet(body, head, "head.0", last_block=(f"body.{last_stage}.{blocks_per_stage - 1}",))


def resnet50(input_shape, num_classes, cifar_stem: bool = False) -> SplitNet:
    """torchvision ResNet-50, random init, the final fc replaced by Linear(2048, C) (FedKA §5.1).

    ``cifar_stem`` swaps the ImageNet stem (7x7/2 conv + maxpool) for a 3x3/1 conv and no maxpool.
    """
    from torchvision.models import resnet50 as tv_resnet50

    net = tv_resnet50(weights=None, num_classes=num_classes)
    if cifar_stem:
        net.conv1 = nn.Conv2d(input_shape[0], 64, 3, 1, 1, bias=False)
        net.maxpool = nn.Identity()
    elif input_shape[0] != 3:
        net.conv1 = nn.Conv2d(input_shape[0], 64, 7, 2, 3, bias=False)
    body = nn.Sequential(
        net.conv1,
        net.bn1,
        net.relu,
        net.maxpool,
        net.layer1,
        net.layer2,
        net.layer3,
        net.layer4,
        net.avgpool,
        nn.Flatten(),
    )
    head = nn.Sequential(net.fc)
    return SplitNet(body, head, "head.0", last_block=("body.7.2",))
