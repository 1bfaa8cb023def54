"""Communication accounting (issue #34, fedbench/communication.py, docs/communication.md): every algorithm config runs
2 rounds (golden's setup: the BatchNorm tiny CNN on the 8x8 digits, 6 clients, 3 per round) and must log, per round,
the MB its declaration gives — checked against counts computed here by hand from the tiny CNN's layer sizes.

The tiny CNN (conf/model/tiny_cnn.yaml) on 1x8x8 inputs, 10 classes:
  body: conv 1->8 3x3 (72 + 8), BN(8) (8 + 8; buffers 8 + 8 + 1),
        conv 8->16 3x3 (1152 + 16), BN(16) (16 + 16; 16 + 16 + 1)
  head: Linear 64->32 (2048 + 32), BN(32) (32 + 32; 32 + 32 + 1), Linear 32->10 (320 + 10)
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from conftest import REPO, fedbench_main, make_cfg

from fedbench.algorithms import ALGORITHMS
from fedbench.algorithms.base import Algorithm
from fedbench.communication import Traffic, round_metrics, totals
from fedbench.run import Run

_spec = importlib.util.spec_from_file_location("golden", REPO / "scripts" / "golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

P_BODY = 72 + 8 + 8 + 8 + 1152 + 16 + 16 + 16  # 1296 body parameters
B_BODY = (8 + 8 + 1) + (16 + 16 + 1)  # 50 body buffers (running mean, var, counter)
P_HEAD = 2048 + 32 + 32 + 32 + 320 + 10  # 2474 head parameters
B_HEAD = 32 + 32 + 1  # 65
P_CLS = 320 + 10  # the final Linear
P_BN = 8 + 8 + 16 + 16 + 32 + 32  # BatchNorm affine parameters
P_ALL = P_BODY + P_HEAD  # 3770
MODEL = P_ALL + B_BODY + B_HEAD  # 3885 numbers
FEATURES = 16 * 2 * 2  # the head's input (fedproto / fedrema +F / fedpac class means)
MOON = MODEL - P_CLS + (32 * 32 + 32) + (32 * 256 + 256) + (256 * 10 + 10)  # projection head, new classifier
PIXELS = 8 * 8
K, M = 6, 3  # clients, per round
ROUNDS = 2


class Seen:
    """What a run's expectations need besides the layer sizes: who took part and the data they hold."""

    def __init__(self, run: Run):
        self.run = run
        self.clients = {t: run.sample_clients(t).tolist() for t in range(1, ROUNDS + 1)}
        self.counts = np.asarray(run.data.counts)  # [K, C] train samples per client and class

    def held(self, t: int) -> int:
        """Sum over round t's clients of the classes each holds."""
        return int((self.counts[self.clients[t]] > 0).sum())

    def union(self, t: int) -> int:
        """Classes held by at least one of round t's clients (the server's class means after round t)."""
        return int((self.counts[self.clients[t]] > 0).any(0).sum())

    def known(self, t: int) -> int:
        """Class means the server holds at the start of round t (those of round t − 1's clients)."""
        return 0 if t == 1 else self.union(t - 1)

    def m(self, t: int) -> int:
        return len(self.clients[t])


def both(per_client):
    return lambda s, t: (s.m(t) * per_client, s.m(t) * per_client)


def phase_two(inner):
    """ECL and its baselines: phase I's traffic, plus the final global model to all K clients after round T."""
    return lambda s, t: (inner(s, t)[0], inner(s, t)[1] + (K * MODEL if t == ROUNDS else 0))


def fomo(s, t):
    """Each client downloads min(M=5, uploaded peers other than itself); nobody has uploaded before round 1."""
    uploaded = set() if t == 1 else set(s.clients[1])
    return s.m(t) * MODEL, sum(min(5, len(uploaded - {k})) * MODEL for k in s.clients[t])


def class_means(d):
    """FedProto / FedDistill: up a d-vector per class held, down the server's means at the round's start."""
    return lambda s, t: (s.held(t) * d, s.m(t) * s.known(t) * d)


def fedpac(s, t):
    up = s.m(t) * (MODEL + 1) + s.held(t) * (2 * FEATURES + 1)  # model, V_k; H_k, μ'_k, n_k,c per class held
    return up, s.m(t) * (MODEL + s.known(t) * FEATURES)


def fedrema_f(s, t):
    return s.m(t) * P_ALL + s.held(t) * FEATURES, s.m(t) * P_ALL + s.m(t) * s.known(t) * FEATURES


def fedka(s, t):
    up, down = both(MODEL)(s, t)
    return up, down + (K * 10 * PIXELS if t == 1 else 0)  # S: one digit per class to every client, once


CAFEME = ["model=cafeme_mnist", *golden.EXTRA["cafeme"][1:]]

