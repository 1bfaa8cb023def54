"""The vectorized executor on clients of any sizes: one batched call per local step index, padded batches masked,
results equal to the sequential executor, no host sync in the step loop, client chunks that fit a memory budget."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_cfg
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

from fedbench import seeding
from fedbench.data.datasets import load_dataset
from fedbench.data.partitions import make_partition
from fedbench.engine import optim
from fedbench.engine.agreement import fp32_agreement
from fedbench.engine.augment import RandomCropFlip
from fedbench.engine.executor import LocalJob, SequentialExecutor, VectorizedExecutor, memory_budget
from fedbench.engine.functional import FModel, cross_entropy
from fedbench.engine.masking import IGNORE, batch_mean, masked_batch_norm, pad_aware, padded_batch
from fedbench.engine.schedule import make_schedule
from fedbench.engine.stack import broadcast
from fedbench.engine.syncs import HostSyncCounter
from fedbench.losses import kd_kl, prototype_alignment
from fedbench.models import build_model

SGD = optim.OptimSpec(lr=0.05, momentum=0.9, weight_decay=1e-3, clip_grad_norm=1.0)
ADAM = optim.OptimSpec(name="adam", lr=0.01, weight_decay=1e-3)


def _net(dtype):
    torch.manual_seed(0)
    net = build_model(
        OmegaConf.create(
            {"name": "cnn", "channels": [4, 8], "kernel_size": 3, "padding": 1, "hidden": [16], "batch_norm": True}
        ),
        (1, 8, 8),
        10,
    ).to(dtype)  # BatchNorm in body and head
    return FModel(net)


_DATA: dict = {}


def dirichlet(alpha: float, clients: int = 6):
    """A real Dirichlet(alpha) partition of the digits labels (uneven client sizes), with Gaussian images: the digits'
    many exact zeros make max-pooling ties that fp32 round-off breaks either way (chaotic with either executor)."""
    if (alpha, clients) not in _DATA:
        cfg = make_cfg("partition=dirichlet", f"partition.alpha={alpha}", f"clients={clients}")
        ds = load_dataset(cfg.dataset, cache_dir=cfg.cache_dir)
        part = make_partition(
            cfg.partition, ds.y.numpy(), ds.n_train, ds.num_classes, clients, seeding.rng(0, "partition")
        )
        x = torch.randn(ds.x.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        _DATA[alpha, clients] = (x, ds.y, part.train)
    return _DATA[alpha, clients]


def _job(fm, dtype, sched, x, y, spec, state=None, params=None, trainable=None, **kw):
    m = len(sched)
    p, b = fm.init_state(dtype)
    P, B = params if params is not None else (broadcast(p, m), broadcast(b, m))
    return LocalJob(fm, P, B, trainable or fm.param_names, sched, x.to(dtype), y, spec, state, **kw)


def _max_diff(a: dict, b: dict, keys=None) -> float:
    """max over tensors of max |a - b| / max(1, max |a|) (relative to the tensor's scale, e.g. BN running stats)."""
    return max(
        (
            (a[k].double() - b[k].double()).abs().max().item() / max(1.0, a[k].double().abs().max().item())
            for k in (keys or a)
        ),
        default=0.0,
    )


def _redundant_biases(fm) -> list[str]:
    """Biases of layers feeding a BatchNorm: BN removes any constant, so their exact gradient is 0 and what they
    receive is round-off; Adam normalises round-off into full steps (with either executor, differently)."""
    names = fm.param_names
    return [
        n
        for i, n in enumerate(names)
        if n.endswith(".bias")
        and i + 1 < len(names)
        and fm.net.get_submodule(names[i + 1].rsplit(".", 1)[0]).__class__.__name__.startswith("BatchNorm")
    ]


@pytest.mark.parametrize(
    "dtype,spec",
    [(torch.float64, SGD), (torch.float32, SGD), (torch.float64, ADAM)],
    ids=["fp64-sgd-momentum-wd-clip", "fp32-sgd-momentum-wd-clip", "fp64-adam-wd"],
)
@pytest.mark.parametrize("drop_last", [False, True])
def test_vectorized_equals_sequential_on_dirichlet_clients(dtype, spec, drop_last):
    """Dir(0.3) clients of very different sizes, ragged last batches (drop_last=false) or none (true), a BN model,
    two rounds with each client's optimizer state carried over (persistent state); every parameter, BN buffer,
    optimizer state and logged loss equal: to 1e-9 in fp64; in fp32 as close to the fp64 answer as the sequential
    executor's own fp32 result (fedbench/engine/agreement.py: a constant between the executors held on an AMD EPYC
    and failed on an Intel Xeon, 1.4e-5 > 1e-5). (Adam in fp32 is not compared: its first steps are ~sign(g)·lr, so
    fp32 round-off in near-zero gradient coordinates flips whole steps — ~1e-3 apart after 48 steps with the old
    executor's grouping too.)"""
    x, y, train = dirichlet(0.3)
    fm = _net(dtype)
    trainable = [n for n in fm.param_names if spec.name != "adam" or n not in _redundant_biases(fm)]
    out = {
        E.name: _two_rounds(E, fm, dtype, spec, trainable, x, train, y, drop_last)
        for E in (SequentialExecutor(), VectorizedExecutor())
    }
    sched = make_schedule(train, list(range(len(train))), 32, 0, "train", 2, epochs=2, drop_last=drop_last)
    steps = [len(s) for s in sched]
    assert len(set(steps)) > 2  # ragged: clients with different step counts
    assert drop_last or any(len(b) < 32 for s in sched for b in s)  # ... and short batches to pad
    s, v = out["sequential"], out["vectorized"]
    moms = [k for k in s.opt_state if k.split(":")[-1] in trainable]

    def parts(res):
        return {
            "params": {k: res.params[k] for k in trainable},
            "buffers": res.buffers,
            "opt_state": {k: res.opt_state[k] for k in moms},
            "loss": res.loss,
        }

    if dtype == torch.float64:
        assert _max_diff(s.params, v.params, trainable) <= 1e-9 and (s.loss - v.loss).abs().max() <= 1e-9
        assert _max_diff(s.buffers, v.buffers) <= 1e-9 and _max_diff(s.opt_state, v.opt_state, moms) <= 1e-9
    else:
        ref = parts(
            _two_rounds(
                SequentialExecutor(), _net(torch.float64), torch.float64, spec, trainable, x, train, y, drop_last
            )
        )
        for part in ref:
            ok, why = fp32_agreement(parts(s)[part], parts(v)[part], ref[part])
            assert ok, f"{part}: {why}"
    p0 = fm.init_state(dtype)[0]
    assert (s.params["head.0.weight"] - p0["head.0.weight"]).abs().max() > 1e-2  # it trained


def _two_rounds(E, fm, dtype, spec, trainable, x, train, y, drop_last):
    """Two rounds of 2 epochs for every client, the second from the first's models and optimizer state."""
    res = None
    for t in (1, 2):
        sched = make_schedule(train, list(range(len(train))), 32, 0, "train", t, epochs=2, drop_last=drop_last)
        job = _job(
            fm,
            dtype,
            sched,
            x,
            y,
            spec,
            state=None if res is None else res.opt_state,
            trainable=trainable,
            params=None if res is None else (res.params, res.buffers),
        )
        res = E.train(job)
    return res


def _counting(calls: list):
    @pad_aware
    def loss(fm, p, b, x, y, ctx):
        calls.append(tuple(x.shape))  # under vmap: once per batched call
        return cross_entropy(fm, p, b, x, y, ctx)

    return loss


@pytest.mark.parametrize("drop_last", [False, True])
def test_one_batched_call_per_local_step_index(drop_last):
    """Dir(0.1), 8 clients: the number of vmapped calls in a round = the longest client's number of steps
    (the old grouping by batch size made one call per distinct size per step)."""
    x, y, train = dirichlet(0.1, 8)
    fm = _net(torch.float64)
    sched = make_schedule(train, list(range(8)), 16, 0, "train", 1, epochs=2, drop_last=drop_last)
    steps = [len(s) for s in sched]
    groups = sum(len({len(s[t]) for s in sched if t < len(s)}) for t in range(max(steps)))
    assert drop_last or groups > max(steps)  # sizes differ within steps: the old executor split them
    calls = []
    VectorizedExecutor().train(_job(fm, torch.float64, sched, x, y, SGD, loss=_counting(calls)))
    assert len(calls) == max(steps)
    calls.clear()
    SequentialExecutor().train(_job(fm, torch.float64, sched, x, y, SGD, loss=_counting(calls)))
    assert len(calls) == sum(steps)


@pytest.mark.parametrize("spec", [SGD, ADAM], ids=["sgd", "adam"])
def test_no_host_sync_inside_the_step_loop(spec):
    """A vectorized job with uneven clients, padding, BN, augmentation, momentum/clipping or Adam: the step loop makes
    no host-reading call (item, tolist, bool, cpu, numpy, host-data indices)."""
    x, y, train = dirichlet(0.3)
    fm = _net(torch.float32)
    sched = make_schedule(train, list(range(len(train))), 32, 0, "train", 1, epochs=1)
    ex = VectorizedExecutor()
    counter = HostSyncCounter()
    ex.loop_mode = lambda: counter
    ex.train(
        _job(
            fm,
            torch.float32,
            sched,
            x,
            y,
            spec,
            augment=RandomCropFlip(2, True, [-1.0]),
            aug_key=(0, "augment", "train", 1),
            client_ids=list(range(len(train))),
        )
    )
    assert counter.count == 0, dict(counter.calls)

    @pad_aware
    def reads_host(fm, p, b, x, y, ctx):  # the counter does see a sync inside the loop
        return cross_entropy(fm, p, b, x, y, ctx) * (1.0 if ctx["flag"].sum().item() >= 0 else 0.0)

    seen = HostSyncCounter()
    ex.loop_mode = lambda: seen
    with pytest.raises(RuntimeError):  # .item() under vmap is refused, but only after the counter saw it
        ex.train(_job(fm, torch.float32, sched, x, y, spec, loss=reads_host, ctx={"flag": torch.ones(len(train), 1)}))
    assert seen.calls["item"] >= 1


def test_a_fedavg_round_with_augmentation_makes_no_host_sync(tmp_path):
    """A whole FedAvg round (schedule, augmentation, local training) through Run with the vectorized executor."""
    from fedbench.run import Run

    cfg = make_cfg(
        "hardware.executor=vectorized",
        "model=tiny_cnn",
        "clients=6",
        "partition.alpha=0.3",
        "dataset.augment={crop_padding: 1, hflip: true}",
    )
    run = Run(cfg, tmp_path)
    run.setup()
    counter = HostSyncCounter()
    run.executor.loop_mode = lambda: counter
    run.algorithm.round(1, torch.arange(6))
    assert counter.count == 0, dict(counter.calls)


def test_ifca_cluster_estimate_reads_nothing_on_the_host_per_batch(tmp_path):
    """IFCA's cluster estimate (Alg. 2 l. 6: every client's summed mini-batch losses under every cluster model) sums
    on the device: per client only its id and its index array cross (before issue 21: one ``item`` per mini-batch
    and cluster, 152 here)."""
    from fedbench.run import Run

    run = Run(make_cfg("algorithm=ifca", "clients=4"), tmp_path)
    run.setup()
    counter = HostSyncCounter()
    with counter:
        losses = run.algorithm.cluster_losses(torch.arange(4))
    assert losses.shape == (4, run.algorithm.J) and run.algorithm.J > 1
    assert counter.calls["item"] == 0 and counter.count <= 2 * 4, dict(counter.calls)


def test_chunks_that_fit_a_memory_budget_give_identical_results():
    """hardware.max_memory: a tiny budget trains one client per call, a budget of 3 probe-measured client-steps three
    per call; both equal the unchunked run."""
    x, y, train = dirichlet(0.3)
    fm = _net(torch.float64)
    sched = make_schedule(train, list(range(len(train))), 32, 0, "train", 1, epochs=2)
    steps = [len(s) for s in sched]
    whole = VectorizedExecutor().train(_job(fm, torch.float64, sched, x, y, SGD))
    calls = []
    job = _job(fm, torch.float64, sched, x, y, SGD, loss=_counting(calls))
    tiny = VectorizedExecutor(max_memory=2)  # bytes
    assert tiny.chunk_size(job) == 1  # (its probe step is measured once, here)
    calls.clear()
    one = tiny.train(job)
    assert len(calls) == sum(steps)  # each client alone
    probe = VectorizedExecutor()
    per, used = probe.client_step_bytes(job), probe.bytes_in_use(job)
    assert per > 0
    three = VectorizedExecutor(max_memory=used + 3.5 * per)
    assert three.chunk_size(job) == 3
    calls.clear()
    res3 = three.train(job)
    order = sorted(range(len(steps)), key=lambda m: -steps[m])
    assert len(calls) == sum(steps[order[i]] for i in range(0, len(order), 3))  # per chunk: its longest client
    for res in (one, res3):
        assert _max_diff(whole.params, res.params) <= 1e-12 and _max_diff(whole.buffers, res.buffers) <= 1e-12
        assert (whole.loss - res.loss).abs().max() <= 1e-12


def test_memory_budget_is_bytes_or_a_fraction():
    cpu = torch.device("cpu")
    assert memory_budget(None, cpu) is None
    assert memory_budget(5e9, cpu) == 5e9
    import os

    assert memory_budget(0.25, cpu) == 0.25 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class SmallDevice(TorchDispatchMode):
    """A device with little memory: an op whose result is larger than ``limit`` bytes fails as out of memory
    (``limit`` None: only records the largest result). ``once_after`` = k: only the (k+1)-th such op fails, once
    (an OOM in the middle of a chunk's steps, after some of them have changed its clients' state)."""

    def __init__(self, limit=None, once_after=None):
        super().__init__()
        self.limit, self.largest, self.once_after, self.over = limit, 0, once_after, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        size = sum(
            t.numel() * t.element_size()
            for t in (out if isinstance(out, (tuple, list)) else [out])
            if isinstance(t, torch.Tensor)
        )
        self.largest = max(self.largest, size)
        if self.limit is not None and size > self.limit:
            self.over += 1
            if self.once_after is None or self.over == self.once_after + 1:
                raise torch.OutOfMemoryError(f"simulated: {size} bytes")
        return out


@pytest.mark.parametrize("when", ["first-step", "mid-chunk"])
def test_out_of_memory_halves_the_chunk_and_says_so_once(caplog, when):
    """first-step: every call of more than ~2 clients fails (6 -> 3, fails -> 1 per call); mid-chunk: the 6-client
    call fails once halfway through its steps (BN statistics, parameters and momentum already moved, losses
    summed), so the retried chunks must start over from the job's state."""
    x, y, train = dirichlet(0.3)
    fm = _net(torch.float64)
    sched = make_schedule(train, list(range(len(train))), 32, 0, "train", 1, epochs=1)
    job, first = _job(fm, torch.float64, sched, x, y, SGD), _job(fm, torch.float64, sched[:1], x, y, SGD)
    whole = VectorizedExecutor().train(job)
    alone = SmallDevice()
    with alone:  # the largest tensor one client's step makes
        VectorizedExecutor().train(first)
    limit, once_after = 2.5 * alone.largest, None
    if when == "mid-chunk":
        big = SmallDevice(limit=limit, once_after=10**9)  # counts the oversized results of the whole 6-client call
        with big:
            VectorizedExecutor().train(job)
        once_after = big.over // 2
    ex = VectorizedExecutor()
    with caplog.at_level(logging.WARNING, logger="fedbench.engine.executor"), SmallDevice(limit, once_after):
        res = ex.train(job)
    said = [r for r in caplog.records if "out of memory" in r.getMessage()]
    assert len(said) == 1 and "retrying with 3 per call" in said[0].getMessage()
    assert _max_diff(whole.params, res.params) <= 1e-12 and _max_diff(whole.buffers, res.buffers) <= 1e-12
    assert (whole.loss - res.loss).abs().max() <= 1e-12


@pad_aware
def _pack_loss(fm, p, b, x, y, ctx):
    """A step on two consecutive batches (a MAML-like pack), BN in train mode on each."""
    xs, ys = x.unflatten(0, (2, -1)), y.unflatten(0, (2, -1))
    return F.cross_entropy(fm(p, b, xs[0]), ys[0]) + 0.3 * F.cross_entropy(fm(p, b, xs[1]), ys[1])


def test_packs_of_batches_are_padded_batch_by_batch():
    """batches_per_step=2 with clients smaller than B (batch = min(B, n_k)): every sub-batch padded on its own."""
    x, y, _ = dirichlet(0.3)
    idx = [np.arange(0, 5), np.arange(5, 17), np.arange(17, 80)]
    sched = make_schedule(idx, [0, 1, 2], 16, 0, "train", 1, steps=3, batches_per_step=2)
    assert [len(s[0]) for s in sched] == [10, 24, 32]
    fm = _net(torch.float64)
    out = [
        E.train(_job(fm, torch.float64, sched, x, y, SGD, loss=_pack_loss, pack=2))
        for E in (SequentialExecutor(), VectorizedExecutor())
    ]
    assert _max_diff(out[0].params, out[1].params) <= 1e-9 and _max_diff(out[0].buffers, out[1].buffers) <= 1e-9


def _whole_batch_loss(fm, p, b, x, y, ctx):
    """Reads the batch as a whole (a mean over ALL its rows): padding would change it."""
    z = fm(p, b, x)
    return F.cross_entropy(z, y) + 0.5 * z.mean()


def test_a_loss_not_marked_pad_aware_runs_sequentially_on_uneven_batches(caplog):
    x, y, train = dirichlet(0.3)
    fm = _net(torch.float64)
    sched = make_schedule(train, list(range(len(train))), 32, 0, "train", 1, epochs=1)
    seq = SequentialExecutor().train(_job(fm, torch.float64, sched, x, y, SGD, loss=_whole_batch_loss))
    ex = VectorizedExecutor()
    with caplog.at_level(logging.WARNING, logger="fedbench.engine.executor"):
        for _ in range(2):
            vec = ex.train(_job(fm, torch.float64, sched, x, y, SGD, loss=_whole_batch_loss))
    assert sum("not marked pad-aware" in r.getMessage() for r in caplog.records) == 1
    assert _max_diff(seq.params, vec.params) <= 1e-12
    wrong = ex.train(_job(fm, torch.float64, sched, x, y, SGD, loss=pad_aware(lambda *a: _whole_batch_loss(*a))))
    assert _max_diff(seq.params, wrong.params) > 1e-6  # why the mark matters: padded, this loss is another loss


@pytest.mark.parametrize("shape", [(7, 3, 4, 5), (7, 3)])
def test_masked_batch_norm_equals_batch_norm_of_the_real_samples(shape):
    """Two clients under vmap with 7 and 4 real samples of 7: output rows and running statistics as F.batch_norm on
    the real samples alone."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *shape, dtype=torch.float64, generator=g)
    real = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    w, bias = torch.randn(2, 3, dtype=torch.float64, generator=g), torch.randn(2, 3, dtype=torch.float64, generator=g)
    rm, rv = torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)

    def one(x, rm, rv, w, bias, real):
        with padded_batch(real):
            return F.batch_norm(x, rm, rv, w, bias, True, 0.3, 1e-5)

    out = torch.vmap(one)(x, rm, rv, w, bias, real)
    for m, n in enumerate((7, 4)):
        erm, erv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
        want = F.batch_norm(x[m, :n], erm, erv, w[m], bias[m], True, 0.3, 1e-5)
        assert torch.allclose(out[m, :n], want, atol=1e-12)
        assert torch.allclose(rm[m], erm, atol=1e-12) and torch.allclose(rv[m], erv, atol=1e-12)
    assert torch.equal(
        masked_batch_norm(x[0], None, None, training=True), F.batch_norm(x[0], None, None, training=True)
    )


def test_batch_reductions_of_the_losses_ignore_padding():
    """kd_kl, prototype_alignment and batch_mean with two padding rows (label IGNORE) = the same on the real rows."""
    g = torch.Generator().manual_seed(1)
    s, t = torch.randn(5, 4, dtype=torch.float64, generator=g), torch.randn(5, 4, dtype=torch.float64, generator=g)
    y = torch.tensor([2, 0, 3, IGNORE, IGNORE])
    assert torch.allclose(kd_kl(s, t, 2.0, y), kd_kl(s[:3], t[:3], 2.0), atol=1e-14)
    h, protos, has = (
        torch.randn(5, 6, dtype=torch.float64, generator=g),
        torch.randn(4, 6, dtype=torch.float64, generator=g),
        torch.tensor([True, False, True, True]),
    )
    assert torch.allclose(
        prototype_alignment(h, y, protos, has), prototype_alignment(h[:3], y[:3], protos, has), atol=1e-14
    )
    v = torch.tensor([1.0, 2.0, 6.0, 100.0, -100.0], dtype=torch.float64)
    assert batch_mean(v, y).item() == 3.0 and batch_mean(v).item() == 1.8


def _one_sample_job(fm, dtype, x, y, epochs=2):
    """Clients of 33, 1 and 20 samples, B = 32: client 0's last batch of each epoch has one sample, client 1's only
    batch has one."""
    idx = [np.arange(0, 33), np.arange(33, 34), np.arange(34, 54)]
    return _job(fm, dtype, make_schedule(idx, [0, 1, 2], 32, 0, "train", 1, epochs=epochs), x, y, SGD)


def test_a_step_of_one_sample_is_dropped_when_batchnorm_cannot_normalise_it(caplog):
    """A BatchNorm1d head sees one value per channel in a batch of one: the sequential executor crashed there, the
    vectorized one trained on a 0 variance. Both now drop such steps, train the same remaining steps, say it once
    with the count (2 epochs: client 0 loses 2 samples, client 1 both of its steps, 2 samples: 4), and leave a client
    without steps as it was."""
    x, y, _ = dirichlet(0.3)
    fm = _net(torch.float64)
    assert fm.batch_of_one_fails(x)
    out = {}
    for E in (SequentialExecutor(), VectorizedExecutor()):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fedbench.engine.executor"):
            out[E.name] = E.train(_one_sample_job(fm, torch.float64, x, y))
            E.train(_one_sample_job(fm, torch.float64, x, y))
        said = [r.getMessage() for r in caplog.records if "single sample" in r.getMessage()]
        assert len(said) == 1 and "dropped 4 local step(s) of a single sample (4 sample(s), 1 client(s)" in said[0]
        assert E.dropped_samples == 2 * 4
    s, v = out["sequential"], out["vectorized"]
    assert s.steps.tolist() == v.steps.tolist() == [2, 0, 2]
    assert _max_diff(s.params, v.params) <= 1e-9 and _max_diff(s.buffers, v.buffers) <= 1e-9
    assert (s.loss - v.loss).abs().max() <= 1e-9 and s.loss[1] == 0
    p0, b0 = fm.init_state(torch.float64)
    assert all(torch.equal(s.params[k][1], p0[k]) and torch.equal(v.params[k][1], p0[k]) for k in p0)
    assert all(torch.equal(v.buffers[k][1], b0[k]) for k in b0)


def test_a_step_of_one_sample_is_trained_when_batchnorm_sees_a_whole_feature_map():
    """BatchNorm2d only (no BatchNorm in the head): one 8x8 image gives 4-64 values per channel, so nothing is
    dropped and both executors train the same 2 + 1 + 1 steps."""
    torch.manual_seed(0)
    cfg = {"name": "cnn", "channels": [4, 8], "kernel_size": 3, "padding": 1, "hidden": [], "batch_norm": True}
    fm = FModel(build_model(OmegaConf.create(cfg), (1, 8, 8), 10).double())
    x, y, _ = dirichlet(0.3)
    assert not fm.batch_of_one_fails(x)
    seq, vec = (
        E.train(_one_sample_job(fm, torch.float64, x, y, epochs=1))
        for E in (SequentialExecutor(), VectorizedExecutor())
    )
    assert seq.steps.tolist() == vec.steps.tolist() == [2, 1, 1]
    assert _max_diff(seq.params, vec.params) <= 1e-9 and _max_diff(seq.buffers, vec.buffers) <= 1e-9
    p0 = fm.init_state(torch.float64)[0]
    assert (seq.params["head.0.weight"][1] - p0["head.0.weight"]).abs().max() > 1e-3  # client 1 trained on its one
