"""What crosses the network (issue #34, docs/communication.md).

Every algorithm declares what its round ``t`` sends (:meth:`Algorithm.traffic`): the numbers uploaded by the clients
to the server and downloaded from it, summed over every client that communicated in the round (usually the round's
participants; a broadcast to all K clients where the method has one, e.g. ECL's phase II). A number is counted at
4 bytes (fp32: none of the papers states another dtype). Not counted: the integers that name a class, a cluster or a
client (a few bytes), and evaluation (every client receiving the current model to test it is the benchmark's
protocol, not the method's).

The run logs per round ``comm/up_MB`` and ``comm/down_MB`` (MB = 10^6 bytes) and their running totals
``comm/up_MB_cum``, ``comm/down_MB_cum``, ``comm/MB_cum`` (both directions); summary.json has the totals.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BYTES_PER_NUMBER = 4  # fp32
MB = 1e6  # bytes


def numel(*parts: dict, stacked: bool = False) -> int:
    """Numbers in ONE copy of the tensors ``parts`` (dicts name -> tensor; ``stacked``: a leading client axis to
    drop). Parameters and buffers alike: what a method averages, it sends."""
    return sum((v[0] if stacked else v).numel() for part in parts for v in part.values())


@dataclass(frozen=True)
class Traffic:
    """Numbers sent in one round, summed over its clients: ``up`` client -> server, ``down`` server -> client."""

    up: int
    down: int

    @staticmethod
    def both_ways(clients: torch.Tensor | int, per_client: int) -> Traffic:
        """Every client of the round sends ``per_client`` numbers up and receives as many."""
        m = clients if isinstance(clients, int) else len(clients)
        return Traffic(m * per_client, m * per_client)

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.up + other.up, self.down + other.down)


NONE = Traffic(0, 0)


def round_metrics(traffic: Traffic, history: list[dict]) -> dict:
    """The round's ``comm/*`` metrics; the running totals continue those of the last logged round in ``history``."""
    prev = next((h for h in reversed(history) if "comm/up_MB_cum" in h), {})
    up = traffic.up * BYTES_PER_NUMBER / MB
    down = traffic.down * BYTES_PER_NUMBER / MB
    up_cum = prev.get("comm/up_MB_cum", 0.0) + up
    down_cum = prev.get("comm/down_MB_cum", 0.0) + down
    return {
        "comm/up_MB": up,
        "comm/down_MB": down,
        "comm/up_MB_cum": up_cum,
        "comm/down_MB_cum": down_cum,
        "comm/MB_cum": up_cum + down_cum,
    }


def totals(history: list[dict]) -> dict:
    """summary.json's ``communication``: MB sent up, down and both over the run (its last logged round)."""
    last = next((h for h in reversed(history) if "comm/up_MB_cum" in h), None)
    if last is None:
        return {}
    return {"up_MB": last["comm/up_MB_cum"], "down_MB": last["comm/down_MB_cum"], "MB": last["comm/MB_cum"]}


__all__ = ["BYTES_PER_NUMBER", "MB", "NONE", "Traffic", "numel", "round_metrics", "totals"]
