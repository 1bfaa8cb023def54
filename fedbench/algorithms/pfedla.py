"""pFedLA (Ma, Zhang, Guo, Xu, CVPR 2022): layer-wised personalized aggregation by per-client hypernetworks.

A baseline of ECL Table 1 (docs/pfl_baselines_b.md).
The authors released no code; the hypernetwork, its initialisation, the
hyperparameters and the update follow the public re-implementation ``KarhouTam/pFedLA`` (its README: "not the
official repo") and the same author's FL-bench ``pfedla``. Round t, client i (§3, Fig. 2):

1. the server's hypernetwork HN_i(v_i; φ_i) (embedding v_i -> 3-layer ReLU MLP -> one linear map per layer l)
   gives non-negative weights α_i^l ∈ R^N, normalised to sum 1 per layer (§3.2);
2. personalized model, layer by layer: θ̄_i^l = Σ_j α_{ij}^l θ_j^l over the stored models θ_j of ALL N
   clients (Eq. 3); the client trains it with CE (E epochs) and uploads Δθ_i = θ_i' − θ̄_i;
3. server (§3.3): θ_i ← θ̄_i + Δθ_i, and the hypernetwork takes one step through θ̄_i(φ_i):
   ``hn_update=pfedla_code`` (default): φ_i ← φ_i − η_hn (∂θ̄_i/∂φ_i)^T Δθ_i, the update of both public pFedLA
   codes (KarhouTam/pFedLA: ``grad_outputs = diff``, diff = trained − start, then ``param -= hn_lr * grad``;
   FL-bench: ``grad_outputs = -diff`` with diff = start − trained, then SGD), i.e. Δθ_i used in place of
   ∇_θ̄ L_i. ``pfedhn``: φ_i ← φ_i − η_hn (∂θ̄_i/∂φ_i)^T (θ̄_i − θ_i'), pFedHN's official rule
   (``grad_outputs = inner_state − final_state``). Since Δθ_i ≈ −η Σ∇L, ``pfedhn`` descends the local loss to
   first order and ``pfedla_code`` ascends it; the codes' sign is the default because they are the public
   implementations that ECL's Table 1 (the only seed table with pFedLA; ECL gives no code) most likely ran.
Optional HeurpFedLA (§3.4): the ``retain_layers`` layers with the largest self-weight α_ii^l keep θ_i^l.

Round-synchronous: all clients of a round mix the models stored at the start of the round. BatchNorm
statistics are not aggregated (each client keeps its own, as the re-implementation's non-trainable tensors).
"""

from __future__ import annotations

import math

import torch
from torch.func import grad, vmap

from .. import seeding
from ..checks import int_at_least, number, one_of
from ..communication import Traffic
from ..engine.stack import Stack, broadcast, rows, set_rows
from . import register
from .base import Algorithm
from .fedala import param_layers


