"""FedReMa (spec fedrema.md): MDS, CCP, dependency map, vectorized server rules, executors, diagnostics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import make_cfg, run_cfg

from fedbench.algorithms.fedrema import ccp_continues, dependency_weights, head_mixing, mds, relevant_weights
from fedbench.engine.stack import mix
from fedbench.errors import ConfigError
from fedbench.loggers import build_loggers
from fedbench.losses import prototype_alignment
from fedbench.run import Run


# ---- MDS (Alg. 1) on hand-made similarity vectors -------------------------------------------------------
def test_mds_splits_at_the_largest_gap_and_ignores_the_self_gap():
    S = torch.tensor(
        [
            [1.00, 0.90, 0.85, 0.30, 0.20],  # sorted .2 .3 .85 .9 1: largest gap .3 -> .85
            [0.50, 1.00, 0.45, 0.10, 0.05],
        ],  # gaps .05 .35 .05 | .5 (self): the self-gap is ignored
        dtype=torch.float64,
    )
    A, gap = mds(S)
    assert A[0].tolist() == [True, True, True, False, False]
    assert A[1].tolist() == [True, True, True, False, False]
    assert gap.tolist() == pytest.approx([0.55, 0.35])
    A, gap = mds(S, ignore_self_gap=False)  # the paper's Alg. 1: the self-gap .5 wins in row 1
    assert A[1].tolist() == [False, True, False, False, False] and gap[1].item() == pytest.approx(0.5)
    assert A[0].tolist() == [True, True, True, False, False]


def test_mds_ties_pick_the_first_gap_and_all_equal_keeps_everybody():
    ties = torch.tensor([[1.0, 0.75, 0.5, 0.25, 0.0]])  # all gaps 0.25 (exact): first gap -> largest set
    A, gap = mds(ties)
    assert A[0].tolist() == [True, True, True, True, False] and gap.item() == 0.25
    flat = torch.ones(1, 5)  # no gap at all: nobody can be told apart
    A, gap = mds(flat)
    assert A.all() and gap.item() == 0.0
    A, gap = mds(torch.tensor([[1.0, 0.3], [0.3, 1.0]]))  # K = 2: no gap left once the self-gap is dropped
    assert A.all() and gap.tolist() == [0.0, 0.0]


def _code_mds(s: np.ndarray):
    """The official code's aggregate_heads_diff / get_sort_grad for one row (github.com/liangh68/FedReMa)."""
    sorted_values, sorted_args = np.sort(s), np.argsort(s)
    diff = np.diff(sorted_values)
    max_id = int(np.argmax(diff[:-1]))
    num = len(sorted_args) - 1 - max_id
    return {int(sorted_args[-i]) for i in range(1, num + 1)}, float(np.max(diff[:-1]))


def test_mds_matches_the_code_row_by_row_on_random_similarities():
    g = torch.Generator().manual_seed(0)
    S = torch.rand(20, 20, generator=g, dtype=torch.float64).fill_diagonal_(1.0)
    A, gap = mds(S)
    for k in range(20):
        chosen, best = _code_mds(S[k].numpy())
        assert set(torch.nonzero(A[k]).flatten().tolist()) == chosen
        assert gap[k].item() == pytest.approx(best)


# ---- CCP (Eq. 8-9), G and Eq. 7/10 weights --------------------------------------------------------------
def test_ccp_ends_the_first_time_the_ratio_to_the_peak_drops_below_delta():
    H = [0.10, 0.30, 0.50, 0.40, 0.25, 0.24, 0.60, 0.10]  # peak .5 at t=3; .25/.5 = δ stays (code: strict <)
    ended = next(t for t in range(1, len(H) + 1) if not ccp_continues(H[:t], 0.5))
    assert ended == 6  # .24/.5 = .48 < .5
    assert all(ccp_continues(H[:t], 0.5) for t in range(1, 6))
    assert ccp_continues([0.3, 0.9], 0.99)  # a new maximum always continues
    assert ccp_continues([0.0, 0.0], 0.5)  # no gap ever: nothing to compare with
    assert next(t for t in range(1, 9) if not ccp_continues(H[:t], 0.9)) == 4  # .4/.5 = .8 < .9


