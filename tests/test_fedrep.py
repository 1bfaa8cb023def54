"""FedRep: head epochs (or steps) with the body frozen, then body epochs (steps) with the head frozen; aggregation
of the body only (FedRep) or of all parameters (CAF code, ``fedrep_caf``); per-phase optimizer state; executor
equivalence; a default run learns."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import make_cfg

from fedbench.engine.schedule import make_schedule
from fedbench.run import Run

BASE = [
    "algorithm=fedrep_caf",
    "model=mlp",
    "model.head_hidden=[12]",
    "hardware.precision=fp64",
    "clients=6",
    "batch_size=8",
]


def _run(tmp_path, *overrides) -> Run:
    run = Run(make_cfg(*BASE, *overrides), tmp_path)
    run.setup()
    return run


def test_head_steps_then_body_steps_equal_hand_computation(tmp_path):
    """2 SGD steps on the head (body frozen) on batches 0, 1; then 1 SGD step on the body (head frozen) on batch 2."""
    lr, k = 0.1, 3
    run = _run(
        tmp_path,
        "algorithm.optimizer=sgd",
        "optim.momentum=0.0",
        f"algorithm.lr={lr}",
        "algorithm.head_steps=2",
        "algorithm.body_steps=1",
        "algorithm.persistent_state=false",
    )
    algo, fm, data = run.algorithm, run.fm, run.data
    assert algo.head == ["head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias"]  # all FC layers after the body
    p = {n: v.clone() for n, v in algo.w.items()}
    sched = make_schedule([data.train_idx[k]], [k], 8, algo.seed, "train", 1, steps=3)[0]
    for step, names in ((0, algo.head), (1, algo.head), (2, algo.body)):
        q = {n: v.clone().requires_grad_(n in names) for n, v in p.items()}
        i = sched[step]
        g = torch.autograd.grad(F.cross_entropy(fm(q, {}, data.x[i]), data.y[i]), [q[n] for n in names])
        p.update({n: p[n] - lr * gi for n, gi in zip(names, g)})
    w0 = {n: v.clone() for n, v in algo.w.items()}
    algo.round(1, torch.tensor([k]))
    for n in p:
        assert torch.allclose(algo.w[n], p[n], atol=1e-12, rtol=0), n
        assert not torch.equal(algo.w[n], w0[n]), n  # both parts moved, each in its own phase


def test_body_aggregation_keeps_heads_local(tmp_path):
    run = _run(tmp_path, "algorithm.aggregate=body")
    algo = run.algorithm
    h0 = {n: v.clone() for n, v in algo.H.items()}
    w0 = {n: v.clone() for n, v in algo.w.items()}
    algo.round(1, torch.tensor([1, 4]))
    for n in algo.head:
        assert torch.equal(algo.w[n], w0[n])  # no global head update
        assert not torch.equal(algo.H[n][1], h0[n][1]) and torch.equal(algo.H[n][2], h0[n][2])
    P, _ = algo.client_models(torch.tensor([1, 2]), 1)
    for n in algo.head:
        assert torch.equal(P[n][0], algo.H[n][1])
    for n in algo.body:
        assert not torch.equal(algo.w[n], w0[n]) and torch.equal(P[n][1], algo.w[n])


def test_each_phase_keeps_its_own_adam_state(tmp_path):
    """Adam step counters per phase: head_steps per participation for the head, body_steps for the body."""
    run = _run(tmp_path)
    algo = run.algorithm
    algo.round(1, torch.tensor([0, 2]))
    algo.round(2, torch.tensor([2]))
    head, body = algo.phase_state["head"]["step"], algo.phase_state["body"]["step"]
    assert head.tolist() == [5, 0, 10, 0, 0, 0] and body.tolist() == [1, 0, 2, 0, 0, 0]


def test_sequential_equals_vectorized(tmp_path):
    ws = []
    for ex in ("sequential", "vectorized"):
        run = _run(tmp_path / ex, f"hardware.executor={ex}")
        run.algorithm.round(1, torch.tensor([0, 3, 5]))
        ws.append(run.algorithm.w)
    for n in ws[0]:
        assert torch.allclose(ws[0][n], ws[1][n], atol=1e-12, rtol=0), n


def test_default_fedrep_learns_on_shards(tmp_path):
    """The default budget (FedRep: 10 head epochs, 1 body epoch, heads local) learns in 3 rounds on the label-sorted
    shards partition (2 classes per client): the personalized accuracy is far above what predicting a client's two
    classes at random gives (0.5). (The CAF code's 5 + 1 Adam steps at lr 0.001, the old default, stay near it.)"""
    summary = Run(make_cfg("algorithm=fedrep", "partition=shards"), tmp_path).execute()
    assert summary["metrics"]["pers/acc"]["best"] > 0.8


def test_head_epochs_then_body_epochs_equal_hand_computation(tmp_path):
    """FedRep's code: ``local_ep − local_rep_ep`` epochs on the head, then ``local_rep_ep`` on the body. Here 2 head
    epochs (batches of the ``fedrep_head`` schedule) then 1 body epoch (the ``train`` schedule), plain SGD; heads
    stay local, the server averages bodies."""
    lr, k = 0.1, 3
    run = Run(
        make_cfg(
            "algorithm=fedrep",
            "model=mlp",
            "model.head_hidden=[12]",
            "hardware.precision=fp64",
            "clients=6",
            "batch_size=16",
            "optim.momentum=0.0",
            f"lr={lr}",
            "algorithm.head_epochs=2",
            "algorithm.body_epochs=1",
        ),
        tmp_path,
    )
    run.setup()
    algo, fm, data = run.algorithm, run.fm, run.data
    p = {n: v.clone() for n, v in algo.w.items()}
    head = make_schedule([data.train_idx[k]], [k], 16, algo.seed, "fedrep_head", 1, epochs=2)[0]
    body = make_schedule([data.train_idx[k]], [k], 16, algo.seed, "train", 1, epochs=1)[0]
    assert len(head) == 2 * len(body) > 2
    for names, sched in ((algo.head, head), (algo.body, body)):
        for i in sched:
            q = {n: v.clone().requires_grad_(n in names) for n, v in p.items()}
            g = torch.autograd.grad(F.cross_entropy(fm(q, {}, data.x[i]), data.y[i]), [q[n] for n in names])
            p.update({n: p[n] - lr * gi for n, gi in zip(names, g)})
    algo.round(1, torch.tensor([k]))
    P, _ = algo.client_models(torch.tensor([k]), 1)
    for n in p:
        assert torch.allclose(P[n][0], p[n], atol=1e-12, rtol=0), n
    assert algo.global_model() is None  # FedRep has no global head (FedPer likewise)
