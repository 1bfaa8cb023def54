"""FedReMa's S/MDS diagnostics (Eq. 5, Alg. 1, Eq. 8) as a monitor beside any method — the paper's Figure 3 shows S
while training FedAvg."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import build_context, make_cfg, metrics_by_round, run_cfg

from fedbench import seeding
from fedbench.algorithms import ALGORITHMS
from fedbench.engine.stack import broadcast
from fedbench.errors import ConfigError
from fedbench.run import Run
from fedbench.similarity import SimilarityMonitor

K = 5
BASE = (
    "model=tiny_cnn",
    "partition=dominant_groups",
    "partition.samples_per_client=60",
    f"clients={K}",
    "hardware.precision=fp64",
    "rounds=3",
)
MONITOR = ("eval.similarity.enabled=true", "eval.similarity.save_rounds=[1,3]")


def _code_row(s: np.ndarray):
    """The code's get_sort_grad + argmax(diff[:-1]) for one row: the relevant set and Δs*."""
    order = np.argsort(s)
    diff = np.diff(np.sort(s))
    m = int(np.argmax(diff[:-1]))
    return {int(order[-i]) for i in range(1, len(s) - m)}, float(diff[:-1].max())


def _hand_similarity(run, heads: dict, bufs: dict, t: int, M: float = 0.5, scale: float = 0.5) -> np.ndarray:
    """Code ``compute_similarity_guassian``: per client k a probe h ~ U[0, 0.5)^d, p_k = softmax(φ_k(h)/M), peers
    softmax(φ_j(h)) (T = 1), s_kj = cos, s_kk = 1 — a plain loop over client pairs. ``run``: a Run or a Context (its
    ``fm`` and ``cfg``)."""
    fm, d = run.fm, run.fm.net.feature_dim
    probes = torch.rand(K, d, generator=seeding.torch_generator(run.cfg.seed, "probe", t), dtype=torch.float64) * scale
    head = lambda i, h: fm.head(
        {n: v[i] for n, v in heads.items()},
        {n: v[i] for n, v in bufs.items()},  # noqa: E731
        h.unsqueeze(0),
    )[0]
    S = np.ones((K, K))
    fm.set_mode(False)
    with torch.no_grad():
        for k in range(K):
            pk = torch.softmax(head(k, probes[k]) / M, 0)
            for j in range(K):
                if j != k:
                    S[k, j] = torch.cosine_similarity(pk, torch.softmax(head(j, probes[k]), 0), 0).item()
    fm.set_mode(True)
    return S


def test_monitor_beside_fedavg_computes_s_on_the_rounds_trained_local_heads(tmp_path):
    cfg = make_cfg("algorithm=fedavg", *BASE, *MONITOR)
    run_cfg(cfg, tmp_path / "run")
    out = tmp_path / "run" / "diagnostics" / "head_similarity"
    # round 1 starts from the initial model: replay the clients' local training (keyed by seed and round: exact)
    replay = Run(cfg, tmp_path / "replay")
    replay.setup()
    algo, clients = replay.algorithm, torch.arange(K)
    res = algo.local_train(
        1, clients, (broadcast(replay.initial_params, K), broadcast(replay.initial_buffers, K)), algo.train_spec
    )
    heads = {n: v for n, v in res.params.items() if n.startswith("head.")}
    bufs = {n: v for n, v in res.buffers.items() if n.startswith("head.")}  # the head's BatchNorm (eval mode)
    assert bufs
    want = _hand_similarity(replay, heads, bufs, 1)
    saved = np.load(out / "round_00001.npz")
    assert np.allclose(saved["S"], want, atol=1e-12)
    assert not np.allclose(want, 1.0)  # local heads differ (the global model's would give S = 1)
    rows = metrics_by_round(tmp_path / "run")
    sets, gaps = zip(*(_code_row(want[k]) for k in range(K)))
    assert rows[1]["similarity/relevant_set_sizes"] == [len(a) for a in sets]
    assert rows[1]["similarity/mean_max_diff"] == pytest.approx(np.mean(gaps), abs=1e-12)  # Δs̄ (Eq. 8, as a mean)
    assert saved["relevant"].sum(1).tolist() == [len(a) for a in sets]
    assert all("similarity/mean_max_diff" in rows[t] for t in (1, 2, 3))
    assert sorted(p.name for p in out.glob("round_*.npz")) == ["round_00001.npz", "round_00003.npz"]
    assert (out / "figure.png").stat().st_size > 0