def test_dependency_map_weights_are_eq10_and_eq7_weights_follow_the_relevant_sets():
    A1 = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    A2 = torch.tensor([[1, 0, 1], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    G = A1.double() + A2.double()  # G[k, i] = rounds in which k chose i
    assert G.tolist() == [[2, 1, 1], [2, 2, 0], [0, 1, 2]]
    W = dependency_weights(G)
    assert torch.allclose(W, torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.5, 0.0], [0.0, 1 / 3, 2 / 3]], dtype=W.dtype))
    assert dependency_weights(torch.tensor([[0.0, 0.0], [1.0, 3.0]])).tolist() == [[1.0, 0.0], [0.25, 0.75]]
    n = torch.tensor([10.0, 30.0, 60.0])
    W7 = relevant_weights(A1, n)
    assert torch.allclose(W7, torch.tensor([[0.25, 0.75, 0], [0.25, 0.75, 0], [0, 1 / 3, 2 / 3]], dtype=W7.dtype))
    assert relevant_weights(A1, n, by_samples=False)[2].tolist() == [0.0, 0.5, 0.5]


# ---- the head update: Eq. 7/10 as written (simultaneous) vs the code's in-place loop -----------------------
# 3 clients, Eq. 10 weights by client id (W[k, i] = g_ki / Σ_j g_kj) and one scalar head per client: φ̂ = 1, 10, 100.
W_BY_ID = torch.tensor([[1 / 2, 1 / 4, 1 / 4], [1 / 2, 1 / 2, 0.0], [0.0, 1 / 3, 2 / 3]], dtype=torch.float64)
TRAINED = {"head.w": torch.tensor([[1.0], [10.0], [100.0]], dtype=torch.float64)}


def _mixed(update, perm=None):
    M = head_mixing(W_BY_ID, update, None if perm is None else torch.tensor(perm))
    return mix(TRAINED, M)["head.w"].flatten().tolist()


def test_simultaneous_head_update_mixes_the_trained_heads():
    # φ_0 = ½·1 + ¼·10 + ¼·100 = 28;  φ_1 = ½·1 + ½·10 = 5.5;  φ_2 = ⅓·10 + ⅔·100 = 70
    assert _mixed("simultaneous") == pytest.approx([28.0, 5.5, 70.0], abs=1e-12)


def test_sequential_inplace_head_update_visits_clients_by_ascending_id_and_reuses_updated_heads():
    """The code's aggregate_heads_diff: ``for cid in sorted(uploaded_ids)`` ... ``set_head`` on the very modules the
    upload list references, so a later client mixes heads already replaced in this round."""
    # φ_0 = ½·1 + ¼·10 + ¼·100 = 28;  φ_1 = ½·φ_0 + ½·10 = 19 (client 0 already updated);  φ_2 = ⅓·φ_1 + ⅔·100 = 73
    assert _mixed("sequential_inplace") == pytest.approx([28.0, 19.0, 73.0], abs=1e-12)


def test_upload_order_pairing_applies_the_weight_of_id_j_to_the_jth_uploaded_head():
    """The code zips the id-indexed weights with ``uploaded_heads``, which are in ``random.sample`` order. Upload order
    [2, 0, 1]: position 0 holds client 2's head, 1 client 0's, 2 client 1's; client k gets Σ_j W[k, j]·head(perm[j])."""
    perm = [2, 0, 1]
    # simultaneous: φ_0 = ½·100 + ¼·1 + ¼·10 = 52.75;  φ_1 = ½·100 + ½·1 = 50.5;  φ_2 = ⅓·1 + ⅔·10 = 7
    assert _mixed("simultaneous", perm) == pytest.approx([52.75, 50.5, 7.0], abs=1e-12)
    # the code (both): φ_0 = 52.75;  φ_1 = ½·100 + ½·φ_0 = 76.375;  φ_2 = ⅓·φ_0 + ⅔·φ_1 = 68.5
    assert _mixed("sequential_inplace", perm) == pytest.approx([52.75, 76.375, 68.5], abs=1e-12)
    assert _mixed("sequential_inplace", [0, 1, 2]) == _mixed("sequential_inplace")  # identity order = by id


