"""LG-FedAvg (Liang et al., "Think Locally, Act Globally", arXiv 2001.01523, 2020) — a baseline of
ECL Table 1."""

from __future__ import annotations

from . import register
from .fedper import PartialAggregation


@register
class LGFedAvg(PartialAggregation):
    """LG-FedAvg: clients train the whole model with CE; the server averages the head (global layers) only,
    the body (local representation) never leaves the client — FedPer with the roles swapped.

    The paper's optional FedAvg warm-up of the global model is not used (our choice: CE on the whole model, body
    private, head aggregated; ECL Table 1 with head = final Linear)."""

    name = "lgfedavg"

    def is_local(self, name):
        return not self.in_head(name)


__all__ = ["LGFedAvg"]
