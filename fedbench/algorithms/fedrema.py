"""FedReMa (Liang et al., ECAI 2024): personalized FL via the most relevant clients.

Algorithm 2 of the paper ([P] paper, [C] the official code github.com/liangh68/FedReMa, [REC] our choice):

* clients train their full model {θ, φ_k} with plain CE (FedAvg clients, Alg. 2 l. 2-6);
* the server averages the feature extractors θ̂_k by n_k (Eq. 6) and aggregates the classifiers (heads)
  per client: during the critical co-learning period (CCP) by maximum difference segmentation (MDS,
  Alg. 1) of the soft-logit similarity matrix S (Eq. 5) with head weights of Eq. 7, counting the chosen
  peers in the dependency map G; the CCP ends for good when the round's mean max-difference falls below
  δ times its historical maximum (Eq. 8-9); afterwards heads are the G-weighted averages of Eq. 10.

How the heads are mixed (``head_update``, ``head_pairing``): Eq. 7/10 as written compute every φ_k from the round's
uploaded heads by client id; the code visits the clients by ascending id and writes each new head into the module the
upload list references (later clients mix heads already replaced this round), and it pairs the id-indexed weights with
the heads in their random upload order. Both are one mixing matrix (:func:`head_mixing`).

Variants of Table 4: +F aligns body features to the server's class prototypes, +A trains the head and then the body
in two phases. All options live in conf/algorithm/fedrema.yaml. The server rules are the pure tensor functions below
(batched over all clients, no loops over pairs).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import vmap

from .. import seeding
from ..checks import boolean, int_at_least, number, one_of
from ..communication import Traffic, numel
from ..engine.executor import LocalResult
from ..engine.functional import cross_entropy
from ..engine.masking import pad_aware
from ..engine.schedule import make_schedule
from ..engine.stack import broadcast, mix, rows, select, set_rows, weighted_mean
from ..errors import ConfigError
from ..losses import prototype_alignment
from ..prototypes import class_means, client_outputs, global_prototypes
from . import register
from .base import Algorithm
from .local import LocalInputs, LocalSpec


# ---- server rules (pure tensor functions) ------------------------------------------------------------
def soft_logit_similarity(
    fm, heads, head_buffers, probes: torch.Tensor, temperature: float, symmetric: bool = False
) -> torch.Tensor:
    """Eq. 5, all rows at once: ``S[k, j] = cos(softmax(φ_k(h_k)/M), softmax(φ_j(h_k)/T))``, ``S[k, k] = 1``.

    ``heads``/``head_buffers``: stacked head parameters (names ``head.*``) of N clients; ``probes``: [N, d],
    row k is client k's probe h_k. φ(h) runs the whole head (all FC layers) in eval mode. T = 1 for the
    peers as in the code (``compute_similarity_guassian``) unless ``symmetric`` (the paper: M for everybody).
    """
    fm.set_mode(False)
    try:
        z = vmap(fm.head, in_dims=(0, 0, None))(heads, head_buffers, probes)  # z[j, k] = φ_j(h_k): [N, N, C]
    finally:
        fm.set_mode(True)
    z = z.transpose(0, 1)  # z[k, j] = φ_j(h_k)
    n = z.shape[0]
    own = torch.softmax(z[torch.arange(n), torch.arange(n)] / temperature, dim=-1)  # p_k, [N, C]
    peers = torch.softmax(z / (temperature if symmetric else 1.0), dim=-1)  # p_j, [N, N, C]
    s = F.cosine_similarity(own.unsqueeze(1), peers, dim=-1)
    return s.fill_diagonal_(1.0)


def mds(S: torch.Tensor, ignore_self_gap: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Maximum difference segmentation (Alg. 1), every row of ``S`` [R ≤ N, N] at once (row k = client k).

    Sort row k ascending, take the gaps between neighbours, split at the largest gap and keep the entries
    above it: returns (A [R, N] bool, A[k, i] = i is in client k's relevant set; Δs* [R], the gaps).
    ``ignore_self_gap`` drops the last gap (the jump to the self-entry, which is 1) as the code does
    (``sim_diff[:-1]``); without it A_k is often {k}. On ties the first (lowest) largest gap wins, i.e. the larger
    set (``np.argmax`` in the code). [REC] A row without any positive gap (all peers tie, or N ≤ 2 so no gap
    is left) keeps every client: a zero gap separates nothing (the code would drop one arbitrary client,
    or fail for N = 2). Client k itself is always in A_k.
    """
    n = S.shape[1]
    vals, order = torch.sort(S, dim=1, stable=True)
    gaps = vals.diff(dim=1)
    if ignore_self_gap:
        gaps = gaps[:, :-1]
    if gaps.shape[1] == 0:
        return torch.ones_like(S, dtype=torch.bool), S.new_zeros(S.shape[0])
    best = gaps.amax(dim=1)
    m = gaps.argmax(dim=1)  # first maximal gap (documented torch behaviour)
    above = torch.arange(n, device=S.device).unsqueeze(0) > m.unsqueeze(1)
    above |= (best <= 0).unsqueeze(1)
    A = torch.zeros_like(above).scatter(1, order, above)
    r = torch.arange(S.shape[0], device=S.device)
    A[r, r] = True
    return A, best


