"""Facts about the client partitions (fedbench/data/partitions.py) on synthetic labels."""

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from fedbench.data.partitions import PARTITIONS, make_partition
from fedbench.errors import ConfigError
from fedbench.seeding import rng

CONF = Path(__file__).resolve().parents[1] / "conf" / "partition"
C = 10
# pool: 600 train samples per class (shuffled order), then 100 test samples per class
LABELS = np.concatenate(
    [np.random.default_rng(0).permutation(np.repeat(np.arange(C), 600)), np.repeat(np.arange(C), 100)]
)
N_TRAIN = 6000


def cfg(name, **over):
    """The partition's YAML defaults with overrides (so the tests also check the YAML)."""
    return OmegaConf.merge(OmegaConf.load(CONF / f"{name}.yaml"), over)


def part(name, num_clients=20, seed=0, labels=LABELS, n_train=N_TRAIN, **over):
    return make_partition(cfg(name, **over), labels, n_train, C, num_clients, rng(seed, "partition"))


def check_common(p, labels=LABELS, n_train=N_TRAIN, disjoint=True, complete=False, pool=N_TRAIN):
    """int64 indices inside the pool, no duplicates per client, counts = histogram."""
    for tr, te in zip(p.train, p.test):
        assert tr.dtype == np.int64 and te.dtype == np.int64
        assert len(np.unique(tr)) == len(tr)
        assert tr.min(initial=0) >= 0 and tr.max(initial=0) < pool
    hist = np.stack([np.bincount(labels[t], minlength=C) for t in p.train])
    assert p.counts.dtype == np.int64 and np.array_equal(p.counts, hist)
    if disjoint:  # train ∪ test of the clients: no sample in two places
        # local hold-outs come from the client's own samples; official-test draws may be shared
        own = [np.concatenate([tr, te]) if te.min(initial=n_train) < n_train else tr for tr, te in zip(p.train, p.test)]
        allidx = np.concatenate(own)
        assert len(np.unique(allidx)) == len(allidx)
        if complete:
            assert np.array_equal(np.sort(allidx), np.arange(n_train))


def same(p, q):
    return all(np.array_equal(a, b) for a, b in zip(p.train + p.test, q.train + q.test))


def test_registry_and_yaml_names_match():
    assert set(PARTITIONS) == {f.stem for f in CONF.glob("*.yaml")}
    for f in CONF.glob("*.yaml"):
        c = OmegaConf.load(f)
        assert c.name == f.stem and "test_split" in c


@pytest.mark.parametrize(
    "name,over",
    [
        ("iid", {}),
        ("dirichlet", {}),
        ("dirichlet", {"variant": "creff"}),
        ("dirichlet", {"variant": "proportional"}),
        ("shards", {"num_shards": 40}),
        ("dominant_groups", {}),
        ("longtail", {}),
        ("complementary_pairs", {}),
    ],
)
def test_determinism(name, over):
    k = 10 if name == "complementary_pairs" else 20
    a, b, c = (part(name, k, seed=s, **over) for s in (0, 0, 1))
    assert same(a, b) and not same(a, c)


def test_iid_complete_and_balanced():
    p = part("iid")
    check_common(p, complete=True)
    sizes = np.array([len(t) + len(s) for t, s in zip(p.train, p.test)])
    assert sizes.min() == sizes.max() == 300
    assert all(len(s) == 60 for s in p.test)  # ⌈0.2·300⌉ local hold-out


@pytest.mark.parametrize("variant", ["niid", "creff"])
def test_dirichlet_complete(variant):
    p = part("dirichlet", alpha=0.3, variant=variant)
    check_common(p, complete=True)
    sizes = np.array([len(t) + len(s) for t, s in zip(p.train, p.test)])
    assert sizes.min() >= (10 if variant == "niid" else 300)
    if variant == "creff":  # flattened and cut into equal chunks
        assert sizes.min() == sizes.max() == 300


def test_dirichlet_proportional_no_overlap_sizes_from_rounding():
    p = part("dirichlet", alpha=0.5, variant="proportional", test_split="global")
    check_common(p)
    assert abs(p.counts.sum() - N_TRAIN) <= 20 * C  # round() per client and class
    assert all(len(t) == len(LABELS) - N_TRAIN for t in p.test)


def test_dirichlet_alpha_controls_concentration():
    def max_share(alpha):
        c = part("dirichlet", 10, alpha=alpha, min_size=0, test_split="global").counts
        c = c[c.sum(1) > 0]
        return (c.max(1) / c.sum(1)).mean()

    assert max_share(0.05) > 0.6 > 0.2 > max_share(100)


