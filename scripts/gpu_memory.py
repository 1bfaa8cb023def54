"""Section 6 of the first-GPU check (scripts/gpu_check.py): the vectorized executor's memory on the device, each
measurement in a process of its own (this file run as a script is that process: ``python scripts/gpu_memory.py SPEC``):
a ResNet-50 round's peak unbudgeted, under a ``hardware.max_memory`` that forces >= 2 chunks, and with more clients
than the device holds (the out-of-memory halving)."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import torch
from gpu_report import Report
from gpu_runs import built, sync


def memory_worker(spec: dict) -> dict:
    """One ResNet-50 round in this process: ``budget`` 'none' | 'two_chunks' | 'overflow'."""
    from fedbench.engine.executor import LocalJob, VectorizedExecutor

    dev = torch.device(spec["device"])
    m = spec["memory"]
    clients = m["clients"]
    if spec["budget"] == "overflow":  # sized from a probe so that all clients at once need ~1.5x the device
        clients = spec["overflow_clients"]
    ov = [
        "logger=none",
        f"hardware.device={dev}",
        "hardware.executor=vectorized",
        f"model={m['model']}",
        f"clients={clients}",
        f"batch_size={m['batch']}",
        "local_epochs=1",
        "rounds=1",
        "participation=1.0",
        "partition=iid",
        "dataset=synthetic",
        "dataset.shape=[3,32,32]",
        f"dataset.train_per_class={math.ceil(clients * m['per_client'] / 10)}",
        "dataset.test_per_class=2",
        "eval.personalized=false",
    ] + (["model.cifar_stem=true"] if m["model"] == "resnet50" else [])
    r = built(ov)
    ex = r.executor
    assert isinstance(ex, VectorizedExecutor)
    entered, jobs = [0], []
    orig_train = ex.train

    def train(job: LocalJob):
        jobs.append(job)
        if spec["budget"] == "two_chunks":  # a budget that holds about half of the clients' working memory
            ex.max_memory = None
            per = ex.client_step_bytes(job)
            ex.max_memory = ex.bytes_in_use(job) + per * math.ceil(len(job.schedule) / 2)
            out = {"per_client_step": per, "budget": ex.max_memory}
            spec.setdefault("found", {}).update(out)
        return orig_train(job)

    @contextlib.contextmanager
    def loop():
        entered[0] += 1
        yield

    ex.train, ex.loop_mode = train, loop
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r.algorithm.round(1, torch.arange(r.data.num_clients))
    sync(dev)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    per = ex.client_step_bytes(jobs[0]) if jobs else 0
    return {
        "clients": clients,
        "calls": entered[0],
        "peak_bytes": peak,
        "per_client_step": per,
        **spec.get("found", {}),
    }


def memory(rep: Report, dev: torch.device, size: dict, oom_clients: int | None = None) -> None:
    def worker(budget: str, **extra) -> dict:
        spec = {"device": str(dev), "memory": size["memory"], "budget": budget, **extra}
        p = subprocess.run(
            [sys.executable, __file__, json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=max(30, rep.left()),
        )
        if p.returncode:
            raise RuntimeError(f"memory worker ({budget}) exit {p.returncode}: {p.stderr[-1500:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])

    m = size["memory"]
    what = f"{m['model']} {m['clients']} clients x batch {m['batch']}"
    if oom_clients and dev.type == "cuda":  # --oom-clients N: the out-of-memory case alone, N clients
        return overflow(rep, m, worker, oom_clients)
    a = worker("none")
    rep.put("memory", "unbudgeted", a)
    rep.say(
        f"{what}, no budget: peak {a['peak_bytes'] / 2**30:.1f} GiB in {a['calls']} call(s); probe: "
        f"{a['per_client_step'] / 2**30:.2f} GiB per client-step"
    )
    b = worker("two_chunks")
    rep.put("memory", "two_chunks", b)
    rep.check(
        f"{what}: a budget for half the clients trains them in >= 2 chunks",
        b["calls"] >= 2,
        f"{b['calls']} calls, budget {b.get('budget', 0) / 2**30:.2f} GiB",
    )
    if dev.type == "cuda":
        rep.check(
            f"{what}: the peak stays within the budget",
            b["peak_bytes"] <= b["budget"],
            f"peak {b['peak_bytes'] / 2**30:.2f} GiB, budget {b['budget'] / 2**30:.2f} GiB",
        )
    if not m["oom_case"] or dev.type != "cuda":
        rep.say("(the out-of-memory halving: GPU only)")
        return
    # The probe over-counts a client's marginal memory on a GPU (first H200 run: probe 10.4 GiB per ResNet-50
    # client-step; the peak grew 2.9 GiB per client from 10 to 21 clients, and 21 clients fitted in 126 GiB), so
    # 3x the device by the probe is what makes ~1.5x in fact.
    total = torch.cuda.get_device_properties(dev).total_memory
    overflow(rep, m, worker, max(m["clients"] + 1, math.ceil(3 * total / max(1, a["per_client_step"]))))


def overflow(rep: Report, m: dict, worker, n: int) -> None:
    c = worker("overflow", overflow_clients=n)
    rep.put("memory", "overflow", c)
    rep.check(
        f"{m['model']} {n} clients (more than the device holds): the out-of-memory halving finishes the round",
        c["calls"] >= 2,
        f"{c['calls']} calls, peak {c['peak_bytes'] / 2**30:.1f} GiB",
    )


if __name__ == "__main__":  # a measurement's own process (memory's worker): its JSON on the last line
    sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]  # fedbench from this checkout
    print(json.dumps(memory_worker(json.loads(sys.argv[1]))))