def relevant_weights(A: torch.Tensor, n: torch.Tensor, by_samples: bool = True) -> torch.Tensor:
    """Eq. 7 as a matrix: ``W[k, i] = n_i / Σ_{A_k} n`` for i ∈ A_k (``by_samples``: the paper's weights
    by sample count)
    or ``1/|A_k|`` (the code's uniform weights); the same when all n_k are equal, as in the paper's tables."""
    w = A.to(torch.float64) * (n.to(torch.float64).unsqueeze(0) if by_samples else 1.0)
    return w / w.sum(1, keepdim=True)


def dependency_weights(G: torch.Tensor) -> torch.Tensor:
    """Eq. 10 as a matrix: ``W[k, i] = g_ki / Σ_j g_kj``. A row of zeros (a client that never took part in
    the CCP, only possible with partial participation) keeps its own head [REC]."""
    G = G.to(torch.float64)
    eye = torch.eye(G.shape[0], dtype=G.dtype, device=G.device)
    tot = G.sum(1, keepdim=True)
    return torch.where(tot > 0, G / tot.clamp(min=1e-300), eye)


def head_mixing(W: torch.Tensor, update: str = "simultaneous", upload_perm: torch.Tensor | None = None) -> torch.Tensor:
    """The matrix M with ``new heads = M @ uploaded heads`` for the Eq. 7/10 weights ``W`` [N, N] (row k: client k's
    weights by client id, clients in ascending id order).

    ``upload_perm`` (the code's ``zip(weights, uploaded_heads)``): the j-th uploaded head is client
    ``upload_perm[j]``'s,
    and the weight of the j-th client by id goes to it, i.e. column ``upload_perm[j]`` gets ``W[:, j]``; None = by id.
    ``update="simultaneous"``: Eq. 7/10 as written, M = W. ``"sequential_inplace"``: the code's loop over the clients
    in ascending id order that overwrites each client's head before the next client mixes, so row k of M combines
    the already updated rows < k: ``M[k] = W[k] @ M`` with M starting as the identity.
    """
    if upload_perm is not None:
        paired = torch.empty_like(W)
        paired[:, upload_perm.to(W.device)] = W
        W = paired
    if update == "simultaneous":
        return W
    M = torch.eye(W.shape[0], dtype=W.dtype, device=W.device)
    for k in range(W.shape[0]):
        M[k] = W[k] @ M
    return M