def test_shards_complete_and_few_labels():
    p = part("shards", 20, num_shards=40, shards_per_client=2)
    check_common(p, complete=True)  # 6000 / 40 divides
    seen = np.array([len(np.unique(LABELS[np.concatenate([t, s])])) for t, s in zip(p.train, p.test)])
    assert seen.max() <= 2  # 150-sample shards never straddle a 600-sample class
    assert all(len(t) + len(s) == 300 for t, s in zip(p.train, p.test))


def test_dominant_groups_histograms_follow_s():
    p = part("dominant_groups", 20)
    pool = len(LABELS)
    check_common(p, disjoint=False, pool=pool)
    expect_groups = [{0, 1, 2}, {2, 3, 4}, {4, 5, 6}, {6, 7, 8}, {8, 9, 0}]
    assert [set(g) for g in p.info["group_labels"].tolist()] == expect_groups
    assert p.info["groups"].tolist() == [c * 5 // 20 for c in range(20)]
    for k in range(20):
        both = np.concatenate([p.train[k], p.test[k]])
        assert len(p.train[k]) == 480 and len(p.test[k]) == 120
        assert len(np.unique(both)) == 600  # no duplicate within a client
        hist = np.bincount(LABELS[both], minlength=C)
        dom = sorted(expect_groups[p.info["groups"][k]])
        assert (hist[dom] == 172).all()
        assert (np.delete(hist, dom) == 12).all()
    # here label 2 is wanted 8·160 + 20·12 = 1520 times from a 700-sample pool, so pools wrap;
    # on a pool large enough no sample is ever shared between clients
    big = np.repeat(np.arange(C), 2000)
    q = make_partition(cfg("dominant_groups", use_test_pool=False), big, len(big), C, 20, rng(0, "partition"))
    allidx = np.concatenate([np.concatenate([t, s]) for t, s in zip(q.train, q.test)])
    assert len(np.unique(allidx)) == len(allidx) == 20 * 600
    assert allidx.max() < len(big)


def test_dominant_groups_train_only_pool():
    p = part("dominant_groups", 20, use_test_pool=False, samples_per_client=100, test_split="global")
    assert max(t.max() for t in p.train) < N_TRAIN
    assert all(len(t) == 100 for t in p.train)
    hist = p.counts[0]  # s=0.2, n=100: 20 IID (2/label), 80 non-IID → 26, 26, 28 on {0,1,2}
    assert hist.tolist() == [28, 28, 30, 2, 2, 2, 2, 2, 2, 2]


def test_longtail_sizes_and_split():
    labels = np.concatenate([np.repeat(np.arange(C), np.arange(600, 700, 10)), np.repeat(np.arange(C), 100)])
    n_train = int(np.arange(600, 700, 10).sum())
    p = part("longtail", 20, labels=labels, n_train=n_train, imbalance_factor=10)
    sizes = p.info["class_sizes"]
    assert sizes[0] == 600 and sizes[-1] == 60  # n_max = smallest train class count; first/last = IF
    assert (np.diff(sizes) <= 0).all()
    assert np.allclose(sizes, np.floor(600 * 10.0 ** (-np.arange(C) / 9)))
    check_common(p, labels=labels, n_train=n_train, pool=n_train)
    assert np.array_equal(p.counts.sum(0), sizes)  # creff uses every LT sample once
    assert all(np.array_equal(t, np.arange(n_train, len(labels))) for t in p.test)  # global test
    sz = p.counts.sum(1)
    assert sz.max() - sz.min() <= 1


def test_matched_test_follows_train_proportions():
    p = part("dirichlet", 10, alpha=0.3, test_split="matched", test_per_client=50)
    check_common(p, disjoint=False)
    for tr, te, cnt in zip(p.train, p.test, p.counts):
        assert len(te) == 50 and len(np.unique(te)) == 50 and te.min() >= N_TRAIN
        th = np.bincount(LABELS[te], minlength=C)
        assert (th[cnt > 0] >= 1).all() and (th[cnt == 0] == 0).all()
        assert np.abs(th / 50 - cnt / cnt.sum()).max() <= 1 / 50 + (cnt > 0).sum() / 50
    q = part("iid", 10, test_split="matched")  # null → 0.25 × 600
    assert all(len(te) == 150 for te in q.test)


def test_complementary_pairs():
    p = part("complementary_pairs", 10, noise=False)
    check_common(p, complete=True, n_train=N_TRAIN)
    info = p.info
    assert np.array_equal(info["partner"][info["partner"]], np.arange(10))
    assert (info["partner"] != np.arange(10)).all()
    for k in range(10):
        a, b = info["majority_class"][k], info["minority_class"][k]
        assert {a, b} == {2 * (k // 2), 2 * (k // 2) + 1}
        assert p.counts[k, a] == 570 and p.counts[k, b] == 30  # 95/5 of 600
        th = np.bincount(LABELS[p.test[k]], minlength=C)
        assert th[a] == th[b] == 100 and th.sum() == 200
    q = part("complementary_pairs", 10, noise=True)
    base = [np.setdiff1d(t, np.flatnonzero(LABELS == nc)) for t, nc in zip(q.train, q.info["noise_class"])]
    assert len(np.unique(np.concatenate(base))) == N_TRAIN  # overlap only from the noise class
    for k in range(10):
        nc = q.info["noise_class"][k]
        assert nc // 2 != k // 2 and q.counts[k, nc] == 30


@pytest.mark.parametrize(
    "name,over,k,key",
    [
        ("dirichlet", {"alpha": 0}, 20, "partition.alpha"),
        ("dirichlet", {"alpha": -1.0}, 20, "partition.alpha"),
        ("dirichlet", {"variant": "foo"}, 20, "partition.variant"),
        ("dirichlet", {"min_size": 400}, 20, "partition.min_size"),
        ("iid", {}, N_TRAIN + 1, "clients="),
        ("iid", {"test_split": "nope"}, 20, "partition.test_split"),
        ("iid", {"test_fraction": 1.0}, 20, "partition.test_fraction"),
        ("iid", {"test_split": "matched", "test_per_client": 0}, 20, "partition.test_per_client"),
        ("shards", {"num_shards": 200, "shards_per_client": 3}, 20, "partition.num_shards"),
        ("complementary_pairs", {"majority": 0.5}, 10, "partition.majority"),
        ("complementary_pairs", {"majority": 1.2}, 10, "partition.majority"),
        ("complementary_pairs", {}, 12, "clients="),
        ("dominant_groups", {"s": 1.5}, 20, "partition.s"),
        ("dominant_groups", {"s": -0.1}, 20, "partition.s"),
        ("dominant_groups", {"test_split": "global"}, 20, "partition.test_split"),
        ("longtail", {"imbalance_factor": 0.5}, 20, "partition.imbalance_factor"),
        ("longtail", {"alpha": 0.0}, 20, "partition.alpha"),
    ],
)
def test_config_errors(name, over, k, key):
    with pytest.raises(ConfigError, match=key):
        part(name, k, **over)


def test_config_error_odd_classes_and_name():
    labels = np.repeat(np.arange(9), 20)
    with pytest.raises(ConfigError, match="even number of classes"):
        make_partition(cfg("complementary_pairs"), labels, 90, 9, 9, rng(0, "partition"))
    with pytest.raises(ConfigError, match="partition.name"):
        make_partition(OmegaConf.create({"name": "nope"}), LABELS, N_TRAIN, C, 10, rng(0))
    with pytest.raises(ConfigError, match="partition.alpha"):  # missing option
        make_partition(OmegaConf.create({"name": "dirichlet"}), LABELS, N_TRAIN, C, 10, rng(0))


def test_dirichlet_gives_up():
    labels = np.repeat(np.arange(C), 10)  # 100 samples, 10 clients must get exactly 10 each
    with pytest.raises(ConfigError, match="partition.min_size"):
        make_partition(cfg("dirichlet", alpha=0.01), labels, 100, C, 10, rng(0, "partition"))


# ---- partition.samples_per_client on every partition (issue #53 item 5) -------------------------------------------

SIZED = ["iid", "dirichlet", "shards", "longtail", "complementary_pairs"]


def _own(p, n_train=N_TRAIN):
    """Each client's own samples (train + a local hold-out), concatenated."""
    return [np.concatenate([t, s]) if s.min(initial=n_train) < n_train else t for t, s in zip(p.train, p.test)]


@pytest.mark.parametrize("name", SIZED)
def test_samples_per_client_null_is_the_partition_as_before(name):
    """null draws nothing: the split is the one of a config without the key (the runs made before it)."""
    k = 10 if name == "complementary_pairs" else 20
    old = OmegaConf.load(CONF / f"{name}.yaml")
    del old["samples_per_client"]
    before = make_partition(old, LABELS, N_TRAIN, C, k, rng(5, "partition"))
    assert cfg(name).samples_per_client is None and same(part(name, k, seed=5), before)


def test_shards_made_smaller_keep_their_label_sorted_shards():
    """The issue's case: shards used the whole train split. 20 clients x 30 samples: a class-stratified 600 of the
    6000 (60 per class), 40 label-sorted shards of 15 — so every client has exactly 30 samples of at most 2 classes."""
    p = part("shards", 20, samples_per_client=30, test_split="global")
    check_common(p)
    assert np.array_equal(p.counts.sum(0), np.full(C, 60)) and p.info["dropped"] == 0
    assert all(len(t) == 30 for t in p.train)
    assert max(len(np.unique(LABELS[t])) for t in p.train) <= 2
    with pytest.raises(ConfigError, match=r"partition.samples_per_client=301 — at most 300 with 20 clients"):
        part("shards", 20, samples_per_client=301)
    with pytest.raises(ConfigError, match=r"num_shards=200 — .* = 40 .*smaller shards: partition.samples_per_client"):
        part("shards", 20, num_shards=200)  # what the user tried first


def test_iid_dirichlet_and_pairs_made_smaller_split_k_times_m_samples_in_the_classes_proportions():
    p = part("iid", 8, samples_per_client=25)  # 200 = 20 per class; each client 25 before its 20 % hold-out
    own = _own(p)
    assert [len(o) for o in own] == [25] * 8 and [len(s) for s in p.test] == [5] * 8
    assert np.array_equal(np.bincount(LABELS[np.concatenate(own)], minlength=C), np.full(C, 20))
    d = part("dirichlet", 8, samples_per_client=50, alpha=0.3, min_size=5)
    own = np.concatenate(_own(d))
    assert len(own) == len(np.unique(own)) == 400 and np.array_equal(np.bincount(LABELS[own], minlength=C), [40] * C)
    assert min(len(o) for o in _own(d)) >= 5 and max(len(o) for o in _own(d)) > 50  # still skewed, min_size kept
    c = part("complementary_pairs", 10, samples_per_client=40, noise=False)  # 400 = 40 per class
    for k in range(10):
        a, b = c.info["majority_class"][k], c.info["minority_class"][k]
        assert c.counts[k, a] == 38 and c.counts[k, b] == 2  # round(0.95·40), the partner's 5 %


def test_longtail_made_smaller_keeps_its_tail():
    """IF 10 over classes of 600, 464, 359, 278, 215, 166, 129, 100, 77, 60 (sum 2448); 20 clients x 20 = 400 of
    them, each class 1 + its share of 390: class 0 1 + 390·600/2448 ≈ 96.6, class 9 1 + 390·60/2448 ≈ 10.6 (the
    same tail, first/last ≈ IF)."""
    labels = np.concatenate([np.repeat(np.arange(C), 600), np.repeat(np.arange(C), 100)])
    p = part("longtail", 20, labels=labels, samples_per_client=20, imbalance_factor=10)
    per_class = p.counts.sum(0)
    sizes = p.info["class_sizes"]
    assert sizes.sum() == 2448 and per_class.sum() == 400 and (np.diff(per_class) <= 0).all()
    assert abs(per_class[0] - (1 + 390 * 600 / 2448)) <= 1 and abs(per_class[-1] - (1 + 390 * 60 / 2448)) <= 1


def test_natural_made_smaller_keeps_each_writer_in_proportion():
    """Writers of 40, 20 and 10 samples: 3 clients x 14 = 42 -> each writer 1 + its share of 39 (by largest
    remainder: 22.3, 11.1, 5.6 -> 22, 11, 6), i.e. 23, 12, 7."""
    labels = np.concatenate([np.arange(70) % C, np.zeros(10, np.int64)])
    writer = np.concatenate([np.repeat([0, 1, 2], [40, 20, 10]), np.zeros(10, np.int64)])
    c = cfg("natural", samples_per_client=14)
    p = make_partition(c, labels, 70, C, 3, rng(0, "partition"), attrs={"writer": writer})
    sizes = {int(w): len(t) + len(s) for w, t, s in zip(p.info["writer"], p.train, p.test)}
    assert sizes == {0: 23, 1: 12, 2: 7}


def test_a_run_made_before_samples_per_client_keeps_its_config_fingerprint(tmp_path):
    """A run dir made before the key existed is resumed or skipped, not refused as another config: at null the key
    is not hashed; a size is."""
    from conftest import make_cfg

    from fedbench.checkpoint import fingerprint

    now = make_cfg("partition=shards")
    old = OmegaConf.create(OmegaConf.to_container(now, resolve=True))
    del old.partition["samples_per_client"]
    assert (
        fingerprint(now)
        == fingerprint(old)
        != fingerprint(make_cfg("partition=shards", "partition.samples_per_client=5"))
    )
