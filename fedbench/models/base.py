"""Every fedbench model is a body (feature extractor) followed by a head (classifier).

Half the PFL algorithms treat the two differently (FedPer, FedRep, FedBABU, LG-FedAvg,
FedReMa, ...), so the split is structural: parameter names start with ``body.`` or ``head.``.
"""

from __future__ import annotations

import torch
from torch import nn


class SplitNet(nn.Module):
    """``logits = head(body(x))``.

    ``classifier`` names the final Linear layer (a prefix of parameter names, e.g. ``head.2``);
    ``last_block`` names the prefixes of the body's last block (ECL's experts train it).
    """

    def __init__(self, body: nn.Module, head: nn.Module, classifier: str, last_block: tuple[str, ...] = ()):
        super().__init__()
        self.body, self.head = body, head
        self.classifier = classifier
        self.last_block = last_block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    @property
    def feature_dim(self) -> int:
        first = next(m for m in self.head.modules() if isinstance(m, nn.Linear))
        return first.in_features

    def part_of(self, name: str, scope: str) -> bool:
        """Whether parameter ``name`` belongs to ``scope``: body | head | classifier | last_block | all."""
        if scope == "all":
            return True
        if scope == "body":
            return name.startswith("body.")
        if scope == "head":
            return name.startswith("head.")
        if scope == "classifier":
            return name.startswith(self.classifier + ".")
        if scope == "last_block":
            return any(name.startswith(p + ".") for p in self.last_block)
        raise ValueError(f"unknown parameter scope {scope!r}")

    def names(self, scope: str) -> list[str]:
        return [n for n, _ in self.named_parameters() if self.part_of(n, scope)]


def flat_dim(body: nn.Module, input_shape) -> int:
    """Output width of ``body`` for one input of ``input_shape`` (computed, never hand-typed)."""
    with torch.no_grad():
        was = body.training
        body.eval()
        d = body(torch.zeros(1, *input_shape)).shape[1]
        body.train(was)
    return int(d)


def with_projection_head(net: SplitNet, out_dim: int) -> SplitNet:
    """MOON's model (Li, He, Song, CVPR 2021, §3.2; code ``ModelFedCon``): the features h (everything before the
    classifier, width d) go through a projection head Linear(d, d) -> ReLU -> Linear(d, ``out_dim``), and a new
    classifier Linear(``out_dim``, C) reads the projection. The body and the hidden head layers are ``net``'s own
    modules (their parameters and initial values are unchanged); the new layers draw from torch's global
    generator (seed it first) and take ``net``'s dtype and device."""
    *hidden, classifier = list(net.head)
    d = classifier.in_features
    ref = next(net.parameters())
    projection = nn.Sequential(nn.Linear(d, d), nn.ReLU(inplace=True), nn.Linear(d, out_dim))
    head = nn.Sequential(*hidden, projection, nn.Linear(out_dim, classifier.out_features)).to(ref.device, ref.dtype)
    return SplitNet(net.body, head, f"head.{len(head) - 1}", net.last_block)
