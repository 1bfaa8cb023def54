"""FedKA (spec fedka.md): knowledge anchor construction, the discarded-logit L2 loss, executors, a short run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import CONF, make_cfg, run_cfg
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from fedbench.algorithms.fedka import knowledge_anchor_loss, pad_anchor
from fedbench.config import validate  # (also registers the ${scaled:} resolver of the experiment configs)
from fedbench.errors import ConfigError
from fedbench.forgetting import DOMINANT, MISSING, NON_DOMINANT
from fedbench.run import Run

SKEWED = ["algorithm=fedka", "partition.alpha=0.1", "partition.test_split=global"]


def _algo(tmp_path, *overrides):
    run = Run(make_cfg(*SKEWED, *overrides), tmp_path)
    run.setup()
    return run.algorithm


def test_knowledge_anchor_loss_hand_computed():
    """L_KA = (1/|T|) Σ_a Σ_{k∉C_d} (z_g − z_l)²: dominant columns and padded anchors do not count."""
    z_l = torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0], [9.0, 9.0, 9.0]])
    z_g = torch.tensor([[2.0, 0.0, 1.0], [1.0, 5.0, 4.5], [0.0, 0.0, 0.0]])
    kept = torch.tensor([1.0, 0.0, 1.0])  # class 1 is dominant for this client
    mask = torch.tensor([1.0, 1.0, 0.0])  # the third slot is padding
    # anchor 0: (2-1)² + (1-3)² = 5; anchor 1: (1-0)² + (4.5-4)² = 1.25; |T| = 2
    assert knowledge_anchor_loss(z_l, z_g, kept, mask).item() == pytest.approx((5 + 1.25) / 2)
    z_l2 = z_l.clone()
    z_l2[:, 1] += 100.0  # a dominant-class logit is discarded by Φ
    z_l2[2] -= 7.0  # a padded anchor is masked
    assert knowledge_anchor_loss(z_l2, z_g, kept, mask).item() == pytest.approx(3.125)
    assert knowledge_anchor_loss(z_l, z_g, kept, torch.zeros(3)).item() == 0.0  # T = ∅ -> L = CE


def test_pad_anchor_repeats_real_anchors_and_masks_them():
    idx, mask = pad_anchor(np.array([7, 3]), 5, filler=0)
    assert idx.tolist() == [7, 3, 7, 3, 7] and mask.tolist() == [1, 1, 0, 0, 0]
    idx, mask = pad_anchor(np.array([], dtype=np.int64), 3, filler=11)
    assert idx.tolist() == [11, 11, 11] and mask.sum() == 0


def test_class_groups_and_shared_set(tmp_path):
    """C_d / C_n / C_m follow n_k^c / n_k vs γ (Def. 1–2); S holds one training sample of each class."""
    a = _algo(tmp_path, "algorithm.gamma=0.1", "clients=5")
    share = a.data.counts / a.data.counts.sum(1, keepdims=True)
    assert np.array_equal(a.groups == MISSING, a.data.counts == 0)
    assert np.array_equal(a.groups == DOMINANT, share >= 0.1)
    assert np.array_equal(a.groups == NON_DOMINANT, (share > 0) & (share < 0.1))
    assert (a.groups == NON_DOMINANT).any() and (a.groups == MISSING).any()  # the test exercises every type
    y = a.data.y.cpu().numpy()
    assert (a.S < a.data.n_pool_train).all() and y[a.S].tolist() == list(range(a.data.num_classes))


def test_anchor_construction(tmp_path):
    """One own sample per non-dominant class, the shared sample S[c] for each missing class (and only
    there), nothing for dominant classes; |T| ≤ μ by a random subset; resampled every round."""
    a = _algo(tmp_path, "algorithm.gamma=0.1", "algorithm.mu=null", "clients=5")
    y = a.data.y.cpu().numpy()
    for k in range(a.K):
        anchor, n_nd, n_m = a.knowledge_anchor(1, k, {})
        labels = y[anchor]
        own = np.isin(anchor, a.data.train_idx[k])
        groups = a.groups[k, labels]
        assert sorted(labels) == list(np.flatnonzero(a.groups[k] != DOMINANT))  # one anchor per C_n ∪ C_m class
        assert (own == (groups == NON_DOMINANT)).all()  # C_n: drawn from D_k
        assert np.array_equal(anchor[groups == MISSING], a.S[labels[groups == MISSING]])  # C_m: the shared sample
        assert (n_nd, n_m) == ((a.groups[k] == NON_DOMINANT).sum(), (a.groups[k] == MISSING).sum())
    k = int(np.argmax((a.groups != DOMINANT).sum(1)))
    full, _, _ = a.knowledge_anchor(3, k, {})
    a.slots = 3  # μ = 3: a random subset of the same round's anchor
    small, n_nd, n_m = a.knowledge_anchor(3, k, {})
    assert len(full) > 3 and len(small) == 3 and n_nd + n_m == 3 and set(small) <= set(full)
    subsets = {tuple(a.knowledge_anchor(t, k, {})[0]) for t in range(1, 9)}
    assert len(subsets) > 1  # resampled every round
    a.slots = a.data.num_classes
    k, c = np.argwhere((a.groups == NON_DOMINANT) & (a.data.counts > 1))[0]
    picks = set()
    for t in range(1, 9):
        anchor = a.knowledge_anchor(t, k, {})[0]
        picks.add(int(anchor[y[anchor] == c][0]))
    assert len(picks) > 1  # the non-dominant class's sample itself is redrawn


@pytest.mark.parametrize("variant,kept_group", [("fedka_n", NON_DOMINANT), ("fedka_m", MISSING)])
def test_ablation_anchors(tmp_path, variant, kept_group):
    """KA(N): anchors for non-dominant classes only; KA(M): shared samples for missing classes only."""
    a = _algo(tmp_path, f"algorithm={variant}", "algorithm.gamma=0.1", "algorithm.mu=null", "clients=5")
    y = a.data.y.cpu().numpy()
    for k in range(a.K):
        anchor, _, _ = a.knowledge_anchor(1, k, {})
        assert sorted(y[anchor]) == list(np.flatnonzero(a.groups[k] == kept_group))


@pytest.mark.parametrize("strategy,pick", [("hard", np.argmax), ("proficient", np.argmin)])
def test_hard_and_proficient_anchor_sampling(tmp_path, strategy, pick):
    """Table 7: the non-dominant anchor is the class sample with the max (H) / min (P) global-model CE."""
    a = _algo(tmp_path, f"algorithm.sampling={strategy}", "algorithm.gamma=0.3", "algorithm.mu=null", "clients=3")
    clients = torch.arange(a.K)
    losses = a.candidate_losses(clients)
    for k in range(a.K):
        anchor, _, _ = a.knowledge_anchor(1, k, losses)
        for c, cand in a.candidates[k].items():
            logits = a.fm({n: v for n, v in a.w.items()}, a.bn, a.data.x[a.data.tensor(cand)])
            ce = F.cross_entropy(logits, a.data.y[a.data.tensor(cand)], reduction="none").detach().numpy()
            assert cand[pick(ce)] in anchor


def test_fedka_loss_is_ce_plus_beta_ka(tmp_path):
    """Eq. 3: CE + β·L_KA (β = 0.3, not 0.5, so that β <-> 1−β shows); with an empty anchor the loss is plain CE."""
    a = _algo(tmp_path, "algorithm.beta=0.3", "model=mlp", "hardware.precision=fp64")
    g = torch.Generator().manual_seed(0)
    x, y = a.data.x[:6], a.data.y[:6]
    ax = a.data.x[10:14]
    z_g = torch.randn(4, 10, generator=g, dtype=torch.float64)
    kept = (torch.arange(10) % 2).double()
    ctx = {
        "anchor_x": ax,
        "anchor_mask": torch.tensor([1.0, 1, 1, 0], dtype=torch.float64),
        "anchor_logits": z_g,
        "kept": kept,
    }
    ce = F.cross_entropy(a.fm(a.w, a.bn, x), y)
    z_a = a.fm(a.w, a.bn, ax)
    ka = (((z_g - z_a) ** 2) * kept)[:3].sum() / 3
    assert a.loss(a.fm, a.w, a.bn, x, y, ctx).item() == pytest.approx((ce + 0.3 * ka).item(), rel=1e-12)
    ctx["anchor_mask"] = torch.zeros(4, dtype=torch.float64)
    assert a.loss(a.fm, a.w, a.bn, x, y, ctx).item() == pytest.approx(ce.item(), rel=1e-12)


@pytest.mark.parametrize("model", ["tiny_cnn", "mlp"])
def test_sequential_equals_vectorized(tmp_path, model):
    """Whole FedKA rounds (anchors, BN with concatenated anchors, aggregation) match across executors (fp64)."""
    w = {}
    for ex in ("sequential", "vectorized"):
        run = Run(
            make_cfg(
                *SKEWED,
                f"model={model}",
                f"hardware.executor={ex}",
                "hardware.precision=fp64",
                "rounds=2",
                "participation=0.6",
                "logger=none",
            ),
            tmp_path / ex,
        )
        run.execute()
        w[ex] = run.algorithm.global_model()
    for part in (0, 1):
        for k, v in w["sequential"][part].items():
            assert torch.allclose(v.double(), w["vectorized"][part][k].double(), atol=1e-10, rtol=0), k


def test_beta_zero_is_fedavg(tmp_path):
    """The KA term is FedKA's only change to FedAvg: β = 0 reproduces FedAvg's global model (no BN)."""
    w = {}
    for algo in ("fedavg", "fedka"):
        run = Run(
            make_cfg(*SKEWED, f"algorithm={algo}", "model=mlp", "hardware.precision=fp64", "rounds=2"), tmp_path / algo
        )
        if algo == "fedka":
            run.cfg.algorithm.beta = 0.0
        run.execute()
        w[algo] = run.algorithm.global_model()[0]
    assert all(torch.allclose(w["fedavg"][k], w["fedka"][k], atol=1e-10, rtol=0) for k in w["fedavg"])


def test_short_fedka_run_logs_anchor_sizes(tmp_path):
    s = run_cfg(
        make_cfg(*SKEWED, "model=tiny_cnn", "rounds=4", "local_epochs=2", "algorithm.mu=4", "eval.personalized=false"),
        tmp_path,
    )
    assert s["status"] == "complete" and "pers/acc" not in s["metrics"]
    assert s["metrics"]["global/acc"]["best"] > 0.3  # learns (10 classes, chance = 0.1)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    sizes = [r["fedka/anchor_size"] for r in rows if "fedka/anchor_size" in r]
    assert len(sizes) == 4 and all(0 < v <= 4 for v in sizes)
    groups = np.loadtxt(tmp_path / "fedka_class_groups.csv", delimiter=",", skiprows=1)
    assert groups.shape == (5, 10)


@pytest.mark.parametrize(
    "key,value", [("sampling", "greedy"), ("mu", 0), ("gamma", 1.5), ("anchor_classes", "dominant")]
)
def test_bad_hyperparameters_fail_before_training(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
        Run(make_cfg("algorithm=fedka", f"algorithm.{key}={value}"), tmp_path).setup()


ARM = "experiment/fedka/arm@_global_"
GRIDS = {
    "fedprox": ("mu", {0.001, 0.01, 0.1, 1}),
    "moon": ("mu", {0.1, 1, 5, 10}),  # FedKA §5.1
    "feddyn": ("alpha", {1, 0.1, 0.01, 0.001}),
    "fedka": ("beta", {0.5, 0.1, 0.01, 0.001}),
}


def _arm(name: str) -> tuple[str, dict]:
    """(algorithm, its overridden hyperparameters) of one method arm, experiment/fedka/arm/<name>.yaml."""
    node = OmegaConf.load(CONF / "experiment" / "fedka" / "arm" / f"{name}.yaml")
    (algo,) = [d["override /algorithm"] for d in node.defaults if "override /algorithm" in d]
    return algo, OmegaConf.to_container(node.algorithm) if "algorithm" in node else {}


def test_experiment_configs_compose_and_match_their_tables():
    """Every fedka/table* config composes with its last sweep arm (the arm's method and values, not a fallback),
    passes the config checks and has a FedKA row; every swept method exists and has a reference row with exactly the
    swept columns; a tuned method's arms cover exactly its §5.1 grid (table.tune names the key)."""
    names = [
        "table1",
        "table1_cifar100",
        "table1_tinyimagenet",
        "table2",
        "table2_cifar100",
        "table3",
        "table4",
        "table5",
        "table6",
        "table6_cifar100",
        "table6_tinyimagenet",
        "table7",
        "table8",
        "table9",
        "table9_cifar100",
        "table9_tinyimagenet",
        "beta",
        "gamma",
    ]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):  # one Hydra init for all compositions
        for name in names:
            sweep = {
                k: str(v).split(",")
                for k, v in OmegaConf.load(CONF / "experiment" / "fedka" / f"{name}.yaml").hydra.sweeper.params.items()
            }
            if ARM in sweep:  # methods x grids: one arm per (method, grid value)
                arms = [_arm(a) for a in sweep[ARM]]
                cfg = compose("config", overrides=[f"+experiment=fedka/{name}", f"{ARM}={sweep[ARM][-1]}"])
                algo, hp = arms[-1]
                assert cfg.algorithm.name == algo and all(cfg.algorithm[k] == v for k, v in hp.items()), name
            elif "algorithm" in sweep:
                arms = [(a, {}) for a in sweep["algorithm"]]
                cfg = compose("config", overrides=[f"+experiment=fedka/{name}", f"algorithm={arms[-1][0]}"])
            else:  # a hyperparameter sweep of FedKA itself (beta, gamma)
                cfg = compose("config", overrides=[f"+experiment=fedka/{name}"])
                arms = [(cfg.algorithm.name, {})]
            validate(cfg)
            assert cfg.eval.personalized is False and cfg.partition.test_split == "global", name  # generic FL
            rows = {a for a, _ in arms}
            assert "fedka" in rows, name
            for a in rows:
                assert (CONF / "algorithm" / f"{a}.yaml").exists(), (name, a)
                assert cfg.table.rows != "choice:algorithm" or a in cfg.table.reference, (name, a)
            if cfg.table.cols:
                assert all(
                    {str(c) for c in row} == set(sweep[cfg.table.cols]) for row in cfg.table.reference.values()
                ), name
            tuned = cfg.table.get("tune") or {"rows": {}}
            for a, key in tuned["rows"].items():
                grid_key, grid = GRIDS[a]
                assert key == f"algorithm.{grid_key}", (name, a)
                assert {hp[grid_key] for r, hp in arms if r == a} == grid, (name, a)
            assert ARM not in sweep or {a for a in rows if a in GRIDS} == set(tuned["rows"]), name
    GlobalHydra.instance().clear()