def round_probes(
    seed: int,
    t: int,
    num_clients: int,
    dim: int,
    scale: float,
    clients: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The probes h_k ~ U[0, scale)^d of Eq. 5 for round t, one per client (all K drawn at once, keyed by (seed, t),
    so a client's probe does not depend on who else takes part), rows for ``clients``."""
    g = seeding.torch_generator(seed, "probe", t)
    return (torch.rand(num_clients, dim, generator=g, dtype=dtype) * float(scale))[clients.long().cpu()]


def ccp_continues(history: list[float], delta: float) -> bool:
    """Eq. 9 as in the code's ``check_critical``: the CCP goes on while the latest mean max-difference Δs̄_t is
    the maximum so far or ``Δs̄_t / max_τ Δs̄_τ ≥ δ`` (the paper writes ``> δ``; only equality differs)."""
    last, peak = history[-1], max(history)
    return not (peak > 0 and last < delta * peak)


# ---- the algorithm -------------------------------------------------------------------------------------
@register
class FedReMa(Algorithm):
    """Algorithm 2 of the paper; per-round state: global body θ, personal heads φ_k, G, the Δs̄ history, CCP flag."""

    name = "fedrema"
    state_attrs = (
        "theta",
        "theta_buf",
        "body_buf",
        "phi",
        "phi_buf",
        "G",
        "history",
        "in_ccp",
        "ccp_end_round",
        "protos",
        "has_proto",
        "log",
    )

    def setup(self):
        hp = self.hp
        for key, check in (
            ("delta", number(0, 1)),
            ("temperature", number(0, lo_open=True)),
            ("probe_scale", number(0, lo_open=True)),
            ("lam", number(0)),
            ("relevant_weights", one_of("samples", "uniform")),
            ("plot_every", int_at_least(0)),
            ("head_update", one_of("simultaneous", "sequential_inplace")),
            ("head_pairing", one_of("by_id", "upload_order")),
            ("bn_stats", one_of("local", "averaged")),
            *(
                (k, boolean())
                for k in ("symmetric_temperature", "ignore_self_gap", "ccp", "align", "alternate", "head_phase_clip")
            ),
        ):
            self.checked_hp(key, check)
        net = self.fm.net
        self.body_names, self.head_names = self.fm.names("body"), self.fm.names("head")
        if not self.head_names:
            raise ConfigError(
                "model", self.cfg.model.name, "a model with a head (FC layers after the feature extractor)"
            )
        self.body_bufs = [n for n in self.fm.buffer_names if net.part_of(n, "body")]
        self.head_bufs = [n for n in self.fm.buffer_names if net.part_of(n, "head")]
        self.feature_dim = net.feature_dim
        w, bn = self.initial_model()
        self.theta, self.theta_buf = select(w, self.body_names), select(bn, self.body_bufs)  # θ (Eq. 6)
        # BatchNorm running statistics (``bn_stats``): ``local`` = each client keeps its own, body and head (the code:
        # set_base / set_head copy parameters only); ``averaged`` = they travel with their layer's parameters (body:
        # n_k-weighted like θ, Eq. 6; head: mixed with the head weights, Eq. 7/10)
        self.body_buf = broadcast(self.theta_buf, self.K) if hp.bn_stats == "local" else {}
        self.phi = broadcast(select(w, self.head_names), self.K)  # φ_k per client
        self.phi_buf = broadcast(select(bn, self.head_bufs), self.K)
        # local training: CE (Alg. 2) or +F's CE + λ·MSE(h, P̄_y); +A: the head (own optimizer phase), then the body
        self.train_spec = self.train_spec.replace(loss=self.aligned_loss if hp.align else cross_entropy)
        self.head_spec = LocalSpec(
            "train_head",
            trainable=self.head_names,
            opt=self.opt if hp.head_phase_clip else self.opt.replace(clip_grad_norm=None),
            persist_opt_state=bool(self.cfg.optim.persistent_state),
        )
        self.body_spec = self.train_spec.replace(trainable=self.body_names)
        self.G = torch.zeros(self.K, self.K, dtype=torch.float64, device=self.data.x.device)  # G: times k chose i
        self.history: list[float] = []  # Δs̄_t of the CCP rounds (Eq. 8, as a mean)
        self.in_ccp = True  # CCP flag (Eq. 9)
        self.ccp_end_round: int | None = None
        C = self.data.num_classes
        self.protos = torch.zeros(C, self.feature_dim, dtype=self.data.x.dtype, device=self.data.x.device)  # P̄ (+F)
        self.has_proto = torch.zeros(C, dtype=torch.bool, device=self.data.x.device)  # none before round 1 (code)
        self.log = {"mean_max_diff": [], "max_diffs": [], "relevant": [], "ccp": []}  # full history for finish()

    # ---- one round (Alg. 2) ------------------------------------------------------------------------
    def round(self, t, clients):
        m, hp = len(clients), self.hp
        n = self.n[clients.long()]
        params, buffers = self.client_models(clients, t)  # {θ^(t-1), φ_k^(t-1)}
        res, metrics = self.client_update(t, clients, params, buffers)
        self.sent = self.model_traffic(clients)
        if hp.align:  # clients upload class means (+F)
            self.protos, self.has_proto = self.prototypes(t, clients, res)
        self.theta = weighted_mean(select(res.params, self.body_names), n)  # Eq. 6
        if hp.bn_stats == "local":
            set_rows(self.body_buf, clients, select(res.buffers, self.body_bufs))
        else:
            self.theta_buf = weighted_mean(select(res.buffers, self.body_bufs), n)
        heads, head_buf = select(res.params, self.head_names), select(res.buffers, self.head_bufs)

        S = self.similarity(t, clients, heads, head_buf)  # Eq. 5 (every round, as the code)
        A, gaps = mds(S, bool(hp.ignore_self_gap))  # Alg. 1, every row at once
        was_ccp = self.in_ccp
        ids = clients.long().to(self.G.device)
        if was_ccp:
            W = relevant_weights(A, n, hp.relevant_weights == "samples")  # Eq. 7
            self.G[ids.unsqueeze(1), ids.unsqueeze(0)] += A.to(self.G.dtype)  # count the chosen peers (l. 16)
            self.history.append(float(gaps.mean()))  # Eq. 8 (as a mean)
            if hp.ccp and not ccp_continues(self.history, float(hp.delta)):  # Eq. 9: the CCP ends for good
                self.in_ccp, self.ccp_end_round = False, t
                self.announce_ccp_end(t)
        else:
            W = dependency_weights(self.G[ids][:, ids])  # Eq. 10 (G frozen)
        perm = None  # the code's random upload order
        if hp.head_pairing == "upload_order":
            perm = torch.as_tensor(seeding.rng(self.seed, "upload_order", t).permutation(m))
        M = head_mixing(W, hp.head_update, perm)
        set_rows(self.phi, clients, mix(heads, M))  # φ_k^(t) = Σ_i M_ki φ̂_i
        set_rows(self.phi_buf, clients, head_buf if hp.bn_stats == "local" else mix(head_buf, M))
        metrics.update(self.diagnostics(t, clients, S, A, gaps, was_ccp))
        return metrics

    def model_traffic(self, clients) -> Traffic:
        """The full model both ways (§4: clients upload θ̂_k and φ̂_k; each gets θ and its own φ_k back); BatchNorm
        statistics only with ``bn_stats: averaged``. +F adds the class means (:meth:`prototypes`)."""
        model = numel(self.theta) + numel(self.phi, stacked=True)
        if self.hp.bn_stats == "averaged":
            model += numel(self.theta_buf) + numel(self.phi_buf, stacked=True)
        return Traffic.both_ways(clients, model)

    def traffic(self, t, clients):
        return self.sent

    def diagnostics(self, t, clients, S, A, gaps, was_ccp) -> dict:
        """Per round (the code's logs, Fig. 3): Δs̄_t and its running max, the CCP flag, |A_k| (CCP rounds);
        S every ``plot_every`` rounds
        (+ round 1, the CCP's last round, the last round); the per-round history kept for ``finish``."""
        ids = clients.long().cpu()
        full_gaps = torch.full((self.K,), float("nan"), dtype=torch.float64)  # Δs*_k by client id (NaN: not sampled)
        full_gaps[ids] = gaps.double().cpu()
        full_A = torch.zeros(self.K, self.K, dtype=torch.bool)
        full_A[ids.unsqueeze(1), ids.unsqueeze(0)] = A.cpu()
        self.log["mean_max_diff"].append(float(gaps.mean()))
        self.log["max_diffs"].append(full_gaps.numpy())
        self.log["ccp"].append(was_ccp)
        out = {
            "fedrema/mean_max_diff": float(gaps.mean()),
            "fedrema/max_diff_running_max": max(self.history),
            "fedrema/ccp": int(was_ccp),
        }
        if was_ccp:
            self.log["relevant"].append(full_A.numpy())
            out["fedrema/relevant_set_size_mean"] = float(A.sum(1).double().mean())
            out["fedrema/relevant_set_sizes"] = full_A.sum(1).tolist()  # |A_k| per client id (0: not sampled)
        every = int(self.hp.plot_every)
        if (every and t % every == 0) or t == 1 or t == int(self.cfg.rounds) or self.ccp_end_round == t:
            self.publish_matrix(
                "similarity",
                t,
                S,
                title=f"FedReMa S (round {t}{', CCP' if was_ccp else ''})",
                xlabel="client j",
                ylabel="client k",
            )  # colour scale = the round's range
        return out

    def client_update(self, t, clients, params, buffers) -> tuple[LocalResult, dict]:
        """Local training: plain CE (Alg. 2); +F adds λ·MSE(h, P̄_y); +A trains the head, then the body (Table 4)."""
        hp = self.hp
        inputs = LocalInputs(shared={"protos": self.protos, "has_proto": self.has_proto} if hp.align else {})
        if not hp.alternate:
            res = self.local_train(t, clients, (params, buffers), self.train_spec, inputs)
            return res, {"train/loss": res.loss.mean().item()}
        # +A (code train_separately[_with_proto]): E epochs head only, then E epochs body only, one optimizer
        first = self.local_train(t, clients, (params, buffers), self.head_spec)
        res = self.local_train(t, clients, (first.params, first.buffers), self.body_spec, inputs)
        return res, {"train/loss": res.loss.mean().item(), "train/loss_head_phase": first.loss.mean().item()}

    @pad_aware
    def aligned_loss(self, fm, p, b, x, y, ctx):
        """+F for ONE client (pure, runs under vmap): CE + λ·MSE(h, P̄_y) (code ``train_with_proto``, Table 4)."""
        h = fm.features(p, b, x)
        ce = F.cross_entropy(fm.head(p, b, h), y)
        return ce + float(self.hp.lam) * prototype_alignment(h.flatten(1), y, ctx["protos"], ctx["has_proto"])

    def client_prototypes(self, t, clients, res: LocalResult) -> tuple[torch.Tensor, torch.Tensor]:
        """+F: each client's class means of its trained body's features (code ``collect_protos``): eval mode, one pass
        over ``load_train_data()`` — its train split, shuffled, in batches of B with drop_last as the run's
        ``drop_last`` (the code: true, so the last incomplete batch's samples are left out).
        (means [M, C, d], counts)."""
        ids = clients.tolist()
        epoch = make_schedule(
            [self.data.train_idx[k] for k in ids],
            ids,
            int(self.cfg.batch_size),
            self.seed,
            "protos",
            t,
            epochs=1,
            drop_last=bool(self.cfg.drop_last),
            device=self.data.x.device,
        )
        idx = [torch.cat(b).cpu().numpy() if b else np.empty(0, np.int64) for b in epoch]
        feats = client_outputs(self.ctx, self.fm.features, res.params, res.buffers, idx)
        return class_means(feats, [self.data.y[self.data.tensor(i)] for i in idx], self.data.num_classes)

    def prototypes(self, t, clients, res: LocalResult):
        """+F: P̄_c = mean of the clients' class-c means over the clients that have class c (``proto_aggregation``)."""
        means, counts = self.client_prototypes(t, clients, res)
        d = self.feature_dim  # up: a mean per class held; down: the P̄_c that existed at the round's start
        self.sent += Traffic(int((counts > 0).sum()) * d, len(clients) * int(self.has_proto.sum()) * d)
        return global_prototypes(means, counts)

    def similarity(self, t, clients, heads, head_buf) -> torch.Tensor:
        """S^(t) over the round's clients, one fresh probe h_k ~ U[0, probe_scale)^d per client (Eq. 5)."""
        x = self.data.x
        probes = round_probes(self.seed, t, self.K, self.feature_dim, float(self.hp.probe_scale), clients, x.dtype)
        with torch.no_grad():
            return soft_logit_similarity(
                self.fm,
                heads,
                head_buf,
                probes.to(x.device),
                float(self.hp.temperature),
                bool(self.hp.symmetric_temperature),
            )

    def announce_ccp_end(self, t: int) -> None:
        """One console line when the CCP ends (the round's metrics carry ``fedrema/ccp`` too)."""
        last, peak = self.history[-1], max(self.history)
        msg = (
            f"FedReMa: critical co-learning period ended at round {t} (Δs̄={last:.4f} < δ·max={float(self.hp.delta)}"
            f"·{peak:.4f}); classifiers now follow the dependency map G (Eq. 10)"
        )
        self.ctx.say(msg)

    # ---- evaluation & end of run ---------------------------------------------------------------------
    def client_models(self, clients, t):
        """Client k's model: the global body θ with its body BatchNorm statistics (``bn_stats``), its head φ_k."""
        m = len(clients)
        body_buf = rows(self.body_buf, clients) if self.hp.bn_stats == "local" else broadcast(self.theta_buf, m)
        return {**broadcast(self.theta, m), **rows(self.phi, clients)}, {**body_buf, **rows(self.phi_buf, clients)}

    def finish(self, run_dir) -> dict:
        """The dependency map G (saved and drawn), its Eq. 10 weights, the per-round MDS history; CCP summary."""
        T = int(self.cfg.rounds)
        self.publish_matrix(
            "dependency_map",
            T,
            self.G,
            title="FedReMa dependency map G (times k chose i)",
            xlabel="chosen client i",
            ylabel="client k",
            cmap="Blues",
        )
        d = self.ctx.out_dir / "diagnostics"
        np.save(d / "dependency_map" / "weights.npy", dependency_weights(self.G).cpu().numpy())
        np.savez_compressed(
            d / "fedrema_history.npz",
            mean_max_diff=np.array(self.log["mean_max_diff"]),
            ccp=np.array(self.log["ccp"]),
            ccp_history=np.array(self.history),
            max_diffs=np.array(self.log["max_diffs"]),
            relevant_sets=np.array(self.log["relevant"]).reshape(-1, self.K, self.K),
        )
        return {
            "ccp_rounds": len(self.history),
            "ccp_end_round": self.ccp_end_round,
            "max_diff_peak": max(self.history) if self.history else None,
            "dependency_map": self.G.cpu().tolist(),
        }


__all__ = [
    "FedReMa",
    "soft_logit_similarity",
    "mds",
    "relevant_weights",
    "dependency_weights",
    "head_mixing",
    "round_probes",
    "ccp_continues",
]
