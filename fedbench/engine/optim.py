"""Local optimizers on per-client or client-stacked tensors.

SGD (momentum, weight decay, Nesterov), Adam and pFedMe's personal-model step are elementwise, so one update applied to
a tensor with a leading client axis is exactly per-client optimisation. Gradient-norm clipping
is not elementwise: it is computed per client. SGD delegates to torch's own functional SGD.
Optimizer state is a flat ``dict[str, Tensor]`` (``"<slot>:<param>"``) so it can be stacked,
gathered and checkpointed like parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.optim.sgd import sgd as torch_sgd


@dataclass(frozen=True)
class OptimSpec:
    name: str = "sgd"  # sgd | adam | pfedme
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    clip_grad_norm: float | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    bounds: tuple[float, float] | None = (
        None  # projected step: clamp the trained tensors into [lo, hi] after each step (FedALA's weights)
    )
    prox: float = 0.0  # pfedme: λ, the pull of the personal model θ toward the local model w
    anchor_lr: float = 0.0  # pfedme: η, the local model's step toward θ
    anchor_every: int = 1  # pfedme: K, inner steps per mini-batch (w moves after every K-th step)

    @classmethod
    def from_cfg(cls, cfg) -> "OptimSpec":
        fields = {
            k: cfg[k]
            for k in ("name", "lr", "momentum", "weight_decay", "nesterov", "clip_grad_norm", "eps")
            if k in cfg
        }
        if "betas" in cfg:
            fields["betas"] = tuple(cfg["betas"])
        return cls(**fields)

    def replace(self, **kw) -> "OptimSpec":
        from dataclasses import replace

        return replace(self, **kw)


def init_state(spec: OptimSpec, params: dict[str, torch.Tensor], names: list[str], lead: tuple[int, ...] = ()) -> dict:
    """Zero optimizer state for ``names``; ``lead`` is the client-axis shape of the step counter."""
    st: dict[str, torch.Tensor] = {}
    if spec.name == "sgd" and spec.momentum > 0:
        for n in names:
            st[f"momentum_buffer:{n}"] = torch.zeros_like(params[n])
    elif spec.name == "adam":
        for n in names:
            st[f"exp_avg:{n}"] = torch.zeros_like(params[n])
            st[f"exp_avg_sq:{n}"] = torch.zeros_like(params[n])
        st["step"] = torch.zeros(lead, dtype=torch.float64, device=params[names[0]].device)
    elif spec.name == "pfedme":  # the local model w starts where θ starts (pFedMe Alg. 1: w_k = θ_k = w^t)
        for n in names:
            st[f"anchor:{n}"] = params[n].clone()
        st["step"] = torch.zeros(lead, dtype=torch.float64, device=params[names[0]].device)
    return st


def clip_grad_norm_(grads: list[torch.Tensor], max_norm: float, batched: bool) -> None:
    """``torch.nn.utils.clip_grad_norm_`` semantics, per client when ``batched``."""
    if batched:
        norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads], dim=1)
        total = torch.linalg.vector_norm(norms, dim=1)
    else:
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))) if batched else coef)


@torch.no_grad()
def step(
    spec: OptimSpec, params: list[torch.Tensor], grads: list[torch.Tensor], names: list[str], state: dict, batched: bool
) -> None:
    """One optimizer step, in place on ``params`` and ``state``: gradient clipping, then :func:`update`."""
    if spec.clip_grad_norm:
        clip_grad_norm_(grads, spec.clip_grad_norm, batched)
    update(spec, params, grads, names, state, batched)


@torch.no_grad()
def update(
    spec: OptimSpec, params: list[torch.Tensor], grads: list[torch.Tensor], names: list[str], state: dict, batched: bool
) -> None:
    """The update of :func:`step` on already clipped gradients (the compiled step calls the two apart:
    fedbench/engine/fast.py)."""
    if spec.name == "sgd":
        bufs = [state.get(f"momentum_buffer:{n}") for n in names] if spec.momentum > 0 else [None] * len(names)
        torch_sgd(
            params,
            grads,
            bufs,
            weight_decay=spec.weight_decay,
            momentum=spec.momentum,
            lr=spec.lr,
            dampening=0.0,
            nesterov=spec.nesterov,
            maximize=False,
            foreach=True,
        )
        if spec.momentum > 0:  # torch may replace a buffer object on first use; keep ours current
            for n, b in zip(names, bufs):
                state[f"momentum_buffer:{n}"] = b
    elif spec.name == "adam":
        _adam(spec, params, grads, names, state, batched)
    elif spec.name == "pfedme":
        _pfedme(spec, params, grads, names, state, batched)
    else:
        raise ValueError(f"unknown optimizer {spec.name!r}")
    if spec.bounds is not None:
        for p in params:
            p.clamp_(*spec.bounds)


def _adam(spec, params, grads, names, state, batched):
    """Adam (torch.optim.Adam's arithmetic) with a per-client step counter for stacked clients."""
    b1, b2 = spec.betas
    state["step"] += 1
    t = state["step"]
    bc1 = 1 - b1**t
    bc2_sqrt = (1 - b2**t).sqrt()
    for p, g, n in zip(params, grads, names):
        if spec.weight_decay:
            g = g.add(p, alpha=spec.weight_decay)
        m, v = state[f"exp_avg:{n}"], state[f"exp_avg_sq:{n}"]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        shape = (-1,) + (1,) * (p.dim() - 1) if batched else ()
        step_size = (spec.lr / bc1).to(p.dtype).view(shape)
        denom = (v.sqrt() / bc2_sqrt.to(p.dtype).view(shape)).add_(spec.eps)
        p.addcdiv_(m * step_size, denom, value=-1.0)


def _pfedme(spec, params, grads, names, state, batched):
    """pFedMe's personal-model step (Dinh et al. 2020, Alg. 1 and its ``pFedMeOptimizer``), ``anchor:<param>`` = w:

      θ ← θ − lr (∇f(θ) + λ (θ − w))          (a gradient step on the inner problem f + λ/2 ‖θ − w‖², Eq. 7)
      after every K-th step:  w ← w − η λ (w − θ)    (Alg. 1 line 8, once the K inner steps on a mini-batch are done)

    The step counter is per client, so w moves without any host read (``torch.where`` on the due clients)."""
    state["step"] += 1
    due = torch.remainder(state["step"], spec.anchor_every) == 0
    for p, g, n in zip(params, grads, names):
        w = state[f"anchor:{n}"]
        p.sub_(spec.lr * (g + spec.prox * (p - w)))
        w.copy_(
            torch.where(
                due.view((-1,) + (1,) * (p.dim() - 1)) if batched else due, w - spec.anchor_lr * spec.prox * (w - p), w
            )
        )