def init_hypernetwork(K: int, L: int, emb: int, hidden: int, seed: int, k: int, dtype, device) -> Stack:
    """Client k's hypernetwork (re-implementation ``HyperNetwork``): embedding ~ N(0, 1); MLP layers with torch's
    default Linear init U(±1/√fan_in); the L per-layer output maps with weight ~ U(0, 1), bias 0."""
    g = seeding.torch_generator(seed, "pfedla_hn", k)
    u = lambda *shape, bound: (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * bound  # noqa: E731
    hn = {"embedding": torch.randn(emb, generator=g, dtype=torch.float64)}
    fan_in = emb
    for i in range(3):
        b = 1 / math.sqrt(fan_in)
        hn[f"mlp{i}.weight"], hn[f"mlp{i}.bias"] = u(hidden, fan_in, bound=b), u(hidden, bound=b)
        fan_in = hidden
    hn["out.weight"] = torch.rand(L, K, hidden, generator=g, dtype=torch.float64)
    hn["out.bias"] = torch.zeros(L, K, dtype=torch.float64)
    return {n: v.to(dtype=dtype, device=device) for n, v in hn.items()}


def layer_weights(hn: Stack, self_id: torch.Tensor, retain: int = 0) -> torch.Tensor:
    """α [L, N] of ONE client's hypernetwork (pure; vmap over clients): ReLU outputs normalised per layer;
    a layer whose outputs are all 0 keeps the own model (one-hot), as do the ``retain`` layers with the
    largest self-weight (HeurpFedLA)."""
    z = hn["embedding"]
    for i in range(3):
        z = torch.relu(hn[f"mlp{i}.weight"] @ z + hn[f"mlp{i}.bias"])
    a = torch.relu(hn["out.weight"] @ z + hn["out.bias"])  # [L, N]
    own = (torch.arange(a.shape[1], device=a.device) == self_id).to(a.dtype).expand_as(a)  # one-hot (vmap-safe)
    if retain > 0:
        keep = torch.zeros(a.shape[0], dtype=torch.bool, device=a.device)
        keep = keep.scatter(0, torch.topk(a.detach() @ own[0], retain).indices, True)
        a = torch.where(keep.unsqueeze(1), own, a)
    s = a.sum(1, keepdim=True)
    return torch.where(s > 0, a / torch.where(s > 0, s, torch.ones_like(s)), own)


def layerwise_mix(models: Stack, alpha: torch.Tensor, layers: list[list[str]]) -> Stack:
    """θ̄_i^l = Σ_j α[i, l, j] θ_j^l (Eq. 3) for every client i: ``alpha`` [M, L, N], ``models`` stacked over N."""
    out = {}
    for l, names in enumerate(layers):
        for n in names:
            out[n] = torch.tensordot(alpha[:, l].to(models[n]), models[n], dims=([1], [0]))
    return out


@register
class PFedLA(Algorithm):
    """State: every client's model θ_j (kept by the server) and buffers, one hypernetwork per client (stacked)."""

    name = "pfedla"
    state_attrs = ("P", "B", "hn")

    def setup(self):
        for key, check in (
            ("embedding_dim", int_at_least(1)),
            ("hidden_dim", int_at_least(1)),
            ("hn_lr", number(0, lo_open=True)),
            ("retain_layers", int_at_least(0)),
        ):
            self.checked_hp(key, check)
        # sign of Δθ_i in the hypernetwork step: the pFedLA codes' (−) or pFedHN's (+, descent on the local loss)
        self.hn_sign = {"pfedla_code": -1.0, "pfedhn": 1.0}[
            self.checked_hp("hn_update", one_of("pfedla_code", "pfedhn"))
        ]
        w, bn = self.initial_model()
        self.P, self.B = broadcast(w, self.K), broadcast(bn, self.K)
        self.layers = param_layers(self.fm.param_names)
        hp, x = self.hp, self.data.x
        hns = [
            init_hypernetwork(
                self.K, len(self.layers), int(hp.embedding_dim), int(hp.hidden_dim), self.seed, k, x.dtype, x.device
            )
            for k in range(self.K)
        ]
        self.hn = {n: torch.stack([h[n] for h in hns]) for n in hns[0]}

    def alphas(self, clients) -> torch.Tensor:
        """α [m, L, N] of the clients' hypernetworks."""
        ids = clients.long().to(self.data.x.device)
        return vmap(lambda h, i: layer_weights(h, i, int(self.hp.retain_layers)))(rows(self.hn, clients), ids)

    def round(self, t, clients):
        with torch.no_grad():
            alpha = self.alphas(clients)
            start = layerwise_mix(self.P, alpha, self.layers)  # θ̄_i (Eq. 3)
            own = alpha[torch.arange(len(clients)), :, clients.long()] == 1  # [m, L] layers = the client's own
            sizes = torch.tensor([sum(self.P[n][0].numel() for n in names) for names in self.layers])
            self.sent = Traffic(len(clients) * int(sizes.sum()), int(((~own).cpu().long() * sizes).sum()))
        res = self.local_train(t, clients, (start, rows(self.B, clients)), self.train_spec)
        self.update_hypernetworks(clients, {n: res.params[n] - start[n] for n in start})  # Δθ_i = θ_i' − θ̄_i
        set_rows(self.P, clients, res.params)  # θ_i ← θ̄_i + Δθ_i
        set_rows(self.B, clients, res.buffers)
        return {
            "train/loss": res.loss.mean().item(),
            "pfedla/self_weight": float(alpha[torch.arange(len(clients)), :, clients.long()].mean()),
        }

    def update_hypernetworks(self, clients, delta: Stack) -> None:
        """φ_i ← φ_i − η_hn ∇_φ ⟨θ̄_i(φ_i), g_i⟩ (§3.3) with g_i = Δθ_i = θ_i' − θ̄_i (``pfedla_code``) or −Δθ_i
        (``pfedhn``). ⟨θ̄_i^l, g^l⟩ is linear in α_i: its coefficients G[i, l, j] = ⟨θ_j^l, g_i^l⟩ (stored models
        at the round's start), so the vector-Jacobian product is the gradient of Σ_{l,j} α[i, l, j] G[i, l, j] —
        exact, batched over the clients."""
        m = len(clients)
        g = {n: -self.hn_sign * d for n, d in delta.items()}
        G = torch.zeros(m, len(self.layers), self.K, dtype=self.data.x.dtype, device=self.data.x.device)
        for l, names in enumerate(self.layers):
            for n in names:
                G[:, l] += g[n].flatten(1) @ self.P[n].flatten(1).T
        retain = int(self.hp.retain_layers)
        surrogate = lambda h, i, c: (layer_weights(h, i, retain) * c).sum()  # noqa: E731
        grads = vmap(grad(surrogate))(rows(self.hn, clients), clients.long().to(G.device), G)
        set_rows(self.hn, clients, {n: rows(self.hn, clients)[n] - float(self.hp.hn_lr) * grads[n] for n in self.hn})

    def traffic(self, t, clients):
        """Down: θ̄_i layer by layer (Eq. 3), except the layers that are the client's own model (HeurpFedLA's retained
        layers, §3.4: nothing to send); up: Δθ_i, all parameters (§3.3). BatchNorm statistics stay local."""
        return self.sent

    def client_models(self, clients, t):
        """The personalized models the clients would download now: θ̄_i from the current hypernetworks."""
        with torch.no_grad():
            return layerwise_mix(self.P, self.alphas(clients), self.layers), rows(self.B, clients)


__all__ = ["PFedLA", "init_hypernetwork", "layer_weights", "layerwise_mix"]
