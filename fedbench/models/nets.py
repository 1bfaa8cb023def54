"""Small networks used by the papers (architectures from the papers and their official code)."""

from __future__ import annotations

from torch import nn

from .base import SplitNet, flat_dim
from .dropout import KeyedDropout


def _fc_head(in_dim: int, hidden: list[int], num_classes: int, relu: bool = True, bn: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers.append(nn.Linear(in_dim, h))
        if bn:
            layers.append(nn.BatchNorm1d(h))
        if relu:
            layers.append(nn.ReLU(inplace=True))
        in_dim = h
    layers.append(nn.Linear(in_dim, num_classes))
    return nn.Sequential(*layers)


def _classifier_name(head: nn.Sequential) -> str:
    return f"head.{len(head) - 1}"


def mlp(input_shape, num_classes, hidden=(128,), head_hidden=()) -> SplitNet:
    """Flatten -> [Linear+ReLU]* (body) -> Linear* (head). Default model for the 8x8 digits."""
    layers: list[nn.Module] = [nn.Flatten()]
    d = 1
    for s in input_shape:
        d *= s
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU(inplace=True)]
        d = h
    body = nn.Sequential(*layers)
    head = _fc_head(d, list(head_hidden), num_classes)
    return SplitNet(body, head, _classifier_name(head))


def cnn(
    input_shape, num_classes, channels=(32, 64), kernel_size=5, padding=0, hidden=(512,), batch_norm=False
) -> SplitNet:
    """The FedAvg CNN (McMahan et al.; PFLlib ``FedAvgCNN``).

    [Conv(k)+ReLU+MaxPool2] per channel width -> flatten | head: [Linear+ReLU]* -> Linear.
    (Built as Conv -> MaxPool -> ReLU: max-pooling commutes with ReLU, so the function and its gradients are
    identical, and the ReLU touches 4x fewer elements. ReLUs are in place: measured ~10% faster steps on CPU.)
    On 1x28x28 it is FedReMa's MNIST/FMNIST CNN (flatten 1024, head 1024->512->10); on 3x32x32 it is
    the FedAvg CIFAR CNN and FedKA's t-CNN (5x5 valid convs, flatten 1600, FC 512).
    FedReMa treats all FC layers as the classifier, so they form the head.
    """
    layers: list[nn.Module] = []
    c = input_shape[0]
    for out in channels:
        layers.append(nn.Conv2d(c, out, kernel_size, padding=padding))
        if batch_norm:
            layers.append(nn.BatchNorm2d(out))
        layers += [nn.MaxPool2d(2), nn.ReLU(inplace=True)]
        c = out
    layers.append(nn.Flatten())
    body = nn.Sequential(*layers)
    head = _fc_head(flat_dim(body, input_shape), list(hidden), num_classes, bn=batch_norm)
    return SplitNet(body, head, _classifier_name(head))


def alexnet(input_shape, num_classes) -> SplitNet:
    """FedReMa's simplified AlexNet for CIFAR-10 (FedReMa §5.1; official code liangh68/FedReMa ``alexnet.py``).

    No nonlinearity between conv3/4/5 nor between the three head Linears, exactly as in the code.
    """
    c = input_shape[0]
    body = nn.Sequential(
        nn.Conv2d(c, 32, 3, padding=1),
        nn.MaxPool2d(2, 2),
        nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.MaxPool2d(2, 2),
        nn.ReLU(inplace=True),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.Conv2d(128, 256, 3, padding=1),
        nn.Conv2d(256, 256, 3, padding=1),
        nn.MaxPool2d(3, 2),
        nn.ReLU(inplace=True),
        nn.Flatten(),
    )
    head = nn.Sequential(
        nn.Linear(flat_dim(body, input_shape), 1024), nn.Linear(1024, 512), nn.Linear(512, num_classes)
    )
    return SplitNet(body, head, "head.2")


def lenet(input_shape, num_classes) -> SplitNet:
    """LeNet-5 (FedCOM's "modified LeNet", ECL's FMNIST-LT CNN): 2 conv + 3 FC; the classifier is the last FC."""
    # Conv -> MaxPool -> ReLU: the same function as Conv -> ReLU -> MaxPool (see `cnn`), cheaper
    conv = [
        nn.Conv2d(input_shape[0], 6, 5),
        nn.MaxPool2d(2),
        nn.ReLU(inplace=True),
        nn.Conv2d(6, 16, 5),
        nn.MaxPool2d(2),
        nn.ReLU(inplace=True),
        nn.Flatten(),
    ]
    d = flat_dim(nn.Sequential(*conv), input_shape)
    body = nn.Sequential(*conv, nn.Linear(d, 120), nn.ReLU(inplace=True), nn.Linear(120, 84), nn.ReLU(inplace=True))
    # ECL §3.2 names a "last residual block"; for this CNN our choice is the last conv block + the FC layers.
    head = nn.Sequential(nn.Linear(84, num_classes))
    return SplitNet(body, head, "head.0", last_block=("body.3", "body.7", "body.9"))


def pfl_cnn(input_shape, num_classes, channels=(32, 64), hidden=(128,), dropout=(0.25, 0.5)) -> SplitNet:
    """pfl-research's ``simple_cnn`` (its CIFAR-10 benchmark model, ``benchmarks/model/pytorch/cnn.py``).

    Conv3x3(32) -> ReLU -> Conv3x3(64) -> ReLU -> MaxPool2 -> Dropout(.25) -> flatten (12544 on 3x32x32) |
    head: [FC 128 -> ReLU -> Dropout(.5)] per hidden width -> FC C. Valid (unpadded) convolutions; weights
    Glorot/Xavier-uniform, biases torch's default, as there. Dropout is :class:`KeyedDropout` (masks keyed by
    client and step, so both executors drop the same units; pfl-research uses torch's global generator).
    """
    c = input_shape[0]
    body = nn.Sequential(
        nn.Conv2d(c, channels[0], 3),
        nn.ReLU(inplace=True),
        nn.Conv2d(channels[0], channels[1], 3),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        KeyedDropout(dropout[0]),
        nn.Flatten(),
    )
    layers: list[nn.Module] = []
    d = flat_dim(body, input_shape)
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU(inplace=True), KeyedDropout(dropout[1])]
        d = h
    head = nn.Sequential(*layers, nn.Linear(d, num_classes))
    for m in [*body, *head]:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
    return SplitNet(body, head, _classifier_name(head))
