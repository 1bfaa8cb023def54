"""CAFeMe's networks (CAFeMe §4, §5.3; as in code annaVettoruzzo/CAFeMe, modules/): the base network f_ψ
whose hidden activations are gated by the federated modulator g_μ, and the same base network without modulator
(the code's baselines).

``cafeme_cnn`` builds both architectures of the official code from its options (conf/model/cafeme_*.yaml):
RMNIST/FEMNIST ``SimpleCNNModuleWithTE`` and CIFAR-10/Meta-Dataset ``CNNModuleWithTE``.
All BatchNorm layers normalise with the statistics of the batch being processed, also at test time
(the code's ``track_running_stats=False``; the nets have no buffers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import SplitNet, flat_dim

MODULATIONS = ("none", "sigmoid", "film", "additive")


class BatchStatNorm(nn.Module):
    """``nn.BatchNorm{1,2}d(track_running_stats=False)``: always the statistics of the batch.

    ``plain = True`` computes it with plain tensor ops instead of torch's fused kernel: same values and
    gradients, ~3x slower on CPU, but correct second-order gradients under ``torch.func.vmap`` (the fused
    kernel's double backward is wrong there — torch 2.x, checked against finite differences). CAFeMe's
    second-order option switches it on (:func:`use_plain_batch_norm`).
    """

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.eps, self.plain = eps, False
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.plain:  # torch.batch_norm, not F.batch_norm: a batch of one sample gives 0-variance stats, no error
            return torch.batch_norm(
                x, self.weight, self.bias, None, None, True, 0.0, self.eps, torch.backends.cudnn.enabled
            )
        dims = [0, *range(2, x.dim())]
        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean = x.mean(dims, keepdim=True)
        var = x.var(dims, unbiased=False, keepdim=True)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight.view(shape) + self.bias.view(shape)


def use_plain_batch_norm(net: nn.Module, plain: bool = True) -> None:
    """Switch every :class:`BatchStatNorm` of ``net`` to the plain-op form (for second-order gradients)."""
    for m in net.modules():
        if isinstance(m, BatchStatNorm):
            m.plain = plain


def _conv_block(cin: int, cout: int, k: int, padding: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=padding), BatchStatNorm(cout), nn.ReLU(), nn.MaxPool2d(2))


def _dense_block(din: int, dout: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(din, dout), BatchStatNorm(dout), nn.ReLU())


class Modulator(nn.Module):
    """g_μ (paper §4.1, Fig. 2): (A) per-sample feature extractor, (B) mean over the batch, (C) MLP
    with one output vector ζ^l per modulated layer of the base network.

    (A) = the base network's conv blocks + flatten, then Linear+ReLU layers (``hidden``); with
    ``uses_labels`` the one-hot label is concatenated to the conv features first (paper: h(h_x(x) ⊕ y);
    the code feeds images only). (B) mean over dim 0. (C) Linear+ReLU layers (``post``) and a Linear
    to the concatenated ζ (2× for FiLM: scale and shift).
    """

    def __init__(
        self,
        input_shape,
        channels,
        kernel_size,
        padding,
        hidden,
        post,
        out_dim: int,
        num_classes: int,
        uses_labels: bool,
    ):
        super().__init__()
        c, blocks = input_shape[0], []
        for out in channels:
            blocks.append(_conv_block(c, out, kernel_size, padding))
            c = out
        self.features = nn.Sequential(*blocks, nn.Flatten())
        self.num_classes, self.uses_labels = num_classes, uses_labels
        d = flat_dim(self.features, input_shape) + (num_classes if uses_labels else 0)
        pre: list[nn.Module] = []
        for h in hidden:
            pre += [nn.Linear(d, h), nn.ReLU()]
            d = h
        self.per_sample = nn.Sequential(*pre)
        top: list[nn.Module] = []
        for h in post:
            top += [nn.Linear(d, h), nn.ReLU()]
            d = h
        top.append(nn.Linear(d, out_dim))
        self.mlp = nn.Sequential(*top)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        h = self.features(x)
        if self.uses_labels:  # no labels given (a plain call) = all-zero one-hot
            onehot = (
                h.new_zeros(h.shape[0], self.num_classes) if y is None else F.one_hot(y, self.num_classes).to(h.dtype)
            )
            h = torch.cat([h, onehot], dim=1)
        return self.mlp(self.per_sample(h).mean(0))  # (B) permutation-invariant context


class GatedTrunk(nn.Module):
    """Everything before the classifier, with the modulator's gates after every hidden block
    (conv blocks, the flattened features, dense blocks): a ⊙ σ(ζ^l) (paper Eq. 4.4, code "c1"),
    or FiLM a·ζ_a + ζ_b (code "c2"), or additive a + ζ (code "c0"). Conv gates broadcast over H×W."""

    def __init__(
        self,
        modulator: Modulator,
        convs: nn.ModuleList,
        dense: nn.ModuleList,
        sizes: list[int],
        conv_layers: int,
        modulation: str,
    ):
        super().__init__()
        self.modulator, self.convs, self.dense = modulator, convs, dense
        self.sizes, self.conv_layers, self.modulation = sizes, conv_layers, modulation

    def gate(self, a: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (a.dim() - 2)
        if self.modulation == "sigmoid":
            return a * torch.sigmoid(z).view(shape)
        if self.modulation == "additive":
            return a + z.view(shape)
        scale, shift = z.view(2, -1)
        return a * scale.view(shape) + shift.view(shape)

    def gates(self, x: torch.Tensor, y: torch.Tensor | None = None) -> list[torch.Tensor]:
        """ζ^l per modulated layer, from the context batch (x, y)."""
        width = 2 if self.modulation == "film" else 1
        return list(torch.split(self.modulator(x, y), [width * s for s in self.sizes]))

    def forward(self, x: torch.Tensor, context: tuple | None = None) -> torch.Tensor:
        zeta = self.gates(*(context if context is not None else (x, None)))
        h = x
        for blk, z in zip(self.convs, zeta):
            h = self.gate(blk(h), z)
        h = self.gate(h.flatten(1), zeta[self.conv_layers])
        for blk, z in zip(self.dense, zeta[self.conv_layers + 1 :]):
            h = self.gate(blk(h), z)
        return h


class CAFeMeNet(SplitNet):
    """f_ψ | ζ: ``forward(x, context=None)``. The modulator's context is the batch being classified
    (code), or ``context`` = (x_c, y_c or None) (paper: the personalization batch D').

    Split: with a modulator, body = modulator + all gated hidden blocks, head = the final Linear
    (the gates need the input, so nothing after a gate can be a separate head); without, body = conv
    blocks, head = dense blocks + output (the code's ``fc`` block, FedRep's head, docs/baselines.md).
    """

    def forward(self, x: torch.Tensor, context: tuple | None = None) -> torch.Tensor:
        if isinstance(self.body, GatedTrunk):
            return self.head(self.body(x, context))
        return self.head(self.body(x))


def cafeme_cnn(
    input_shape,
    num_classes,
    channels=(32, 64),
    kernel_size=5,
    padding=0,
    hidden=(512,),
    modulator_hidden=(100, 200),
    modulator_post=(200,),
    modulation="sigmoid",
    modulator_uses_labels=False,
) -> CAFeMeNet:
    """CAFeMe's base CNN [Conv(k)+BN+ReLU+MaxPool2]* -> flatten -> [Linear+BN+ReLU]* -> Linear, gated by a
    modulator when ``modulation`` != "none" (CAFeMe §4;
    code SimpleCNNModuleWithTE / CNNModuleWithTE; options: conf/model/cafeme_*.yaml)."""
    if modulation not in MODULATIONS:
        raise TypeError(f"modulation={modulation!r}, expected one of {MODULATIONS}")
    c, convs = input_shape[0], []
    for out in channels:
        convs.append(_conv_block(c, out, kernel_size, padding))
        c = out
    d = flat_dim(nn.Sequential(*convs, nn.Flatten()), input_shape)
    sizes = [*channels, d]
    dense = []
    for h in hidden:
        dense.append(_dense_block(d, h))
        d = h
        sizes.append(h)
    out = nn.Linear(d, num_classes)
    if modulation == "none":
        head = nn.Sequential(*dense, out)
        return CAFeMeNet(nn.Sequential(*convs, nn.Flatten()), head, f"head.{len(head) - 1}")
    width = 2 if modulation == "film" else 1
    mod = Modulator(
        input_shape,
        channels,
        kernel_size,
        padding,
        modulator_hidden,
        modulator_post,
        width * sum(sizes),
        num_classes,
        bool(modulator_uses_labels),
    )
    body = GatedTrunk(mod, nn.ModuleList(convs), nn.ModuleList(dense), sizes, len(channels), modulation)
    return CAFeMeNet(body, out, "head")