# ---- issue 16 item 11: both sides of L_KA under the same BatchNorm mode ------------------------------------------

BN = [*SKEWED, "model=tiny_cnn", "hardware.precision=fp64", "algorithm.gamma=0.3", "algorithm.mu=null"]


def _round_loss(tmp_path, beta: float, *overrides) -> tuple[float, float]:
    """(train/loss, mean |T|) of round 1 with one local step per client (batch = all of a client's samples): the
    logged loss is CE + β·L_KA evaluated at the round-start weights, i.e. with θ_i = θ_g."""
    run = Run(
        make_cfg(*BN, f"algorithm.beta={beta}", "batch_size=100000", "local_epochs=1", *overrides), tmp_path / str(beta)
    )
    run.setup()
    m = run.algorithm.round(1, torch.arange(run.data.num_clients))
    return m["train/loss"], m["fedka/anchor_size"]


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_anchor_loss_is_zero_at_the_global_model_on_a_batchnorm_net(tmp_path, executor):
    """θ_i = θ_g (the first local step) => Z_l = Z_g => L_KA = 0, on a BN net too: the KA term adds nothing to the
    first step's loss (the old code mixed eval-mode Z_g with train-mode client logits: L_KA ≫ 0)."""
    with_ka, size = _round_loss(tmp_path, 1.0, f"hardware.executor={executor}")
    without, _ = _round_loss(tmp_path, 0.0, f"hardware.executor={executor}")
    assert size > 0  # the clients do have anchors
    assert abs(with_ka - without) < 1e-10


