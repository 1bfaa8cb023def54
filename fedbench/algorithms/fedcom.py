"""FedCOM (Lu, Liang, Zhang, Wang, Zou, Crowcroft): Ditto + gradient-based complementary client matching
+ a personal merge with the matched peer before the personal update (FedCOM §3, Alg. 1-2)."""

from __future__ import annotations

import numpy as np
import torch

from ..communication import Traffic, numel
from ..engine.stack import mix
from ..errors import ConfigError
from . import register
from .ditto import Ditto


def important_channels(g: torch.Tensor, classes: torch.Tensor, x: int) -> torch.Tensor:
    """idx_k = indices of the x smallest entries of g_k[c_k, :] (FedCOM §3.1, Alg. 1 line 5).

    ``g`` [M, C, d] classifier-weight gradients, ``classes`` [M] minority classes c_k -> [M, x].
    Smallest = most negative = the weight to class c_k grew most (g = W_before - W_after).
    """
    row = g[torch.arange(len(classes), device=g.device), classes]  # g_k[c_k, :], [M, d]
    return torch.topk(row, x, dim=1, largest=False, sorted=True).indices


def matching_scores(g: torch.Tensor, classes: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """S[k, p] = sum_{j in idx_k} g_p[c_k, j] for every requester k and candidate p (Alg. 1 line 6), one gather."""
    per_candidate = g[:, classes, :]  # [P, K, d]: g_p[c_k, :]
    picked = per_candidate.gather(2, idx.unsqueeze(0).expand(g.shape[0], -1, -1))  # [P, K, x]
    return picked.sum(2).T  # [K, P]


def complementary_peers(scores: torch.Tensor, exclude_self: bool) -> torch.Tensor:
    """k_com = argmin_p S[k, p]; with ``exclude_self`` p = k is not a candidate (our choice: the
    paper's argmin over all p tends to return k)."""
    if exclude_self:
        scores = scores.masked_fill(torch.eye(len(scores), dtype=torch.bool, device=scores.device), float("inf"))
    return scores.argmin(1)


@register
class FedCOM(Ditto):
    """Per round t (Alg. 2), all clients as stacks:

    1. global step: w_k^t from w^t (Ditto step 1); g_k = W^t - W_k^t of the last FC layer;
    2. idx_k = top-x smallest channels of g_k[c_k] (c_k = the client's minority class);
    3. k_com = argmin_{p != k} sum_{j in idx_k} g_p[c_k, j];
    4. v_k <- MEAN(v_k, v_{k_com}) (Eq. 2), from the personal models stored at the start of round t;
    5. s local iterations on F_k(v_k) + lambda/2 ||v_k - w^t||^2 (Eq. 3, Ditto step 2);
    6. w^{t+1} = FedAvg of the w_k^t.
    """

    name = "fedcom"
    state_attrs = (*Ditto.state_attrs, "match_hits", "match_total")

    def setup(self):
        super().setup()
        info = self.data.info
        if "minority_class" not in info:
            raise ConfigError(
                "partition",
                self.cfg.partition.name,
                "complementary_pairs (FedCOM needs each client's minority class c_k, FedCOM §3.1, Alg. 1)",
            )
        weights = [n for n in self.fm.names("classifier") if self.w[n].dim() == 2]
        self.classifier = weights[0]  # W: [C, d], rows = classes, cols = channels
        d = self.w[self.classifier].shape[1]
        x = self.hp.top_x
        if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= d:
            raise ConfigError("algorithm.top_x", x, f"an integer in [1, {d}] (input width of {self.classifier})")
        if not isinstance(self.hp.exclude_self, bool):
            raise ConfigError("algorithm.exclude_self", self.hp.exclude_self, "true | false")
        self.minority = torch.as_tensor(np.asarray(info["minority_class"]), dtype=torch.long)  # c_k
        self.partner = torch.as_tensor(np.asarray(info["partner"]), dtype=torch.long) if "partner" in info else None
        self.match_hits, self.match_total = 0, 0  # Table 2: correct (client, round) matches so far

    def personal_start(self, t, clients, glob):
        clients = clients.long()
        W = self.classifier
        g = self.w[W].unsqueeze(0) - glob.params[W]  # g_k = W^t - W_k^t   [M, C, d]
        c = self.minority[clients].to(g.device)
        idx = important_channels(g, c, int(self.hp.top_x))
        scores = matching_scores(g, c, idx)
        peers = clients[complementary_peers(scores, bool(self.hp.exclude_self)).cpu()]  # k_com, client ids
        # Eq. 2 as one [M, K] mixing matrix on the round-start personal models (synchronous snapshot, §9.4)
        merge = 0.5 * (torch.nn.functional.one_hot(clients, self.K) + torch.nn.functional.one_hot(peers, self.K))
        v, vb = mix(self.V, merge), mix(self.VB, merge)
        vb = {k: (vb[k] if b.is_floating_point() else b[clients]) for k, b in self.VB.items()}  # BN counters: own
        final = t == int(self.cfg.rounds)
        self.publish_matrix("matching_scores", t, scores, draw=final, xlabel="candidate p", ylabel="requester k")
        self.publish_matrix("important_channels", t, idx, draw=False)
        out = {"fedcom/peers": peers.tolist()}
        if self.partner is not None:
            hits = peers == self.partner[clients]
            self.match_hits += int(hits.sum())
            self.match_total += len(clients)
            out["fedcom/matching_acc"] = hits.double().mean().item()
        return v, vb, out

    def traffic(self, t, clients):
        """Ditto's global model both ways plus a personal model each way (FedCOM Alg. 1-2): every client uploads its
        updated v_k (the server relays it to the clients that pick k as their complementary peer) and downloads its
        peer's v_{k_com}. g_k needs no upload: the server has W^t and the uploaded W_k^t."""
        return Traffic.both_ways(clients, 2 * numel(self.w, self.bn))

    def finish(self, run_dir):
        if not self.match_total:
            return {}
        return {"matching_acc": self.match_hits / self.match_total}  # over all (client, round) matches


__all__ = ["FedCOM", "important_channels", "matching_scores", "complementary_peers"]
