"""The two-phase skeleton ECL (``ecl.py``, Lv et al., arXiv 2408.02019) shares with the long-tail personalization
baselines of its Tables 1–2 (FedAvg+LWS, FedAvg+τ-norm, FedAFA: ``lws.py``, ``tau_norm.py``, ``fedafa.py``), and the
model pieces, sampling weights and per-class diagnostics they use.

Phase I  (ECL Alg. 1 lines 1–12): any registered global FL method (``algorithm.phase_one``: FedAvg, or
         FedProx / SCAFFOLD / FedLC for Table 4) for rounds 1..T, its local lr step-decayed
         (ECL §4.1: 0.1, then 0.01 after round 200).
Phase II (Alg. 1 lines 13–20): once, at the end of round T, every client personalizes the global model
         on its own data (no communication). All clients run stacked in one ``local_train`` call per
         model (the configured executor: sequential or vectorized).

Evaluation: every evaluation before the end of round T scores the phase-I global model for every client
(Table 4's "optimizer alone" numbers); the evaluation of round T — the run's last — scores the
personalized predictors. Report ``pers/acc_present_classes.last`` (the predictors exist after phase II, ECL §3.2),
not ``.final``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call

from ..checks import boolean, int_at_least, number, one_of
from ..communication import Traffic, numel
from ..engine.functional import sub_state
from ..engine.masking import is_pad_aware
from ..engine.stack import Stack, rows
from ..errors import ConfigError
from ..metrics import confusion_counts
from . import ALGORITHMS
from .base import Algorithm
from .local import LocalInputs, LocalSpec


# ---------------------------------------------------------------------------- model pieces
def body_index(name: str, num_children: int) -> int:
    """Index of the body child that parameter/buffer ``name`` lives in (head names: ``num_children``)."""
    return int(name.split(".")[1]) if name.startswith("body.") else num_children


def run_children(
    fm, part: str, p: Stack, b: Stack, h: torch.Tensor, start: int, stop: int | None = None
) -> torch.Tensor:
    """Run children ``[start, stop)`` of ``part`` (``body`` | ``head``, both Sequentials) on ``h``, as pure
    functions."""
    children = list(getattr(fm.net, part))
    for i in range(start, len(children) if stop is None else stop):
        pre = f"{part}.{i}."
        h = functional_call(children[i], (sub_state(p, pre), sub_state(b, pre)), (h,))
    return h


def upper_logits(fm, p: Stack, b: Stack, h: torch.Tensor, start: int) -> torch.Tensor:
    """Logits from the output ``h`` of body child ``start − 1`` (``start = 0``: ``h`` is the input)."""
    return fm.head(p, b, run_children(fm, "body", p, b, h, start))


def frozen_modules(fm, trainable) -> list[str]:
    """Names of the modules with parameters or buffers of their own, none of them trainable: the frozen layers."""
    trainable = set(trainable)
    out = []
    for name, mod in fm.net.named_modules():
        own = [f"{name}.{n}" for n, _ in mod.named_parameters(recurse=False)]
        has_buffers = any(True for _ in mod.named_buffers(recurse=False))
        if (own or has_buffers) and not trainable.intersection(own):
            out.append(name)
    return out


def frozen_in_eval_mode(loss, names: list[str]):
    """``loss`` with the modules ``names`` in eval mode during its forward pass: a frozen BatchNorm normalises with
    its running statistics and leaves them unchanged (the executor puts the whole net in train mode)."""

    def wrapped(fm, p, b, x, y, ctx):
        mods = [fm.net.get_submodule(n) for n in names]
        for mod in mods:
            mod.training = False
        try:
            return loss(fm, p, b, x, y, ctx)
        finally:
            for mod in mods:
                mod.training = True

    wrapped.pad_aware = is_pad_aware(loss)
    return wrapped


def classifier_names(fm) -> tuple[str, str | None]:
    """(weight, bias or None) parameter names of the final Linear."""
    names = fm.names("classifier")
    weight = next(n for n in names if n.endswith("weight"))
    bias = next((n for n in names if n.endswith("bias")), None)
    return weight, bias


def class_balanced_weights(labels: np.ndarray) -> np.ndarray:
    """Sampling weight 1/n_y: every class in ``labels`` is drawn equally often (ECL §3.2 class-balanced sampling)."""
    if len(labels) == 0:
        return np.zeros(0)
    _, inv, cnt = np.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / cnt[inv]


# ---------------------------------------------------------------------------- class groups and mixtures
def expert_groups(counts: np.ndarray, num_experts: int, mode: str = "ceil") -> list[np.ndarray]:
    """Data grouping (ECL §3.2): the client's present classes (n_c > 0; our choice: all C classes would
    leave experts without data) sorted by n_c descending (ties: lower class index first), cut into
    ``num_experts`` contiguous groups C_1 (head) … C_M (tail). ``ceil``: groups of ⌈|C_k|/M⌉ classes, the last
    ones smaller or empty (ECL §3.2 assumes M divides C);
    ``even``: sizes differ by at most one, larger groups first (never empty while |C_k| ≥ M).
    The tail expert is the one of the last NON-empty group (``ecl.tail_expert``); empty groups have no expert."""
    counts = np.asarray(counts)
    present = np.flatnonzero(counts > 0)
    order = present[np.argsort(-counts[present], kind="stable")]
    if mode == "even":
        return [g.astype(np.int64) for g in np.array_split(order, num_experts)]
    size = -(-len(order) // num_experts)
    return [order[m * size : (m + 1) * size].astype(np.int64) for m in range(num_experts)]


def combine_logits(z: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Eq. 6 for one client: ``z`` [M+1, n, C] component logits, ``A`` [M+1, C] → [n, C]."""
    return (A.unsqueeze(1) * z).sum(0)