def test_anchor_loss_after_a_local_step_uses_the_local_model_in_eval_mode(tmp_path):
    """After one local step L_KA > 0, and it equals the hand-written Eq. 3 with the client's logits taken like Z_g's:
    eval mode (running statistics), the anchors in their own forward (not in the mini-batch's BN statistics)."""
    a = _algo(tmp_path, *BN[len(SKEWED) :], "algorithm.beta=1.0")
    k = 0
    anchor, _, _ = a.knowledge_anchor(1, k, {})
    assert len(anchor) > 1
    x_a = a.data.x[a.data.tensor(anchor)]
    a.fm.set_mode(False)
    z_g = a.fm(a.w, a.bn, x_a).detach()  # global model, eval mode
    a.fm.set_mode(True)
    kept = a.kept[k]
    ctx = {"anchor_x": x_a, "anchor_mask": torch.ones(len(anchor), dtype=x_a.dtype), "anchor_logits": z_g, "kept": kept}
    idx = a.data.tensor(a.data.train_idx[k][:16])
    x, y = a.data.x[idx], a.data.y[idx]
    # one plain SGD step of the client on CE + L_KA from θ_g (lr 0.05, no momentum, BN stats updated by the batch)
    p = {n: v.clone().requires_grad_(True) for n, v in a.w.items()}
    b = {n: v.clone() for n, v in a.bn.items()}
    g = torch.autograd.grad(a.loss(a.fm, p, b, x, y, ctx), list(p.values()))
    p = {n: (v - 0.05 * gi).detach() for (n, v), gi in zip(p.items(), g)}
    b_step = {n: v.clone() for n, v in b.items()}
    ka = a.loss(a.fm, p, {n: v.clone() for n, v in b_step.items()}, x, y, ctx) - a.loss(
        a.fm,
        p,
        {n: v.clone() for n, v in b_step.items()},
        x,
        y,
        {**ctx, "anchor_mask": torch.zeros(len(anchor), dtype=x.dtype)},
    )
    a.fm.set_mode(False)
    z_l = a.fm(p, b_step, x_a)  # the stepped client, eval mode
    a.fm.set_mode(True)
    expected = ((z_g - z_l) ** 2 * kept).sum() / len(anchor)
    assert expected.item() > 1e-6
    assert ka.item() == pytest.approx(expected.item(), rel=1e-9)