def test_the_monitor_built_from_a_context_gives_the_mean_mds_gap_of_the_rounds_heads_without_a_run(tmp_path):
    """Built from the algorithm's Context and the ``eval.similarity`` node: Δs̄ of one FedAvg round is the mean of the
    code's per-row MDS gaps of S computed pair by pair from the heads it heard; the saved round's figure goes to the
    context's ``publish``."""
    cfg = make_cfg("algorithm=fedavg", *BASE, *MONITOR)
    ctx = build_context(cfg, tmp_path)
    published = []
    ctx.publish = lambda key, path, t: published.append((key, path, t))
    algo = ALGORITHMS["fedavg"](ctx)
    algo.setup()
    monitor = SimilarityMonitor(ctx, cfg.eval.similarity)
    trained = []
    ctx.observers.append(lambda t, ids, res, phase: trained.append(res) if phase == "train" else None)
    monitor.before_round(algo, 1)
    algo.round(1, torch.arange(K))
    out = monitor.after_round(algo, 1)
    res = trained[-1]
    heads = {n: v for n, v in res.params.items() if n.startswith("head.")}
    bufs = {n: v for n, v in res.buffers.items() if n.startswith("head.")}
    sets, gaps = zip(*(_code_row(s) for s in _hand_similarity(ctx, heads, bufs, 1)))
    assert len(set(gaps)) > 1 and out["similarity/mean_max_diff"] == pytest.approx(np.mean(gaps), abs=1e-12)
    assert out["similarity/relevant_set_sizes"] == [len(a) for a in sets]
    figure = tmp_path / "diagnostics" / "head_similarity" / "figure.png"
    assert published == [("head_similarity", figure, 1)] and figure.stat().st_size > 0


def test_monitor_beside_fedrema_sees_what_fedrema_sees(tmp_path):
    """Same trained heads, probes and temperatures: the monitor's S and Δs̄ are FedReMa's own
    (one concept, one place)."""
    cfg = make_cfg("algorithm=fedrema", *BASE, *MONITOR, "algorithm.plot_every=1")
    run_cfg(cfg, tmp_path)
    for t in (1, 3):
        mine = np.load(tmp_path / "diagnostics" / "head_similarity" / f"round_{t:05d}.npz")["S"]
        assert np.allclose(mine, np.load(tmp_path / "diagnostics" / "similarity" / f"round_{t:05d}.npy"), atol=1e-12)
    for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()):
        if "fedrema/mean_max_diff" in r:
            assert r["similarity/mean_max_diff"] == pytest.approx(r["fedrema/mean_max_diff"], abs=1e-12)


def test_figure3_experiment_composes_fedavg_in_the_table1_cifar10_setting_with_the_papers_rounds():
    cfg = make_cfg("+experiment=fedrema/figure3", fast=False)
    assert (cfg.algorithm.name, cfg.dataset.name, cfg.model.name) == ("fedavg", "cifar10", "alexnet")
    assert (cfg.partition.name, cfg.partition.s, cfg.partition.samples_per_client) == ("dominant_groups", 0.2, 600)
    assert cfg.eval.similarity.enabled and list(cfg.eval.similarity.save_rounds) == [1, 50, 100, 150]
    assert cfg.rounds == 150
    small = make_cfg("+experiment=fedrema/figure3", "scale=0.1", fast=False)
    assert list(small.eval.similarity.save_rounds) == [1, 5, 10, 15] and small.rounds == 15


@pytest.mark.parametrize(
    "key,value",
    [("every", 0), ("save_rounds", "[0]"), ("temperature", 0), ("probe_scale", -1), ("ignore_self_gap", "maybe")],
)
def test_bad_similarity_config_fails_before_training(tmp_path, key, value):
    with pytest.raises(ConfigError) as e:
        run_cfg(
            make_cfg("algorithm=fedavg", "eval.similarity.enabled=true", f"eval.similarity.{key}={value}"), tmp_path
        )
    assert f"eval.similarity.{key}" in str(e.value)
    assert not (tmp_path / "metrics.jsonl").exists()