def test_head_update_options_reach_the_server_round(tmp_path):
    """A whole FedReMa round with the code's options equals the hand-written loop of the code on the same uploads."""
    run, algo = _setup(
        tmp_path,
        "algorithm.head_update=sequential_inplace",
        "algorithm.head_pairing=upload_order",
        "algorithm.relevant_weights=uniform",
    )
    K, clients = algo.K, torch.arange(algo.K)
    res = _uploads(algo, 1, clients)
    S = _loop_similarity(algo, 1, res)
    algo.round(1, clients)
    from fedbench import seeding

    perm = seeding.rng(algo.seed, "upload_order", 1).permutation(K)  # uploaded_heads[j] = client perm[j]
    heads = {name: [res.params[name][perm[j]].clone() for j in range(K)] for name in algo.head_names}
    position = {int(perm[j]): j for j in range(K)}
    for cid in range(K):  # sorted(self.uploaded_ids)
        chosen, _ = _code_mds(S[cid])
        w = [1 / len(chosen) if j in chosen else 0.0 for j in range(K)]  # weights[id] = 1/num_agg
        for name in algo.head_names:
            new = sum(w[j] * heads[name][j] for j in range(K))  # zip(weights, uploaded_heads)
            heads[name][position[cid]] = new  # set_head: in place
    for cid in range(K):
        for name in algo.head_names:
            assert torch.allclose(algo.phi[name][cid], heads[name][position[cid]], atol=1e-12), (cid, name)
    run2, simultaneous = _setup(tmp_path / "b")
    simultaneous.round(1, clients)
    assert not torch.allclose(simultaneous.phi[algo.head_names[0]], algo.phi[algo.head_names[0]])


# ---- prototypes (+F) ------------------------------------------------------------------------------------
def test_prototype_alignment_by_hand():
    h = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    loss = prototype_alignment(
        h, torch.tensor([0, 1]), torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.tensor([True, False])
    )
    assert loss.item() == pytest.approx((1 + 4) / 4)  # class 1 has no prototype: adds 0, still counted


def _fedrema_f(tmp_path, drop_last):
    cfg = make_cfg(
        "algorithm=fedrema_f",
        "model=tiny_cnn",
        "hardware.precision=fp64",
        "partition=dominant_groups",
        "partition.samples_per_client=60",
        "clients=4",
        "batch_size=20",
        f"drop_last={drop_last}",
    )
    run = Run(cfg, tmp_path)
    run.setup()
    return run.algorithm


def _hand_class_means(algo, res, m, idx):
    """Eval-mode body features of client m's trained model on the pool samples ``idx``, averaged per class."""
    fm, data = algo.fm, algo.data
    p = {k: v[m] for k, v in res.params.items()}
    b = {k: v[m] for k, v in res.buffers.items()}
    fm.set_mode(False)
    with torch.no_grad():
        h = fm.features(p, b, data.x[torch.as_tensor(idx)]).flatten(1)
    fm.set_mode(True)
    y = data.y[torch.as_tensor(idx)]
    return {c: h[y == c].mean(0) for c in y.unique().tolist()}, torch.bincount(y, minlength=data.num_classes)