# ---- issue 16 item 13: Table 2's FedAvg row is 100 rounds, 1x by definition ----------------------------------------


def test_table2_target_row_is_its_target_round_and_speedup_one(tmp_path):
    """Table 2 counts the rounds each method needs to reach FedAvg's accuracy after its last round; FedAvg's own row is
    that last round and 1x by definition (the paper's "FedAvg 100 1x"), also when its curve touched the value earlier
    (then the report says so). Other rows: first round at or above the target, speedup = target round / that round."""
    from test_report import TABLE2, write_run

    from fedbench.report import Report, collect, group_tables

    root = tmp_path / "sweep"
    write_run(root, "fedavg", 0, TABLE2, [0.1, 0.3, 0.5, 0.6, 0.55])  # target 0.55 @4, touched already @3
    write_run(root, "fedavg", 1, TABLE2, [0.1, 0.2, 0.3, 0.4, 0.5])  # target 0.50 @4, first reached @4
    write_run(root, "fedka", 0, TABLE2, [0.1, 0.2, 0.56, 0.5, 0.6])  # 0.56 >= 0.55 @2: 4/2 = 2x
    write_run(root, "fedka", 1, TABLE2, [0.1, 0.5, 0.5, 0.5, 0.5])  # 0.50 >= 0.50 @1: 4x
    write_run(root, "fedprox", 0, TABLE2, [0.1, 0.2, 0.3, 0.4, 0.5])  # never reaches 0.55
    rep = Report(group_tables(collect([root]))[0])
    assert rep.cells[("fedavg", "Rounds")].values == [4.0, 4.0]
    assert rep.cells[("fedavg", "Speedup")].values == [1.0, 1.0]
    assert rep.cells[("fedka", "Rounds")].values == [2.0, 1.0]
    assert rep.cells[("fedka", "Speedup")].values == [2.0, 4.0]
    assert rep.cells[("fedprox", "Rounds")].other == {"never": 1}
    assert [w for w in rep.warnings() if "FedAvg" in w and "round 3" in w and "seed 0" in w]
    assert not [w for w in rep.warnings() if "seed 1" in w]


