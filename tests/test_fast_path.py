"""The vectorized executor's fast paths (fedbench/engine/fast.py, docs/fast_paths.md): the step compiled
(``hardware.compile``) or captured as CUDA graphs (``hardware.cuda_graphs``) equals the eager step.

Tolerance: fp64, max |fast - eager| relative to the state's scale (<= 1e-12, as tests/test_vectorized.py holds the
two executors). Both paths compute the same per-client arithmetic; they differ only in the order of sums (inductor
fuses and reorders reductions; the fast step normalises every step of a padded job through ``masked_batch_norm``,
the eager one only its padded steps): a few roundings of 1.1e-16 per step, ~1e-15 measured after 16 steps. A wrong
sign or a skipped update moves the state by ~lr·|g| ~ 1e-3 and fails by 9 orders of magnitude.

On the CPU ``cuda_graphs=True`` runs the same code minus the capture itself (fast.capture: warm-up calls, state put
back, then plain calls into the resident buffers): the buckets, the resident buffers and the live masks are tested
here, the capture on the device (fastcheck.device_check, from scripts/gpu_correctness.py)."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import make_cfg
from omegaconf import OmegaConf

from fedbench.algorithms.fedprox import FedProx
from fedbench.algorithms.scaffold import SCAFFOLD
from fedbench.engine import fast, fastcheck, optim
from fedbench.engine.augment import RandomCropFlip
from fedbench.engine.executor import LocalJob, VectorizedExecutor
from fedbench.engine.functional import FModel
from fedbench.engine.schedule import make_schedule
from fedbench.engine.stack import broadcast, tagged
from fedbench.engine.syncs import HostSyncCounter
from fedbench.errors import ConfigError
from fedbench.models import build_model
from fedbench.run import Run

TOL = 1e-12  # fp64: see the module docstring
SGD = optim.OptimSpec(lr=0.05, momentum=0.9, weight_decay=1e-3, clip_grad_norm=1.0)
ADAM = optim.OptimSpec(name="adam", lr=0.01, weight_decay=1e-3)


def _fm(dropout: bool = False):
    """The BatchNorm CNN of tests/test_vectorized.py, or with ``dropout`` pfl-research's CNN (keyed dropout .25/.5)."""
    torch.manual_seed(0)
    cfg = {"name": "cnn", "channels": [4, 8], "kernel_size": 3, "padding": 1, "hidden": [16], "batch_norm": True}
    if dropout:
        cfg = {"name": "pfl_cnn", "channels": [3, 4], "hidden": [6], "dropout": [0.25, 0.5]}
    return FModel(build_model(OmegaConf.create(cfg), (1, 8, 8), 10).double())


_DATA: list = []


def _data():
    """600 Gaussian 8x8 images and labels (the same tensors each call: a program's signature holds their address)."""
    if not _DATA:
        g = torch.Generator().manual_seed(0)
        _DATA.extend(
            [torch.randn(600, 1, 8, 8, dtype=torch.float64, generator=g), torch.randint(0, 10, (600,), generator=g)]
        )
    return _DATA


def _diff(a: dict, b: dict) -> float:
    return max(
        ((a[k].double() - b[k].double()).abs().max().item() / max(1.0, a[k].double().abs().max().item()) for k in a),
        default=0.0,
    )


def _rounds(ex, fm, sizes, spec, rounds=2, batch=16, per_call=None, **kw):
    """``rounds`` rounds of 1 epoch for clients of ``sizes`` samples, each from the previous models and optimizer
    state; ``per_call`` clients per batched call (``max_memory`` from the executor's own probe step); ``kw``: the
    job's loss, ctx, shared, augment."""
    x, y = _data()
    starts = np.cumsum([0, *sizes])
    idx = [np.arange(starts[i], starts[i + 1]) for i in range(len(sizes))]
    p, b = fm.init_state(torch.float64)
    m, res, out = len(sizes), None, []
    for t in range(1, rounds + 1):
        sched = make_schedule(idx, list(range(m)), batch, 0, "train", t, epochs=1)
        params = (broadcast(p, m), broadcast(b, m)) if res is None else (res.params, res.buffers)
        job = LocalJob(
            fm, *params, fm.param_names, sched, x, y, spec, None if res is None else res.opt_state,
            aug_key=(0, "augment", "train", t), client_ids=list(range(m)), **kw,
        )  # fmt: skip
        if per_call and t == 1:
            probe = VectorizedExecutor()
            ex.max_memory = probe.bytes_in_use(job) + (per_call + 0.5) * probe.client_step_bytes(job)
        res = ex.train(job)
        out.append(res)
    return out