@pytest.mark.parametrize("drop_last", [True, False])
def test_fedrema_f_prototypes_are_class_means_of_one_shuffled_train_epoch_as_the_code(tmp_path, drop_last):
    """Code ``collect_protos``: eval mode, one pass over ``load_train_data()`` — the client's TRAIN split in a shuffled
    DataLoader with drop_last=True, so with B = 20 and 48 train samples only 40 (two batches) enter the means."""
    from fedbench.engine.schedule import make_schedule

    algo = _fedrema_f(tmp_path, drop_last)
    clients = torch.arange(algo.K)
    res = _uploads(algo, 1, clients)
    means, counts = algo.client_prototypes(1, clients, res)
    n = algo.n.tolist()
    assert n == [48] * algo.K  # 60 samples, 20 % held out for testing
    assert counts.sum(1).tolist() == ([40] * algo.K if drop_last else n)
    epoch = make_schedule(
        [algo.data.train_idx[k] for k in range(algo.K)],
        list(range(algo.K)),
        20,
        algo.seed,
        "protos",
        1,
        epochs=1,
        drop_last=drop_last,
    )
    for m in range(algo.K):
        used = torch.cat(epoch[m]).numpy()
        assert set(used) <= set(algo.data.train_idx[m].tolist())  # never a test sample
        want, want_counts = _hand_class_means(algo, res, m, used)
        assert counts[m].tolist() == want_counts.tolist()
        for c, v in want.items():
            assert torch.allclose(means[m, c], v, atol=1e-12), (m, c)
    if not drop_last:  # all train samples: the partition's counts
        assert counts.tolist() == algo.data.counts.tolist()


# ---- the server round: vectorized == a per-client loop transcribing the code ------------------------------
def _setup(tmp_path, *overrides):
    cfg = make_cfg(
        "algorithm=fedrema",
        "model=tiny_cnn",
        "hardware.precision=fp64",
        "partition=dominant_groups",
        "partition.samples_per_client=60",
        "clients=6",
        *overrides,
    )
    run = Run(cfg, tmp_path)
    run.setup()
    run.loggers = build_loggers(cfg, tmp_path, "test")
    return run, run.algorithm


def _uploads(algo, t, clients):
    """The clients' trained models of round t (local training is keyed by (seed, t): replaying it is exact)."""
    res, _ = algo.client_update(t, clients, *algo.client_models(clients, t))
    return res


def _loop_similarity(algo, t, res):
    """compute_similarity_guassian of the code: per client k a probe, own softmax at M, peers at T = 1."""
    from fedbench import seeding

    fm, K, hp = algo.fm, algo.K, algo.hp
    g = seeding.torch_generator(algo.seed, "probe", t)
    probes = torch.rand(K, algo.feature_dim, generator=g, dtype=torch.float64) * hp.probe_scale
    head = lambda i, h: fm.head(
        {n: res.params[n][i] for n in algo.head_names},  # noqa: E731
        {n: res.buffers[n][i] for n in algo.head_bufs},
        h.unsqueeze(0),
    )[0]
    S = np.zeros((K, K))
    fm.set_mode(False)
    with torch.no_grad():
        for k in range(K):
            pk = torch.softmax(head(k, probes[k]) / hp.temperature, 0)
            for j in range(K):
                S[k, j] = 1.0 if j == k else torch.cosine_similarity(pk, torch.softmax(head(j, probes[k]), 0), 0).item()
    fm.set_mode(True)
    return S