# ---- issue 16 item 14: Figure 3's experiment configs -------------------------------------------------------------


def test_figure3_configs_shrink_client0s_classes_at_scaled_rounds():
    """(a) a non-dominant class cut to 5 then 0 samples at rounds 60 / 70, (b) a dominant class cut every 10 rounds from
    round 50 to ~1 % of client 0's data; FedAvg with the forgetting monitor; rounds scale with `scale`."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        a = compose("config", overrides=["+experiment=fedka/figure3", "scale=0.2"])
        b = compose("config", overrides=["+experiment=fedka/figure3b", "scale=0.2"])
    GlobalHydra.instance().clear()
    for cfg in (a, b):
        validate(cfg)
        assert cfg.algorithm.name == "fedavg" and cfg.eval.forgetting.enabled and cfg.eval.forgetting.every == 1
        assert cfg.partition.alpha == 0.1 and cfg.clients == 10 and cfg.model.name == "cnn" and cfg.partition.seed == 0
    steps = OmegaConf.to_container(a.data_schedule, resolve=True)
    assert a.rounds == 20 and steps == [
        {"round": 12, "client": 0, "class": 0, "keep": 5},
        {"round": 14, "client": 0, "class": 0, "keep": 0},
    ]
    steps = OmegaConf.to_container(b.data_schedule, resolve=True)
    assert b.rounds == 32 and [s["round"] for s in steps] == list(range(10, 31, 2))
    assert {(s["client"], s["class"]) for s in steps} == {(0, 1)}
    keep = [s["keep"] for s in steps]
    assert keep == sorted(keep, reverse=True) and keep[0] == round(0.11 * 5465) and keep[-1] == round(0.01 * 5465)