# config -> (extra overrides, expected (up, down) numbers of round t): each registered algorithm's own config and the
# configs whose options change what is sent (the other configs only change hyperparameters; golden pins their numbers).
# The registry test below fails for a registered algorithm without an entry.
EXPECTED = {
    "cafeme": ([], None),  # the CAFeMe net: counted from its modules in the test
    "ditto": ([], both(MODEL)),
    "ecl": ([], phase_two(both(MODEL))),
    "ecl_scaffold": ([], phase_two(both(MODEL + P_ALL))),  # + the control variate, parameter-sized
    "fedafa": ([], phase_two(both(MODEL))),
    "fedala": ([], both(MODEL)),
    "fedavg": ([], both(MODEL)),
    "fedavg_ft": ([], both(MODEL)),
    "fedavg_lws": ([], phase_two(both(MODEL))),
    "fedavg_taunorm": ([], phase_two(both(MODEL))),
    "fedbabu": ([], both(P_BODY + B_BODY)),  # head = all FC layers, frozen and never sent
    "fedbn": ([], both(MODEL - P_BN - B_BODY - B_HEAD)),  # every BatchNorm layer stays local
    "fedcom": (["partition=complementary_pairs", "clients=10"], None),  # 10 clients: below
    "feddistill": ([], class_means(10)),  # per-class mean logits
    "feddyn": ([], both(MODEL)),
    "fedfomo": ([], fomo),
    "fedka": ([], fedka),
    "fedlc": ([], both(MODEL)),
    "fedntd": ([], both(MODEL)),
    "fedpac": ([], fedpac),
    "fedper": ([], both(P_BODY + B_BODY)),  # head = all FC layers, local
    "fedproto": ([], class_means(FEATURES)),
    "fedprox": ([], both(MODEL)),
    "fedrema": ([], both(P_ALL)),  # bn_stats: local — the statistics never leave a client
    "fedrema_f": (["drop_last=false"], fedrema_f),
    "fedrep": ([], both(P_BODY + B_BODY + B_HEAD)),  # the body; the buffers are averaged, the heads stay
    "fedrep_caf": ([], both(MODEL)),
    "fedrod": ([], both(MODEL)),  # body + generic head; the personal final Linear stays
    "ifca": ([], lambda s, t: (s.m(t) * MODEL, s.m(t) * 4 * MODEL)),  # all J = 4 cluster models down
    "lgfedavg": ([], both(P_CLS)),  # only the final Linear is global
    "local": ([], lambda s, t: (0, 0)),
    "moon": ([], both(MOON)),
    "moon_rema": ([], both(MODEL)),  # PFLlib's MOON: no projection head
    "perfedavg": ([], both(MODEL)),
    "pfedla": ([], lambda s, t: (s.m(t) * P_ALL, s.m(t) * P_ALL)),  # parameters only: BN statistics stay
    "pfedme": ([], both(MODEL)),
    "scaffold": ([], both(MODEL + P_ALL)),
}
# variants whose options change what is sent
VARIANTS = {
    "fedrema/averaged": ("fedrema", ["algorithm.bn_stats=averaged"], both(MODEL)),
    "pfedla/retain_all": ("pfedla", ["algorithm.retain_layers=7"], lambda s, t: (s.m(t) * P_ALL, 0)),
    "fedper/classifier": ("fedper", ["algorithm.head_scope=classifier"], both(MODEL - P_CLS)),
    "lgfedavg/head": ("lgfedavg", ["algorithm.head_scope=head"], both(P_HEAD + B_HEAD)),
}


def run_config(algorithm: str, extra: list[str], tmp_path):
    overrides = [*golden.COMMON, f"algorithm={algorithm}", *golden.EXTRA.get(algorithm, []), *extra]
    cfg = make_cfg(*overrides, "hardware.precision=fp32", "eval_every=2")
    run = Run(cfg, tmp_path / algorithm.replace("/", "_"))
    summary = run.execute()
    rows: dict[int, dict] = {}
    for ln in (run.run_dir / "metrics.jsonl").read_text().splitlines():  # a round may log more than one row
        r = json.loads(ln)
        rows.setdefault(r["round"], {}).update(r)
    return run, summary, rows


def check(run, summary, rows, expected) -> None:
    seen = Seen(run)
    up_cum = down_cum = 0.0
    for t in range(1, ROUNDS + 1):
        up, down = expected(seen, t)
        r = rows[t]
        assert r["comm/up_MB"] * 1e6 == pytest.approx(4 * up, abs=1e-6), f"round {t} up"
        assert r["comm/down_MB"] * 1e6 == pytest.approx(4 * down, abs=1e-6), f"round {t} down"
        up_cum, down_cum = up_cum + 4 * up / 1e6, down_cum + 4 * down / 1e6
        assert r["comm/up_MB_cum"] == pytest.approx(up_cum) and r["comm/down_MB_cum"] == pytest.approx(down_cum)
        assert r["comm/MB_cum"] == pytest.approx(up_cum + down_cum)
    assert summary["communication"] == pytest.approx({"up_MB": up_cum, "down_MB": down_cum, "MB": up_cum + down_cum})