def _equal(eager, fast_res, tol=TOL):
    for e, f in zip(eager, fast_res):
        for part in ("params", "buffers", "opt_state"):
            d = _diff(getattr(e, part), getattr(f, part))
            assert d <= tol, f"{part}: {d:.3g}"
        assert (e.loss - f.loss).abs().max().item() <= tol
        assert torch.equal(e.steps, f.steps)


def test_buckets_are_powers_of_two_capped_at_the_chunk():
    assert [fast.bucket(n, 8) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert [fast.bucket(n, 6) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    assert fast.bucket(3, 3) == 3 and fast.bucket(1, 1) == 1


# clients of 90, 37, 70, 20, 50 and 75 samples, B = 16: 6, 3, 5, 2, 4 and 5 steps, last batches of 10, 5, 6, 4, 2 and
# 11 samples (padding). With 4 clients per call: chunk {90, 75, 70, 50} trains 4 clients 4 steps, then 3 (bucket 4:
# the finished client's row masked), then 1; chunk {37, 20} 2, then 1 (buckets 2 and 1)
SIZES = [90, 37, 70, 20, 50, 75]


@pytest.mark.parametrize(
    "spec,dropout,augment",
    [(SGD, False, False), (ADAM, True, True)],
    ids=["sgd-clip-batchnorm", "adam-dropout-augment"],
)
def test_the_captured_step_structure_equals_the_eager_step(spec, dropout, augment):
    """Ragged clients (6 step counts, padded batches), BatchNorm, two chunks (4 + 2 clients: buckets 4, 2 and 1,
    rows of finished clients masked), SCAFFOLD's objective (per-client corrections), two rounds carrying the
    optimizer state: the fast path with cuda_graphs (on the CPU: its warm-ups, the state put back, plain calls into
    the resident buffers) equals the eager one, and round 2 reuses round 1's program (no new warm-up/capture)."""
    fm = _fm(dropout)
    g = torch.Generator().manual_seed(1)
    ctx = tagged({k: 0.05 * torch.randn(len(SIZES), *v.shape, generator=g, dtype=torch.float64)
                  for k, v in fm.init_state(torch.float64)[0].items()}, "correction")  # fmt: skip
    kw = dict(loss=SCAFFOLD.loss.__get__(SimpleNamespace()), ctx=ctx, per_call=4)
    if augment:
        kw["augment"] = RandomCropFlip(1, True, [-1.0])
    eager = _rounds(VectorizedExecutor(), fm, SIZES, spec, **kw)
    ex = VectorizedExecutor(cuda_graphs=True)
    res = _rounds(ex, fm, SIZES, spec, **kw)
    _equal(eager, res)
    assert _diff(eager[-1].params, broadcast(fm.init_state(torch.float64)[0], 6)) > 1e-2  # it trained
    (prog,) = ex.fast.programs.values()  # one signature: both chunks and both rounds share it
    assert (
        prog.cap == 4 and sorted(prog.calls) == [1, 2, 4] and prog.captures == 3
    )  # chunk 2's 2 clients, then 1: buckets 2, 1


def test_a_change_the_captured_step_would_bake_in_makes_a_new_program():
    """FedProx's μ is a Python float the loss reads from its object: a graph captured with one μ must not replay
    with another, so a new μ is a new program (the compiled step's guards see it by themselves)."""
    fm = _fm()
    owner = SimpleNamespace(mu=0.5)
    loss = FedProx.local_loss.__get__(owner)
    w = {k: v + 0.1 for k, v in fm.init_state(torch.float64)[0].items()}
    ex = VectorizedExecutor(cuda_graphs=True)
    _rounds(ex, fm, SIZES[:3], SGD, rounds=1, loss=loss, shared={"w_global": w})
    owner.mu = 0.25
    res = _rounds(ex, fm, SIZES[:3], SGD, rounds=1, loss=loss, shared={"w_global": w})
    eager = _rounds(VectorizedExecutor(), fm, SIZES[:3], SGD, rounds=1, loss=loss, shared={"w_global": w})
    _equal(eager, res)
    assert len(ex.fast.programs) == 2


def test_the_fast_step_loop_makes_no_host_sync():
    fm = _fm(dropout=True)
    ex = VectorizedExecutor(cuda_graphs=True)
    counter = HostSyncCounter()
    ex.loop_mode = lambda: counter
    _rounds(ex, fm, SIZES, SGD, rounds=1, augment=RandomCropFlip(1, True, [-1.0]))
    assert counter.count == 0, dict(counter.calls)


def test_out_of_memory_in_the_fast_step_halves_the_chunk_and_drops_the_larger_programs():
    """An out-of-memory error halfway through the 6-client call (state already stepped, a bucket already
    "captured"): the chunk halves, its clients start over from the job's state on a new program of 3 rows (the 6-row
    one is dropped: its buffers and graphs would hold the memory), and the result equals the eager one."""
    from test_vectorized import SmallDevice

    fm = _fm()
    eager = _rounds(VectorizedExecutor(), fm, SIZES, SGD, rounds=1)
    alone = SmallDevice()
    with alone:  # the largest tensor one client's step makes
        _rounds(VectorizedExecutor(cuda_graphs=True), fm, SIZES[:1], SGD, rounds=1)
    big = SmallDevice(limit=2.5 * alone.largest, once_after=10**9)  # counts the oversized results of the 6-client call
    with big:
        _rounds(VectorizedExecutor(cuda_graphs=True), fm, SIZES, SGD, rounds=1)
    ex = VectorizedExecutor(cuda_graphs=True)
    with SmallDevice(2.5 * alone.largest, once_after=big.over // 2):
        res = _rounds(ex, fm, SIZES, SGD, rounds=1)
    _equal(eager, res)
    assert [p.cap for p in ex.fast.programs.values()] == [3]


def test_the_eager_step_loop_with_dropout_makes_no_host_sync():
    """The eager vectorized step's dropout keys come from the clients' ids laid out on the device before the loop
    (before: a list of ids copied from the host every step, 6 copies here); the keys are the same integers
    (tests/test_dropout.py: both executors drop the same units)."""
    ex = VectorizedExecutor()
    counter = HostSyncCounter()
    ex.loop_mode = lambda: counter
    _rounds(ex, _fm(dropout=True), SIZES, SGD, rounds=1)
    assert counter.count == 0, dict(counter.calls)


def _inductor_runs() -> str | None:
    """Why torch.compile cannot run here (inductor's CPU backend needs a C++ compiler), or None."""
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "torch.compile's CPU backend needs a C++ compiler (g++/clang++): none on PATH"
    return None


# FedProx's clients: 7 of 4 steps and one of 3 (B = 16; last batches of 16, 12, 2, 8, 15, 10, 4 and 8 samples):
# with 4 clients per call both chunks compile ONE shape (bucket 4; the 3-step client's last step masks its row)
PROX_SIZES = [64, 60, 50, 56, 63, 58, 52, 40]


@pytest.mark.skipif(_inductor_runs() is not None, reason=str(_inductor_runs()))
def test_the_compiled_step_equals_the_eager_step():
    """hardware.compile: BatchNorm, FedProx's objective (μ‖w − w^t‖², w^t a shared nested constant), momentum and
    weight decay, ragged clients (padding; a finished client's row masked), two chunks, two rounds: equal to the eager
    step in fp64; one compiled graph in all (one program, one bucket: no recompilation per step, chunk or round)."""
    torch._dynamo.reset()
    fm = _fm()
    loss = FedProx.local_loss.__get__(SimpleNamespace(mu=0.5))
    w = {k: v + 0.1 for k, v in fm.init_state(torch.float64)[0].items()}
    spec = optim.OptimSpec(lr=0.05, momentum=0.9, weight_decay=1e-3)
    kw = dict(loss=loss, shared={"w_global": w}, per_call=4)
    eager = _rounds(VectorizedExecutor(), fm, PROX_SIZES, spec, **kw)
    ex = VectorizedExecutor(compile=True)
    graphs0 = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    res = _rounds(ex, fm, PROX_SIZES, spec, **kw)
    _equal(eager, res)
    (prog,) = ex.fast.programs.values()
    assert prog.cap == 4 and list(prog.calls) == [4]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs0 == 1  # compiled once, for all 16 calls


@pytest.mark.slow
@pytest.mark.skipif(_inductor_runs() is not None, reason=str(_inductor_runs()))
def test_a_bug_in_the_compiled_code_only_fails_the_comparison(monkeypatch):
    """Inductor's own fault injection (``cpp.inject_relu_bug_TESTING_ONLY="accuracy"``: its generated ReLU adds 1):
    the eager step is untouched, the compiled one is wrong — the comparison above sees it, so it compares compiled
    code (a path that silently fell back to eager would pass it)."""
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    monkeypatch.setattr(inductor.cpp, "inject_relu_bug_TESTING_ONLY", "accuracy")
    fm = _fm()
    spec = optim.OptimSpec(lr=0.05, momentum=0.9)
    eager = _rounds(VectorizedExecutor(), fm, PROX_SIZES[:4], spec, rounds=1)
    res = _rounds(VectorizedExecutor(compile=True), fm, PROX_SIZES[:4], spec, rounds=1)
    assert _diff(eager[0].params, res[0].params) > 1e-3
    torch._dynamo.reset()


def test_the_device_check_runs_its_graph_cases_on_the_cpu_without_the_capture():
    """fastcheck.device_check (the first-GPU command's equality section calls it with device="cuda"): on the CPU its
    graphs cases run the same code minus the capture call, in fp64 (<= 1e-12) and fp32 (engine/agreement.py's rule)."""
    out = fastcheck.device_check("cpu", compile=False)
    assert set(out["cases"]) == {"graphs/fp64", "graphs/fp32"} and out["ok"], out
    for case in out["cases"].values():
        assert case["buckets"] == [1, 2] and case["captures"] == 2 and case["captured"] is False


@pytest.mark.parametrize(
    "overrides,key",
    [
        (("hardware.cuda_graphs=true", "hardware.executor=vectorized"), "hardware.cuda_graphs"),
        (("hardware.compile=true", "hardware.executor=sequential"), "hardware.compile"),
        (("hardware.cuda_graphs=true",), "hardware.cuda_graphs"),  # auto on a CPU: sequential
        (("hardware.compile=maybe",), "hardware.compile"),
    ],
)
def test_fast_paths_where_they_cannot_apply_fail_before_training(tmp_path, overrides, key):
    run = None
    with pytest.raises(ConfigError, match=key) as err:
        run = Run(make_cfg(*overrides), tmp_path)
        run.setup()
    assert run is None or getattr(run, "data", None) is None  # before the data is loaded
    assert "\n" not in str(err.value)


def test_the_fast_paths_are_wired_from_the_config(tmp_path):
    run = Run(make_cfg("hardware.executor=vectorized", "hardware.compile=true"), tmp_path)
    run.setup()
    assert run.executor.fast is not None and run.executor.fast.compile and not run.executor.fast.graphs
    run = Run(make_cfg("hardware.executor=vectorized"), tmp_path / "b")
    run.setup()
    assert run.executor.fast is None  # off by default: the eager step