def test_vectorized_head_aggregation_equals_a_per_client_loop(tmp_path):
    run, algo = _setup(tmp_path)
    K, clients = algo.K, torch.arange(algo.K)
    n = algo.n.numpy()
    # round 1, in the CCP: S by the code's loop, MDS per row, Eq. 7 weights, head by head
    res = _uploads(algo, 1, clients)
    S = _loop_similarity(algo, 1, res)
    algo.round(1, clients)
    expected_G = np.zeros((K, K))
    for k in range(K):
        chosen, _ = _code_mds(S[k])
        tot = sum(n[i] for i in chosen)
        for name in algo.head_names:
            want = sum(n[i] / tot * res.params[name][i] for i in chosen)
            assert torch.allclose(algo.phi[name][k], want, atol=1e-12), (k, name)
        for i in chosen:
            expected_G[k, i] += 1
    assert np.array_equal(algo.G.numpy(), expected_G)
    body = algo.body_names[0]
    assert torch.allclose(algo.theta[body], sum(n[i] / n.sum() * res.params[body][i] for i in range(K)), atol=1e-12)
    # a later round after the CCP: every head is the G-weighted average of Eq. 10
    algo.in_ccp = False
    algo.G = torch.tensor(np.random.default_rng(0).integers(0, 5, (K, K)), dtype=torch.float64) + torch.eye(K)
    res = _uploads(algo, 2, clients)
    algo.round(2, clients)
    G = algo.G.numpy()
    for k in range(K):
        for name in algo.head_names:
            want = sum(G[k, i] / G[k].sum() * res.params[name][i] for i in range(K))
            assert torch.allclose(algo.phi[name][k], want, atol=1e-12), (k, name)
    assert np.array_equal(algo.G.numpy(), G)  # frozen after the CCP


# ---- whole runs -----------------------------------------------------------------------------------------
def test_sequential_equals_vectorized_for_fedrema_af_with_partial_participation(tmp_path):
    """+A&F has its own loss (alignment) and two phases; CCP forced to end (δ = 1); persistent momentum."""
    out = {}
    for ex in ("sequential", "vectorized"):
        cfg = make_cfg(
            "algorithm=fedrema_af",
            "model=mlp",
            f"hardware.executor={ex}",
            "hardware.precision=fp64",
            "rounds=3",
            "participation=0.8",
            "algorithm.delta=1.0",
            "optim.clip_grad_norm=1.0",
            "optim.persistent_state=true",
            "clients=5",
        )
        run = Run(cfg, tmp_path / ex)
        out[ex] = (run.execute(), run.algorithm)
    (a, algo_a), (b, algo_b) = out["sequential"], out["vectorized"]
    for k in a["metrics"]:
        assert a["metrics"][k]["last"] == pytest.approx(b["metrics"][k]["last"], abs=1e-9), k
    assert a["final"]["pers_client_acc"] == b["final"]["pers_client_acc"]
    assert a["dependency_map"] == b["dependency_map"] and a["ccp_end_round"] == b["ccp_end_round"]
    assert a["ccp_end_round"] < 3  # the last round used Eq. 10 (both server paths ran)
    for name in algo_a.head_names:
        assert torch.allclose(algo_a.phi[name], algo_b.phi[name], atol=1e-10), name
    assert algo_a.has_proto.any()  # prototypes were uploaded and averaged
    mom = algo_a.opt_state  # both phases keep their momentum across rounds
    assert mom[f"momentum_buffer:{algo_a.head_names[0]}"].abs().sum() > 0
    assert mom[f"momentum_buffer:{algo_a.body_names[0]}"].abs().sum() > 0


