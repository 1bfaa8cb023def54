"""The device benchmark (scripts/device_bench.py, issue 50): its FLOP count against hand-computed ones, its input
checks, its plan, and the whole script in --cpu-smoke mode, checked for its fields and their internal consistency
(every rate recomputed from the JSON's own numbers)."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "device_bench.py"


@pytest.fixture(scope="module")
def db():
    spec = importlib.util.spec_from_file_location("device_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_flops_of_a_known_net_are_the_hand_computed_ones(db):
    # batch 4, Linear(3 -> 5), ReLU, Linear(5 -> 2): forward 2*4*3*5 + 2*4*5*2 = 200; backward: the second layer's
    # weight and input gradients (80 + 80), the first layer's weight gradient only (120: the input needs none) = 280
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    assert db.step_flops(net, x, y) == 480
    assert all(p.grad is None for p in net.parameters())  # the count leaves no gradient behind


def test_a_conv_layer_counts_its_multiply_adds(db):
    # Conv2d(2 -> 3, k 3) on 1 x 2 x 5 x 5: output 3 x 3 x 3 = 27 positions x 18 multiply-adds = 486 MACs, 972 FLOPs
    # forward; backward: its weight gradient only (972: the input needs none); then Flatten + Linear(27 -> 2): 108
    # forward, 108 for its weight gradient and 108 for its input gradient
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3, bias=False), torch.nn.Flatten(), torch.nn.Linear(27, 2))
    x = torch.randn(1, 2, 5, 5)
    assert db.step_flops(net, x, torch.tensor([1])) == 2 * 972 + 3 * 108


@pytest.mark.parametrize(
    "text", ["fast", "fast:", ":hardware.x=1", "fast:hardware.x", "fast:=1", "fp32:hardware.tf32=true"]
)
def test_a_bad_variant_is_one_line_naming_it(db, text):
    with pytest.raises(SystemExit) as e:
        db.parse_variant(text)
    assert repr(text) in str(e.value) and "\n" not in str(e.value)


def test_a_variant_adds_one_part_per_chosen_setting_first_arm(db):
    name, ov = db.parse_variant("graph:hardware.cuda_graph=true, hardware.compile=false")
    assert (name, ov) == ("graph", ["hardware.cuda_graph=true", "hardware.compile=false"])
    size = db.SIZES["gpu"]
    parts = db.chosen_parts(size, ["fedka", "ecl"], [(name, ov)])
    extra = [p for p in parts if p[2] == "graph"]
    assert [(p[0], p[1], p[3]) for p in extra] == [("ecl", "ecl", ov), ("fedka", "fedavg", ov)]
    assert all(p[0] in ("fedka", "ecl") for p in parts)


def test_the_plan_covers_every_setting_and_fits_the_device_call(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, str(SCRIPT), "--plan", "--out", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert not out.exists()  # "run nothing": a plan writes no report (it once left a device_bench_<time>/ behind)
    total = float(next(ln for ln in p.stdout.splitlines() if "total: est." in ln).split("est.")[1].split()[0])
    start = float(next(ln for ln in p.stdout.splitlines() if "the device command: +" in ln).split("~")[1].split()[0])
    assert total + start <= 360  # ONE device command of about 6 minutes (issue 50), its start included
    for label in (
        "ECL Table 1",
        "FedKA Table 1",
        "FedReMa Table 1",
        "FedCOM Table 1",
        "CAFeMe Table 1",
        "pfl-research",
    ):
        assert label in p.stdout


@pytest.mark.parametrize("args", [["--variant", "nocolon"], ["--settings", "fedka,nope"], ["--budget", "0"]])
def test_bad_input_exits_before_any_work(tmp_path, args):
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(tmp_path / "o"), *args],
        capture_output=True,
        text=True,
    )
    assert p.returncode != 0
    assert len(p.stderr.strip().splitlines()) == 1 and args[1] in p.stderr
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    env = {k: v for k, v in os.environ.items() if k != "FEDBENCH_DATA"}
    p = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--cpu-smoke",
            "--out",
            str(out),
            "--settings",
            "ecl,fedka",
            "--variant",
            "tf32on:hardware.tf32=true",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads((out / "device_bench.json").read_text()), (out / "report.txt").read_text()


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9)


def test_smoke_measures_every_chosen_part(smoke):
    data, report = smoke
    got = data["sections"]["settings"]
    names = {(k.split(" [")[0], k.rsplit("] ", 1)[1]) for k in got}
    assert names == {
        ("ECL Table 1, CIFAR-10-LT, ResNet-32", "fp32"),
        ("ECL Table 1, CIFAR-10-LT, ResNet-32", "tf32on"),
        ("FedKA Table 1, CIFAR-10, t-CNN", "fp32"),
        ("FedKA Table 1, CIFAR-10, t-CNN", "bf16"),
        ("FedKA Table 1, CIFAR-10, t-CNN", "tf32on"),
    }
    assert not data["failed"]
    for k in got:
        assert k in report
    tf32 = next(m for k, m in got.items() if k.startswith("FedKA") and k.endswith("tf32on"))
    assert "hardware.tf32=true" in tf32["overrides"] and tf32["precision"] == "fp32"
    assert next(m for k, m in got.items() if k.endswith("bf16"))["precision"] == "bf16"


def test_smoke_numbers_are_consistent(smoke):
    data, _ = smoke
    peak = data["sections"]["peaks"]["measured"]
    for key, m in data["sections"]["settings"].items():
        bb = m["big_batch"]
        assert m["sample_grads"] == m["jobs"]["samples"] > 0, key
        assert close(m["sample_grads_per_s"], m["sample_grads"] / m["train_s"]), key
        assert close(m["effective_tflops"], m["flops_per_sample"] * m["sample_grads"] / m["train_s"] / 1e12), key
        assert close(bb["sample_grads_per_s"], bb["batch"] * bb["steps"] / bb["seconds"]), key
        assert close(bb["effective_tflops"], bb["flops_per_step"] * bb["steps"] / bb["seconds"] / 1e12), key
        assert close(m["stacked_over_big_batch"], m["sample_grads_per_s"] / bb["sample_grads_per_s"]), key
        assert close(m["busy"], m["profile"]["kernel_s_per_call"] / m["wall_s_per_call"]), key
        assert close(m["wall_s_per_call"], m["train_s"] / m["jobs"]["calls"]), key
        assert close(m["fraction_of_peak"]["fp32"], m["effective_tflops"] / peak["fp32_matmul_tflops"]), key
        assert close(m["fraction_of_peak"]["bf16"], m["effective_tflops"] / peak["bf16_matmul_tflops"]), key
        # K stacked clients at batch B against one model at K*B: FLOPs are linear in the batch
        assert bb["batch"] == m["clients_per_round"] * m["batch_size"], key
        assert close(bb["flops_per_step"], m["flops_per_sample"] * bb["batch"]), key
        top = m["profile"]["top"]
        assert top and sum(t["share"] for t in top) <= 1 + 1e-9, key
        assert 0 < m["profile"]["compute_ops_per_call"] < m["profile"]["kernels_per_call"], key  # CPU: views left out
        assert m["executor"] == "vectorized" and set(m["jobs"]["by_executor"]) <= {"vectorized", "sequential"}
        assert m["local_epochs"] <= m["paper_local_epochs"]


def test_smoke_counts_the_samples_the_data_holds(smoke):
    # FedAvg trains every client's samples once per epoch: the executors' count equals the data's
    data, _ = smoke
    for key, m in data["sections"]["settings"].items():
        if key.startswith("FedKA") and "[fedavg]" in key:
            assert m["sample_grads"] == m["samples_from_data"], key


def test_smoke_times_ecl_phase_two_apart(smoke):
    data, _ = smoke
    m = next(m for k, m in data["sections"]["settings"].items() if k.startswith("ECL") and k.endswith("fp32"))
    p2 = m["phase2"]
    # phase II trains all K clients' calibrated models (K jobs' worth of samples) plus the experts
    assert p2["jobs"]["jobs"] >= 2 and p2["jobs"]["samples"] > 0 and p2["seconds"] > 0
    assert close(p2["sample_grads_per_s"], p2["jobs"]["samples"] / p2["seconds"])


def test_a_budget_too_small_skips_and_says_so(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FEDBENCH_DATA"}
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(tmp_path), "--settings", "fedka", "--budget", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    data = json.loads((tmp_path / "device_bench.json").read_text())
    assert "settings" not in data["sections"] and len(data["sections"]["skipped"]) == 2
    assert "SKIPPED" in (tmp_path / "report.txt").read_text()


def test_gpu_check_times_an_ordinary_round_not_ecls_last(db):
    # gpu_check section 4 built its runs with rounds=2, so that its timed round 2 was the run's last: ECL's phase II
    # (once per run) trained inside it (2026-11-26 H200: a 37 s "round", a 310-min paper run). Now the two rounds it
    # drives train phase I only: one job each (FedAvg's), no phase-II job.
    import gpu_check as gc

    exp, job = gc.paper_job("ecl", "table1", "paper", "ecl")
    smoke = db.SIZES["smoke"]
    extra = [*db.applicable(gc.compose(exp.job_args(job)), smoke["overrides"]), *smoke["extra"]["ecl"]]
    jobs = db.Jobs()
    with jobs.active():
        m = gc.measure_job(torch.device("cpu"), exp, job, None, extra)
    got = jobs.take()
    assert got["jobs"] == 2 and m["rounds"] == 500
    assert got["samples"] == 2 * m["sample_grads"]  # the timed round's count is the data's, as round 1's