@pytest.mark.parametrize("algorithm", sorted(EXPECTED))
def test_every_config_logs_what_it_sends(tmp_path, algorithm):
    extra, expected = EXPECTED[algorithm]
    run, summary, rows = run_config(algorithm, extra, tmp_path)
    if algorithm == "cafeme":
        net = run.fm.net
        model = sum(p.numel() for p in net.parameters()) + sum(b.numel() for b in net.buffers())
        expected = both(model)
    if algorithm == "fedcom":  # 10 clients, 5 per round: the global model and a personal model each way
        assert all(len(c) == 5 for c in Seen(run).clients.values())
        expected = both(2 * MODEL)
    check(run, summary, rows, expected)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_options_that_change_the_payload(tmp_path, variant):
    algorithm, extra, expected = VARIANTS[variant]
    check(*run_config(algorithm, extra, tmp_path / variant.replace("/", "_")), expected)


def test_every_registered_algorithm_and_config_declares_its_traffic():
    """A new algorithm must declare what it sends (Algorithm.traffic) and get an entry above."""
    undeclared = sorted(n for n, c in ALGORITHMS.items() if c.traffic is Algorithm.traffic)
    assert not undeclared, f"{undeclared} declare no traffic (Algorithm.traffic)"
    tested = {make_cfg(f"algorithm={a}").algorithm.name for a in EXPECTED}
    assert set(ALGORITHMS) <= tested, f"registered but never tested: {sorted(set(ALGORITHMS) - tested)}"


def test_running_totals_continue_the_history():
    """The cumulative MB continue from the last logged row (a resumed run's history), in MB = 10^6 bytes."""
    history = [{"round": 0}, {"round": 1, "comm/up_MB_cum": 2.5, "comm/down_MB_cum": 7.0, "comm/MB_cum": 9.5}]
    got = round_metrics(Traffic(up=250_000, down=1_000_000), history)
    assert got == pytest.approx(
        {
            "comm/up_MB": 1.0,
            "comm/down_MB": 4.0,
            "comm/up_MB_cum": 3.5,
            "comm/down_MB_cum": 11.0,
            "comm/MB_cum": 14.5,
        }
    )
    assert totals([*history, {"round": 2, **got}]) == pytest.approx({"up_MB": 3.5, "down_MB": 11.0, "MB": 14.5})
    assert totals([{"round": 0}]) == {}


# ---- the report: MB columns and accuracy against MB ------------------------------------------------------------
MLP = (64 * 128 + 128) + (128 * 10 + 10)  # the digits MLP (conf/model/mlp.yaml): body Linear 64->128, head 128->10
MLP_BODY = 64 * 128 + 128


def test_report_puts_mb_to_reach_an_accuracy_and_in_total_next_to_it(tmp_path, capsys):
    from fedbench.report import main as report_main

    sweep = tmp_path / "sweep"
    fedbench_main(["-m", "algorithm=fedavg,fedper", "dataset=digits", "clients=4", "rounds=3", "logger=none",
                  "hardware.threads=1", f"hydra.sweep.dir={sweep}"])  # fmt: skip
    out = tmp_path / "report"
    assert report_main([str(sweep), "--comm", "40", "--no-wandb", "--out", str(out)]) == 0
    import csv

    cells = {(r["row"], r["column"]): r for r in csv.DictReader((out / "runs_pers_acc.csv").open())}
    per_round = {"fedavg": 4 * 2 * MLP * 4 / 1e6, "fedper": 4 * 2 * MLP_BODY * 4 / 1e6}  # 4 clients, both ways, fp32
    for method, mb in per_round.items():
        assert float(cells[(method, "MB total")]["ours_mean"]) == pytest.approx(3 * mb)
        (run,) = [d for d in sweep.iterdir() if f"algorithm={method}" in d.name]
        acc = {}
        for ln in (run / "metrics.jsonl").read_text().splitlines():
            r = json.loads(ln)
            if "pers/acc" in r:
                acc[r["round"]] = r["pers/acc"]
        first = min((t for t, a in acc.items() if t >= 1 and a >= 0.4), default=None)
        got = cells[(method, "MB to 40 %")]
        if first is None:
            assert got["cell"] == "\\"
        else:
            assert float(got["ours_mean"]) == pytest.approx(first * mb)
    assert (out / "runs_pers_acc_comm.png").stat().st_size > 10_000
    assert report_main([str(sweep), "--comm", "101", "--no-wandb", "--no-plots", "--out", str(tmp_path / "r2")]) == 0
    cells = {(r["row"], r["column"]): r for r in csv.DictReader((tmp_path / "r2" / "runs_pers_acc.csv").open())}
    assert cells[("fedavg", "MB to 101 %")]["cell"] == "\\"  # never reached