def class_set_accuracy(class_acc: np.ndarray, sets: list[np.ndarray]) -> float:
    """Mean over clients of client k's mean per-class accuracy over its classes ``sets[k]`` ([K, C] accuracies, NaN =
    not measured: such classes, and clients with no measured class in their set, are left out; NaN if none)."""
    vals = [np.nanmean(class_acc[k, s]) for k, s in enumerate(sets) if len(s) and not np.isnan(class_acc[k, s]).all()]
    return float(np.mean(vals)) if vals else float("nan")


def head_tail_accuracy(counts: np.ndarray, class_acc: np.ndarray) -> dict:
    """Fig. 2 diagnostics from [K, C] train counts and [K, C] per-class test accuracies (mean over clients):
    ``head_acc`` / ``tail_acc`` over each client's local head / tail classes (its present classes split in
    two by :func:`expert_groups`, M = 2); ``global_head_acc`` / ``global_tail_acc`` over its present classes
    in the more / less frequent half of the classes by total train count."""
    counts, class_acc = np.asarray(counts), np.asarray(class_acc, dtype=float)
    C = counts.shape[1]
    rank = np.argsort(-counts.sum(0), kind="stable")
    global_head = np.zeros(C, bool)
    global_head[rank[: -(-C // 2)]] = True
    halves = [expert_groups(c, 2) for c in counts]
    present = counts > 0
    return {
        "head_acc": class_set_accuracy(class_acc, [h[0] for h in halves]),
        "tail_acc": class_set_accuracy(class_acc, [h[1] for h in halves]),
        "global_head_acc": class_set_accuracy(class_acc, [np.flatnonzero(p & global_head) for p in present]),
        "global_tail_acc": class_set_accuracy(class_acc, [np.flatnonzero(p & ~global_head) for p in present]),
    }


# ---------------------------------------------------------------------------- the two-phase skeleton
class OneShotPersonalization(Algorithm):
    """Phase I: ``phase_one`` (a registered global method, the run's optimizer); phase II: once, after the
    last round, :meth:`personalize` builds each client's predictor. Subclasses implement ``personalize``.

    A personalized predictor is a list of stacked models (``self.components``, [K] rows each) mixed per class
    by ``self.mix`` [K, J, C] (None: one component, weight 1). All components share the phase-I model's
    layers below body child ``self.split`` (the frozen lower backbone), so evaluation on the common global
    test set runs that trunk once for all clients and components (exact: same parameters and statistics).
    """

    trains_phase_two = True  # False: phase II has no local training (τ-norm)
    state_attrs = ("components", "mix")

    # ---- setup ----------------------------------------------------------------------------------
    def setup(self):
        allowed = sorted(n for n, c in ALGORITHMS.items() if not issubclass(c, OneShotPersonalization))
        phase_one = self.checked_hp(
            "phase_one", (lambda v: v in allowed, "a registered global method: " + ", ".join(allowed))
        )
        self.frozen_bn = self.checked_hp("frozen_bn", one_of("global", "local"))
        if self.trains_phase_two:
            self.phase2_epochs = int(self.checked_hp("phase2_epochs", int_at_least(1)))
            self.phase2_lr = float(self.checked_hp("phase2_lr", number(0, lo_open=True)))
            self.phase2_batch_size = int(self.checked_hp("phase2_batch_size", int_at_least(1)))
            self.phase2_augment = bool(self.checked_hp("phase2_augment", boolean()))
            # phase II's local solver; each personalize() sets the phase, trainable layers and loss of its steps
            self.phase2_spec = LocalSpec(
                "phase2",
                epochs=self.phase2_epochs,
                opt=self.opt.replace(lr=self.phase2_lr),
                batch_size=self.phase2_batch_size,
                augment=self.phase2_augment,
            )
        self.check_phase_two()
        self.phase1 = ALGORITHMS[phase_one](self.ctx)
        self.phase1.setup()
        if self.phase1.global_model() is None:
            raise ConfigError("algorithm.phase_one", phase_one, "a method with a global model")
        self.labels = self.data.y.cpu().numpy()
        self.components: list[tuple[Stack, Stack]] | None = None
        self.mix: torch.Tensor | None = None
        self.component_class_acc: np.ndarray | None = None  # [K, J, C] at the last evaluation (J > 1 only)
        self.split = self.shared_trunk(self.personalized_names())

    def check_phase_two(self) -> None:
        """Validate the phase-II hyperparameters (ConfigError before any training)."""

    def personalized_names(self) -> list[str]:
        """Parameter names that phase II may change (sets the shared trunk)."""
        return self.fm.names("classifier")

    def shared_trunk(self, names) -> int:
        """Body children below the first one holding a personalized parameter are shared by every predictor
        (0 when ``frozen_bn=local``: then even frozen layers differ per client through their statistics)."""
        n = len(self.fm.net.body)
        return 0 if self.frozen_bn == "local" else min((body_index(k, n) for k in names), default=n)

    # ---- phase I --------------------------------------------------------------------------------
    def round(self, t, clients):
        # phase I trains with the run's optimizer and its lr step decay (optim.lr_decay_round/_to; ECL §4.1)
        out = dict(self.phase1.round(t, clients))
        out["train/lr"] = self.opt_at(t).lr
        if t == int(self.cfg.rounds):
            w, bn = self.phase1.global_model()
            out.update(self.personalize(t, w, bn))
        return out

    def global_model(self):
        return self.phase1.global_model()

    def traffic(self, t, clients):
        """Phase I's method's; at the end of round T every client (all K) downloads the final global model for phase
        II, which itself sends nothing (ECL Alg. 1 lines 13-20)."""
        sent = self.phase1.traffic(t, clients)
        if t == int(self.cfg.rounds):
            sent += Traffic(0, self.K * numel(*self.phase1.global_model()))
        return sent

    # ---- phase II helpers --------------------------------------------------------------------------
    def personalize(self, t: int, w: Stack, bn: Stack) -> dict:
        """Build ``self.components`` (and ``self.mix``) for all K clients; return diagnostics."""
        raise NotImplementedError

    def phase_two_train(
        self, t: int, model: tuple[Stack, Stack], spec: LocalSpec, inputs: LocalInputs | None = None, clients=None
    ) -> tuple[Stack, Stack]:
        """One phase-II ``local_train`` of ``clients`` (default: all K) stacked; ``spec``: ``self.phase2_spec`` with
        the step's phase, trainable layers and loss.

        ``frozen_bn=global`` (ECL §3.2 "we freeze the backbone network parameters"): every layer with no trainable
        parameter runs in eval mode, so a frozen BatchNorm normalises with the phase-I statistics and keeps them
        (its ``buffers`` come back unchanged); ``local`` (FedAFA's code): the net in train mode, frozen layers only
        get no gradient — batch statistics in the forward pass, running statistics following the local data."""
        if self.frozen_bn == "global":
            spec = spec.replace(loss=frozen_in_eval_mode(spec.loss, frozen_modules(self.fm, spec.trainable)))
        clients = torch.arange(self.K) if clients is None else torch.as_tensor(clients, dtype=torch.long)
        res = self.local_train(t, clients, model, spec, inputs)
        return res.params, res.buffers

    def client_counts(self) -> torch.Tensor:
        x = self.data.x
        return torch.as_tensor(self.data.counts, dtype=x.dtype, device=x.device)

    # ---- evaluation -------------------------------------------------------------------------------
    def client_models(self, clients, t):
        """The phase-I global model before phase II; afterwards the first component (for a mixture such as
        ECL's this is only its calibrated global part: the evaluator uses :meth:`client_logits`)."""
        if self.components is None:
            return super().client_models(clients, t)
        P, B = self.components[0]
        return rows(P, clients.long()), rows(B, clients.long())

    @torch.no_grad()
    def client_logits(self, clients, idx, t):
        """Logits of each client's predictor on its samples ``idx[i]`` (the evaluator's hook)."""
        sel = clients.long()
        if not all(i is idx[0] or np.array_equal(i, idx[0]) for i in idx):  # per-client test sets
            if self.components is None:
                return self.ctx.predict(*self.client_models(clients, t), idx)
            zs = [self.ctx.predict(rows(P, sel), rows(B, sel), idx) for P, B in self.components]
            return [self._combine(int(k), [z[i] for z in zs], idx[i]) for i, k in enumerate(sel)]
        return self._shared_test_logits(sel, idx[0])

    def _shared_test_logits(self, sel, ids_np) -> list[torch.Tensor]:
        """One test set for all clients (ECL's global test split): the trunk runs once per chunk."""
        fm, x, ids = self.fm, self.data.x, self.data.tensor(ids_np)
        if self.components is None:
            w, bn = self.global_model()
        else:  # the trunk every component shares (by construction): take it from any of them
            w, bn = ({k: v[0] for k, v in stack.items()} for stack in self.components[0])
        chunk = int(self.executor.eval_batch)
        s = self.split if self.components is not None else len(fm.net.body)
        parts: list[list[torch.Tensor]] = [[] for _ in sel]
        fm.set_mode(False)
        try:
            with self.executor.autocast(x.device):
                for a in range(0, len(ids), chunk):
                    h = run_children(fm, "body", w, bn, x.index_select(0, ids[a : a + chunk]), 0, s)
                    if self.components is None:  # phase-I global model: the same logits for everyone
                        z = upper_logits(fm, w, bn, h, s)
                        for i in range(len(sel)):
                            parts[i].append(z)
                        continue
                    for i, k in enumerate(sel.tolist()):
                        zk = torch.stack(
                            [
                                upper_logits(fm, {n: v[k] for n, v in P.items()}, {n: v[k] for n, v in B.items()}, h, s)
                                for P, B in self.components
                            ]
                        )
                        parts[i].append(zk)
        finally:
            fm.set_mode(True)
        if self.components is None:
            z = torch.cat(parts[0]) if parts and parts[0] else x.new_zeros((0, self.data.num_classes))
            return [z for _ in sel]
        return [self._combine(k, list(torch.cat(parts[i], dim=1)), ids_np) for i, k in enumerate(sel.tolist())]

    def _combine(self, k: int, zs: list[torch.Tensor], ids_np) -> torch.Tensor:
        """Mix client k's component logits with ``self.mix[k]``; record each component's per-class accuracy."""
        if self.mix is None:
            return zs[0]
        z = torch.stack(zs)
        if self.component_class_acc is None:
            self.component_class_acc = np.full((self.K, len(zs), self.data.num_classes), np.nan)
        y = self.data.y[self.data.tensor(ids_np)]
        for j in range(len(zs)):
            c, n = confusion_counts(z[j], y, self.data.num_classes)
            used = bool(self.mix[k, j].any())  # a component with weight 0 everywhere (an empty expert): NaN
            self.component_class_acc[k, j] = np.divide(c, n, out=np.full(len(c), np.nan), where=(n > 0) & used)
        return combine_logits(z, self.mix[k].to(z.dtype))

    # ---- per-class diagnostics and summary -------------------------------------------------------------
    component_names: tuple[str, ...] = ()  # a mixture's components (ECL: calibrated, expert1..M)
    last_class_metrics: dict | None = None

    def class_acc_metrics(self, class_acc: np.ndarray) -> dict:
        """The evaluator's hook, with the [K, C] per-class accuracy of the predictors (NaN = no test sample):
        head/tail accuracies (Fig. 2, :func:`head_tail_accuracy`) of the predictor (``lt/head_acc`` …) and, for
        a mixture, of each component alone (``lt/<component>/head_acc``, ``…/tail_acc``); the predictor's and each
        component's accuracy over each expert's class group (``lt/group<m>_acc``, ``lt/<component>/group<m>_acc``)."""
        counts = self.data.counts
        out = {f"lt/{k}": v for k, v in head_tail_accuracy(counts, class_acc).items()}
        if self.mix is not None and self.component_class_acc is not None:
            groups = self.class_groups()
            M = len(groups[0])
            for j, name in enumerate(self.component_names):
                acc = self.component_class_acc[:, j]
                out.update(
                    {
                        f"lt/{name}/{k}": v
                        for k, v in head_tail_accuracy(counts, acc).items()
                        if not k.startswith("global")
                    }
                )
                out.update(
                    {f"lt/{name}/group{m + 1}_acc": class_set_accuracy(acc, [g[m] for g in groups]) for m in range(M)}
                )
            out.update(
                {f"lt/group{m + 1}_acc": class_set_accuracy(class_acc, [g[m] for g in groups]) for m in range(M)}
            )
        self.last_class_metrics = out
        return out

    def class_groups(self) -> list[list[np.ndarray]]:
        """Per client, the class groups whose accuracies :meth:`class_acc_metrics` reports (a mixture's)."""
        raise NotImplementedError

    def finish(self, run_dir) -> dict:
        """The last evaluation's :meth:`class_acc_metrics` (also in the metrics, round T); each component's
        accuracy over the present classes; ``diagnostics/component_class_acc.npy`` [K, J, C]."""
        out = dict(self.last_class_metrics or {})
        if self.component_class_acc is not None and self.components is not None:
            acc = self.component_class_acc
            d = self.ctx.out_dir / "diagnostics"
            d.mkdir(parents=True, exist_ok=True)
            np.save(d / "component_class_acc.npy", acc)
            present = [np.flatnonzero(c > 0) for c in self.data.counts]
            out["lt/component_acc_present_classes"] = [
                class_set_accuracy(acc[:, j], present) for j in range(acc.shape[1])
            ]
        return out

    # ---- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "phase1": self.phase1.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self.phase1.load_state_dict(state.pop("phase1"))
        super().load_state_dict(state)


__all__ = [
    "OneShotPersonalization",
    "body_index",
    "run_children",
    "upper_logits",
    "frozen_modules",
    "frozen_in_eval_mode",
    "classifier_names",
    "class_balanced_weights",
    "expert_groups",
    "combine_logits",
    "class_set_accuracy",
    "head_tail_accuracy",
]