def test_a_fedrema_run_logs_every_diagnostic(tmp_path, capsys):
    rounds, K = 5, 6
    cfg = make_cfg(
        "algorithm=fedrema",
        "logger.pictures=true",
        "model=tiny_cnn",
        "partition=dominant_groups",
        "partition.samples_per_client=60",
        f"clients={K}",
        "local_epochs=3",
        f"rounds={rounds}",
        "algorithm.delta=1.0",
        "algorithm.bn_stats=averaged",  # here Δs̄ drops within 5 rounds (with local statistics it keeps rising)
        "algorithm.plot_every=3",
        "checkpoint.every=1",
        "checkpoint.keep=3",
        "checkpoint.keep_complete=3",
    )
    summary = run_cfg(cfg, tmp_path)
    end = summary["ccp_end_round"]
    assert end is not None and 1 < end < rounds  # δ = 1: the first drop of Δs̄ ends the CCP
    assert summary["ccp_rounds"] == end
    # the note goes through the run's say (Context.say): run.log always, the console when logger.console is on
    assert f"critical co-learning period ended at round {end}" in (tmp_path / "run.log").read_text()
    rec = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    per_round = {r["round"]: r for r in rec if "fedrema/ccp" in r}
    assert sorted(per_round) == list(range(1, rounds + 1))
    assert [per_round[t]["fedrema/ccp"] for t in range(1, rounds + 1)] == [1] * end + [0] * (rounds - end)
    history = []
    for t in range(1, end + 1):
        r = per_round[t]
        history.append(r["fedrema/mean_max_diff"])
        assert r["fedrema/max_diff_running_max"] == pytest.approx(max(history))
        sizes = r["fedrema/relevant_set_sizes"]
        assert len(sizes) == K and all(1 <= s <= K for s in sizes)
        assert r["fedrema/relevant_set_size_mean"] == pytest.approx(np.mean(sizes))
    assert history[-1] < max(history)  # why it ended
    assert "fedrema/relevant_set_sizes" not in per_round[rounds]
    sim = tmp_path / "diagnostics" / "similarity"
    published = sorted(int(p.stem.split("_")[1]) for p in sim.glob("round_*.npy"))
    assert published == sorted({1, 3, end, rounds})
    assert all((sim / f"round_{t:05d}.png").exists() for t in published)
    S = np.load(sim / f"round_{end:05d}.npy")
    assert S.shape == (K, K) and np.allclose(np.diag(S), 1) and (S >= 0).all() and (S <= 1 + 1e-6).all()
    images = [r for r in rec if "image/similarity" in r]
    assert len(images) == len(published)
    dep = tmp_path / "diagnostics" / "dependency_map"
    G = np.load(dep / f"round_{rounds:05d}.npy")
    assert (dep / f"round_{rounds:05d}.png").exists() and G.tolist() == summary["dependency_map"]
    hist = np.load(tmp_path / "diagnostics" / "fedrema_history.npz")
    assert np.array_equal(hist["relevant_sets"].sum(0), G)  # G = the relevant sets of the CCP rounds, counted
    assert np.allclose(np.diag(G), end)  # every client always chose itself
    assert np.allclose(np.load(dep / "weights.npy").sum(1), 1)
    assert hist["ccp"].tolist() == [True] * end + [False] * (rounds - end)
    assert hist["ccp_history"].tolist() == pytest.approx(history)
    # killed during round 4: resuming from the round-3 checkpoint (G, Δs̄ history, CCP flag) gives the same run
    for p in (tmp_path / "checkpoints").glob("round_00000[45].*"):
        p.unlink()
    fp = json.loads((tmp_path / "status.json").read_text())["config_fingerprint"]
    (tmp_path / "summary.json").unlink()
    (tmp_path / "status.json").write_text(json.dumps({"status": "running", "round": 3, "config_fingerprint": fp}))
    capsys.readouterr()
    resumed = run_cfg(cfg, tmp_path)
    assert "after round 3" in capsys.readouterr().err  # it did resume (a fresh run would give the same numbers)
    for key in ("metrics", "ccp_rounds", "ccp_end_round", "dependency_map", "max_diff_peak"):
        assert resumed[key] == summary[key], key
    again = np.load(tmp_path / "diagnostics" / "fedrema_history.npz")
    assert all(np.array_equal(again[k], hist[k], equal_nan=k == "max_diffs") for k in hist.files)


def test_bad_fedrema_options_fail_before_training(tmp_path):
    for bad in (
        "algorithm.delta=1.5",
        "algorithm.relevant_weights=median",
        "algorithm.head_update=parallel",
        "algorithm.head_pairing=random",
        "algorithm.bn_stats=global",
    ):
        with pytest.raises(ConfigError) as e:
            run_cfg(make_cfg("algorithm=fedrema", bad), tmp_path / bad.replace("=", "_"))
        assert bad.split("=")[0] in str(e.value)
        assert not (tmp_path / bad.replace("=", "_") / "metrics.jsonl").exists()
