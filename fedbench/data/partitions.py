"""Client partitions: which samples of the dataset pool each client trains and tests on.

The pool is a label vector of length N; positions ``[0, n_train)`` are the official
train split, ``[n_train, N)`` the official test split. Every partition is a pure
function ``fn(cfg, labels, n_train, num_classes, num_clients, rng) -> Partition``
registered in :data:`PARTITIONS`; all randomness comes from ``rng`` (a numpy
Generator, e.g. ``seeding.rng(seed, "partition")``). Options and their defaults
live in ``conf/partition/<name>.yaml``; a missing option is a :class:`ConfigError`.
Each function first validates (static checks, then data-dependent ones) and only
then draws.

Common option ``test_split`` (per-client test sets):
  * ``local``   hold out ``test_fraction`` of the client's own samples (random,
                non-stratified; like sklearn ``train_test_split(test_size=f)``:
                ⌈f·n⌉ test samples, at least one left for training);
  * ``matched`` test = official test samples drawn to the client's train class
                proportions (``test_per_client`` or ⌈0.25·n⌉, ≥1 per present class);
  * ``global``  test = the whole official test split (ECL's class-averaged metric).
``complementary_pairs`` adds ``balanced`` (FedCOM's 2-class balanced test).

Common option ``samples_per_client`` (the size of a run, issue #53): null = the partition splits all of its samples
(the papers' setting); a number m = it splits a random subset of K·m of them, drawn per class in the classes'
proportions (per writer for ``natural``), so each client has m samples on average before its test split, with the
partition's own rules (label-sorted shards, a Dirichlet skew, a long tail) unchanged. ``dominant_groups`` has always
given each client exactly this many.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedbench.errors import ConfigError

MAX_DIRICHLET_TRIES = 1000  # NIID-Bench/FedLab retry "until every client is large enough"
CREFF_GROUP = 10  # CReFF's n_auxi_workers: clients per independent Dirichlet draw
TEST_SPLITS = ("local", "matched", "global")


@dataclass
class Partition:
    train: list[np.ndarray]  # per client: int64 pool indices, no duplicates within a client
    test: list[np.ndarray]  # per client: int64 pool indices of its personal test split
    counts: np.ndarray  # [num_clients, num_classes] int64 class counts of train
    info: dict = field(default_factory=dict)  # partition-specific extras


# ---------------------------------------------------------------------------- validation
def _opt(cfg, key):
    """A required option of the partition node (defaults live in the YAML, not here)."""
    if key not in cfg:
        raise ConfigError(f"partition.{key}", None, f"required option, see conf/partition/{cfg.get('name')}.yaml")
    return cfg[key]


def _number(cfg, key, lo, hi, *, lo_open=False, hi_open=False, integer=False):
    """Read a numeric option and check lo ≤ value ≤ hi (open ends where asked)."""
    v = _opt(cfg, key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (not integer or float(v).is_integer())
    if ok:
        ok = (v > lo if lo_open else v >= lo) if lo is not None else True
        ok = ok and ((v < hi if hi_open else v <= hi) if hi is not None else True)
    if not ok:
        kind = "an integer" if integer else "a number"
        lo_s = "" if lo is None else f"{lo} {'<' if lo_open else '≤'} "
        hi_s = "" if hi is None else f" {'<' if hi_open else '≤'} {hi}"
        raise ConfigError(f"partition.{key}", v, f"{kind} with {lo_s}{key}{hi_s}")
    return int(v) if integer else float(v)


def _choice(cfg, key, allowed):
    v = _opt(cfg, key)
    if v not in allowed:
        raise ConfigError(f"partition.{key}", v, " | ".join(allowed))
    return v


def _check_test_split(cfg, allowed=TEST_SPLITS) -> str:
    ts = _choice(cfg, "test_split", allowed)
    if ts == "local":  # 0 would leave every client without a test set (accuracy NaN)
        _number(cfg, "test_fraction", 0, 1, lo_open=True, hi_open=True)
    elif ts == "matched" and _opt(cfg, "test_per_client") is not None:
        _number(cfg, "test_per_client", 1, None, integer=True)
    return ts


def _check_clients(num_clients, n_available, what="train samples"):
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1 or num_clients > n_available:
        raise ConfigError("clients", num_clients, f"an integer in [1, {n_available}] (number of {what})")


def _sized(cfg, idx, groups, num_clients, rng):
    """``partition.samples_per_client`` m (null: ``idx`` as it is, no draw): a random subset of K·m of the samples
    ``idx``, drawn per value of ``groups`` (their classes, or writers) in proportion to its count, every value
    keeping at least one sample when K·m allows (issue #53: a CPU-sized run of any partition)."""
    if cfg.get("samples_per_client") is None:
        return idx
    m = _number(cfg, "samples_per_client", 1, None, integer=True)
    total = m * num_clients
    if total > len(idx):
        raise ConfigError(
            "partition.samples_per_client",
            m,
            f"at most {len(idx) // num_clients} with {num_clients} clients ({len(idx)} samples to split), "
            "or null for all of them",
        )
    values, counts = np.unique(groups, return_counts=True)
    if total >= len(values):
        q = 1 + _largest_remainder(total - len(values), counts / counts.sum())
        q = np.minimum(q, counts)
    else:
        q = _largest_remainder(total, counts / counts.sum())
    keep = [rng.choice(idx[groups == v], k, replace=False) for v, k in zip(values, q) if k]
    return np.sort(np.concatenate(keep))


# ---------------------------------------------------------------------------- test splits
def _holdout(idx, frac, rng):
    """Random non-stratified split of one client's samples: (train, test), ⌈frac·n⌉ test."""
    idx = rng.permutation(idx)
    n_test = min(int(np.ceil(frac * len(idx) - 1e-9)), max(len(idx) - 1, 0))
    return idx[n_test:], idx[:n_test]


def _largest_remainder(m, p):
    """Integer allocation of m proportional to p (sums to m)."""
    raw = m * p
    q = np.floor(raw).astype(np.int64)
    q[np.argsort(-(raw - q), kind="stable")[: m - q.sum()]] += 1
    return q


def _matched_test(count, test_by_class, m, rng):
    """Official test samples with the class proportions of one client's train counts."""
    present = count > 0
    if not present.any():
        return np.empty(0, np.int64)
    p = count / count.sum()
    if m is None:  # 0.25 × client size, but at least one per present class
        m = max(int(np.ceil(0.25 * count.sum() - 1e-9)), int(present.sum()))
    if m >= present.sum():
        q = present.astype(np.int64) + _largest_remainder(m - int(present.sum()), p)
    else:
        q = _largest_remainder(m, p)
    avail = np.array([len(t) for t in test_by_class])
    q = np.minimum(q, avail)  # a class with too few official test samples gives what it has
    parts = [rng.choice(test_by_class[c], q[c], replace=False) for c in np.flatnonzero(q)]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _counts(train, labels, num_classes):
    return np.stack([np.bincount(labels[t], minlength=num_classes) for t in train]).astype(np.int64)


def _finish(cfg, clients, labels, n_train, num_classes, rng, info, test=None) -> Partition:
    """Apply the common ``test_split`` to the clients' samples and build the Partition."""
    ts = cfg.test_split
    if test is not None:  # the partition made its own test sets
        train = clients
    elif ts == "local":
        train, test = map(list, zip(*(_holdout(c, float(cfg.test_fraction), rng) for c in clients)))
    elif ts == "matched":
        train = clients
        test_idx = np.arange(n_train, len(labels))
        test_by_class = [test_idx[labels[test_idx] == c] for c in range(num_classes)]
        m = cfg.test_per_client
        m = None if m is None else int(m)
        counts = _counts(train, labels, num_classes)
        test = [_matched_test(counts[k], test_by_class, m, rng) for k in range(len(train))]
    else:  # global: one shared, read-only array
        g = np.arange(n_train, len(labels), dtype=np.int64)
        g.flags.writeable = False
        train, test = clients, [g] * len(clients)
    train = [np.asarray(t, dtype=np.int64) for t in train]
    test = [t if t.dtype == np.int64 else t.astype(np.int64) for t in test]
    return Partition(train, test, _counts(train, labels, num_classes), info)


# ---------------------------------------------------------------------------- iid
def iid(cfg, labels, n_train, num_classes, num_clients, rng) -> Partition:
    """Shuffle the train split and cut it into ``num_clients`` near-equal parts."""
    _check_test_split(cfg)
    _check_clients(num_clients, n_train)
    idx = _sized(cfg, np.arange(n_train), labels[:n_train], num_clients, rng)
    clients = np.array_split(idx[rng.permutation(len(idx))], num_clients)
    return _finish(cfg, clients, labels, n_train, num_classes, rng, {})


# ---------------------------------------------------------------------------- dirichlet
def _hetero_dir_once(by_class, n, num_clients, alpha, rng):
    """One NIID-Bench/FedLab ``hetero_dir`` draw (FedKA §5.1, following MOON / NIID-Bench; CAFeMe code).

    Per class: p ~ Dir(α·1_K), zero the share of clients already holding ≥ n/K
    samples, renormalise, split the class's (shuffled) indices at cumsum(p)·n_c.
    """
    parts = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, np.int64)
    for idx_c in by_class:
        p = rng.dirichlet(np.full(num_clients, alpha))
        open_ = sizes < n / num_clients
        p = p * open_
        p = p / p.sum() if p.sum() > 0 else open_ / open_.sum()
        cuts = (np.cumsum(p) * len(idx_c)).astype(np.int64)[:-1]
        for k, chunk in enumerate(np.split(idx_c, cuts)):
            parts[k].append(chunk)
        sizes += np.diff(np.concatenate([[0], cuts, [len(idx_c)]]))
    return [np.concatenate(p) for p in parts], sizes


def _proportional(by_class, num_clients, alpha, rng):
    """FedAFA ``cifar_noniid`` (code pxqian/FedAFA ``sampling.py``): per class, client u takes round(n_c·p_u).

    Clients take their share in order from the shuffled class; a rounding surplus
    shortens the last clients, a deficit leaves samples unused. No retry.
    """
    parts = [[] for _ in range(num_clients)]
    for idx_c in by_class:
        want = np.round(len(idx_c) * rng.dirichlet(np.full(num_clients, alpha))).astype(np.int64)
        ends = np.minimum(np.cumsum(want), len(idx_c))
        starts = np.concatenate([[0], ends[:-1]])
        for k in range(num_clients):
            parts[k].append(idx_c[starts[k] : ends[k]])
    return [np.concatenate(p) for p in parts]


def _hetero_dir(by_class, n, num_clients, alpha, need, rng, key, value):
    """Redraw :func:`_hetero_dir_once` until every client has ≥ ``need`` samples."""
    for _ in range(MAX_DIRICHLET_TRIES):
        parts, sizes = _hetero_dir_once(by_class, n, num_clients, alpha, rng)
        if sizes.min() >= need:
            return parts
    raise ConfigError(
        key,
        value,
        f"no Dirichlet draw (alpha={alpha}, {num_clients} clients, {n} samples) gave "
        f"every client ≥ {need} samples in {MAX_DIRICHLET_TRIES} tries; raise alpha"
        + (" or lower min_size" if key.endswith("min_size") else ""),
    )


def _creff(idx, y, num_classes, num_clients, alpha, rng):
    """CReFF ``build_non_iid_by_dirichlet`` + ``partition_balance`` (code shangxinyi/CReFF-FL).

    As in the CReFF code, the shuffled samples are first cut into contiguous slices
    of ⌊10/K·n⌋, one per group of ``CREFF_GROUP`` = 10 clients (the last slice takes
    the rest); each slice gets its own hetero-dir draw over its clients, retried until
    each has ≥ ⌊0.5·slice/clients⌋. Then all client lists are concatenated in client
    order and cut into K equal contiguous chunks (sizes differ by at most one).
    Without the groups, K=20 and α=0.2 on CIFAR-10-LT almost never passes the retry test.
    """
    perm = rng.permutation(len(idx))
    idx, y, n = idx[perm], y[perm], len(idx)
    group = min(CREFF_GROUP, num_clients)
    workers = [min(group, num_clients - g) for g in range(0, num_clients, group)]
    step = int(group / num_clients * n)
    bounds = [g * step for g in range(len(workers))] + [n]
    parts = []
    for g, w in enumerate(workers):
        sl_idx, sl_y = idx[bounds[g] : bounds[g + 1]], y[bounds[g] : bounds[g + 1]]
        by_class = [sl_idx[sl_y == c] for c in range(num_classes)]
        need = int(0.5 * len(sl_idx) / w)
        parts += _hetero_dir(by_class, len(sl_idx), w, alpha, need, rng, "partition.alpha", alpha)
    return np.array_split(np.concatenate(parts), num_clients)


def dirichlet_clients(idx, y, num_classes, num_clients, alpha, min_size, variant, rng):
    """Split the samples ``idx`` (labels ``y``) over clients by a Dirichlet label skew.

    ``niid``: redraw :func:`_hetero_dir_once` until every client has ≥ min_size
    (FedKA §5.1, CAFeMe code); ``creff``: :func:`_creff` (CReFF code, our choice for ECL §4.1);
    ``proportional``: :func:`_proportional` (FedAFA code).
    """
    if variant == "creff":
        return _creff(idx, y, num_classes, num_clients, alpha, rng)
    by_class = [rng.permutation(idx[y == c]) for c in range(num_classes)]
    if variant == "proportional":
        return _proportional(by_class, num_clients, alpha, rng)
    return _hetero_dir(by_class, len(idx), num_clients, alpha, min_size, rng, "partition.min_size", min_size)


def _check_dirichlet(cfg):
    alpha = _number(cfg, "alpha", 0, None, lo_open=True)
    min_size = _number(cfg, "min_size", 0, None, integer=True)
    variant = _choice(cfg, "variant", ("niid", "creff", "proportional"))
    return alpha, min_size, variant


def _check_min_size(min_size, variant, num_clients, n):
    if variant == "niid" and min_size * num_clients > n:
        raise ConfigError("partition.min_size", min_size, f"min_size × num_clients ≤ {n} samples")


def dirichlet(cfg, labels, n_train, num_classes, num_clients, rng) -> Partition:
    """Dirichlet label skew over the train split (FedKA §5.1, CAFeMe §5.1, ECL §4.1)."""
    alpha, min_size, variant = _check_dirichlet(cfg)
    _check_test_split(cfg)
    _check_clients(num_clients, n_train)
    idx = _sized(cfg, np.arange(n_train), labels[:n_train], num_clients, rng)
    _check_min_size(min_size, variant, num_clients, len(idx))
    clients = dirichlet_clients(idx, labels[idx], num_classes, num_clients, alpha, min_size, variant, rng)
    return _finish(cfg, clients, labels, n_train, num_classes, rng, {})


# ---------------------------------------------------------------------------- shards
def shards(cfg, labels, n_train, num_classes, num_clients, rng) -> Partition:
    """FedLab ``shards_partition`` (CAFeMe §5.1; code annaVettoruzzo/CAFeMe): label-sorted shards, a few per client.

    Shuffle, stable-sort by label, cut into ``num_shards`` shards of ⌊n/num_shards⌋
    (the last n mod num_shards samples are dropped, as in FedLab), and give every
    client ``shards_per_client`` random shards. n = the train split, or K·``samples_per_client`` of it.
    """
    per_client = _number(cfg, "shards_per_client", 1, None, integer=True)
    # null = exactly enough shards for every client (clients × shards_per_client)
    num_shards = (
        num_clients * per_client
        if _opt(cfg, "num_shards") is None
        else _number(cfg, "num_shards", 1, None, integer=True)
    )
    _check_test_split(cfg)
    _check_clients(num_clients, n_train)
    idx = _sized(cfg, np.arange(n_train), labels[:n_train], num_clients, rng)
    n = len(idx)
    if num_shards != num_clients * per_client:
        raise ConfigError(
            "partition.num_shards",
            num_shards,
            f"clients × shards_per_client = {num_clients * per_client} (or null for exactly that); smaller shards: "
            "partition.samples_per_client",
        )
    if num_shards > n:
        if _opt(cfg, "num_shards") is None:  # the user set shards_per_client (num_shards = clients × it)
            raise ConfigError(
                "partition.shards_per_client",
                per_client,
                f"at most {n // num_clients} with {num_clients} clients ({n} train samples: every shard needs one)",
            )
        raise ConfigError("partition.num_shards", num_shards, f"≤ {n} train samples (non-empty shards)")
    perm = idx[rng.permutation(n)]
    by_label = perm[np.argsort(labels[perm], kind="stable")]
    size = n // num_shards
    shard = by_label[: size * num_shards].reshape(num_shards, size)
    owner = rng.permutation(num_shards).reshape(num_clients, per_client)
    clients = [shard[o].ravel() for o in owner]
    info = {"shards": owner, "dropped": int(n - size * num_shards)}
    return _finish(cfg, clients, labels, n_train, num_classes, rng, info)


# ---------------------------------------------------------------------------- FedReMa
def dominant_groups(cfg, labels, n_train, num_classes, num_clients, rng) -> Partition:
    """FedReMa "by_s" partition (FedReMa §5.1; official code liangh68/FedReMa ``generator.py``).

    Ring of overlapping label groups G_g = {(g·stride + j) mod C : j < L},
    stride = C // groups; client c uses group ⌊c·groups/K⌋. Per client
    n_iid = ⌊n·s⌋ over all C labels (⌊n_iid/C⌋ each, the last label the remainder)
    and n − n_iid over its group's labels (⌊·/L⌋ each, the group's last label the
    remainder). Samples come sequentially from per-label shuffled pools, wrapping
    around when a pool is exhausted (only then can clients share samples).
    The pool is train ∪ test when ``use_test_pool`` (the code's choice), else train.
    """
    C = num_classes
    groups = _number(cfg, "groups", 1, C, integer=True)
    L = _number(cfg, "labels_per_group", 1, C, integer=True)
    s = _number(cfg, "s", 0, 1)
    n = _number(cfg, "samples_per_client", 1, None, integer=True)
    use_test_pool = _opt(cfg, "use_test_pool")
    if not isinstance(use_test_pool, bool):
        raise ConfigError("partition.use_test_pool", use_test_pool, "true | false")
    # with the test split in the pool only a client's own hold-out is a clean test set
    _check_test_split(cfg, ("local",) if use_test_pool else TEST_SPLITS)
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ConfigError("clients", num_clients, "an integer ≥ 1")
    pool = np.arange(len(labels) if use_test_pool else n_train)
    per_label = [rng.permutation(pool[labels[pool] == c]) for c in range(C)]
    stride = C // groups
    group_labels = (np.arange(groups)[:, None] * stride + np.arange(L)[None, :]) % C

    n_iid = int(np.floor(n * s + 1e-9))
    iid_need = np.full(C, n_iid // C)
    iid_need[-1] += n_iid - iid_need.sum()
    n_non = n - n_iid
    non_need = np.full(L, n_non // L)
    non_need[-1] += n_non - non_need.sum()
    client_group = np.arange(num_clients) * groups // num_clients
    for g in np.unique(client_group):  # every label a client needs must exist in the pool
        need = iid_need.copy()
        np.add.at(need, group_labels[g], non_need)
        empty = [c for c in np.flatnonzero(need) if len(per_label[c]) == 0]
        if empty:
            raise ConfigError("partition.labels_per_group", L, f"labels with samples in the pool (missing {empty})")
        avail = np.array([len(p) for p in per_label])
        short = np.flatnonzero(need > avail)  # a client would take a sample twice
        if len(short):
            c = int(short[0])
            per_sample = s / C + (1 - s) / L  # share of a client's samples that one of its group's labels gets
            raise ConfigError(
                "partition.samples_per_client",
                n,
                f"at most about {int(avail[c] / per_sample)}: a client of group {g} needs {int(need[c])} "
                f"distinct samples of label {c}, the pool has {int(avail[c])} "
                f"({'train+test' if use_test_pool else 'train'} split)",
            )

    pointer = np.zeros(C, np.int64)
    clients = []
    for g in client_group:
        need = iid_need.copy()
        np.add.at(need, group_labels[g], non_need)
        take = []
        for c in np.flatnonzero(need):
            take.append(per_label[c][(pointer[c] + np.arange(need[c])) % len(per_label[c])])
            pointer[c] += need[c]
        clients.append(np.concatenate(take))
    info = {"groups": client_group, "group_labels": group_labels}
    return _finish(cfg, clients, labels, n_train, num_classes, rng, info)


# ---------------------------------------------------------------------------- ECL long tail
def longtail_sizes(n_max, imbalance_factor, num_classes):
    """ECL §4.1 (CReFF/FedAFA code): n_c = ⌊n_max · IF^(−c/(C−1))⌋ (class 0 largest, class C−1 = n_max/IF)."""
    c = np.arange(num_classes)
    return np.floor(n_max * float(imbalance_factor) ** (-c / (num_classes - 1)) + 1e-9).astype(np.int64)


def longtail(cfg, labels, n_train, num_classes, num_clients, rng) -> Partition:
    """ECL partition (ECL §4.1): long-tailed subsample of the train split, then Dirichlet.

    n_max is the *smallest* class count of the train split (CIFAR: 5000; MNIST's
    classes differ, and this way every class can supply its n_c). Then
    :func:`dirichlet_clients` with the chosen variant (default ``creff``).
    """
    imb = _number(cfg, "imbalance_factor", 1, None)
    alpha, min_size, variant = _check_dirichlet(cfg)
    _check_test_split(cfg)
    if num_classes < 2:
        raise ConfigError("dataset", f"{num_classes} classes", "≥ 2 classes for a long tail")
    train_counts = np.bincount(labels[:n_train], minlength=num_classes)
    sizes = longtail_sizes(int(train_counts.min()), imb, num_classes)
    _check_clients(num_clients, int(sizes.sum()), "long-tailed train samples")
    idx = np.arange(n_train)
    y = labels[:n_train]
    keep = np.concatenate([rng.choice(idx[y == c], sizes[c], replace=False) for c in range(num_classes)])
    keep = _sized(cfg, keep, labels[keep], num_clients, rng)  # the long tail's shape kept: per class, in proportion
    _check_min_size(min_size, variant, num_clients, len(keep))
    clients = dirichlet_clients(keep, labels[keep], num_classes, num_clients, alpha, min_size, variant, rng)
    return _finish(cfg, clients, labels, n_train, num_classes, rng, {"class_sizes": sizes})


# ---------------------------------------------------------------------------- FedCOM
def complementary_pairs(cfg, labels, n_train, num_classes, num_clients, rng) -> Partition:
    """FedCOM partition (FedCOM §4.1.1): 5 class pairs, two complementary clients each.

    Pair p = classes (2p, 2p+1) = clients (2p, 2p+1). Client 2p gets round(majority·n_a)
    of class a and the rest of class b's minority share; client 2p+1 the complement,
    so each pair uses its classes' whole train split without overlap. ``noise``: each
    client also gets a random class of another pair, as many samples as its minority
    count, drawn from that class's train pool (overlapping other clients; our choice).
    Test ``balanced``: all official test samples of the client's two classes,
    the larger class subsampled to the smaller's count.
    """
    majority = _number(cfg, "majority", 0.5, 1, lo_open=True)
    noise = _opt(cfg, "noise")
    if not isinstance(noise, bool):
        raise ConfigError("partition.noise", noise, "true | false")
    ts = _check_test_split(cfg, ("balanced",) + TEST_SPLITS)
    if num_classes % 2:
        raise ConfigError("dataset", f"{num_classes} classes", "an even number of classes (disjoint class pairs)")
    if num_clients != num_classes:
        raise ConfigError("clients", num_clients, f"2 × number of class pairs = {num_classes}")
    if noise and num_classes < 4:
        raise ConfigError("partition.noise", noise, "false unless there are ≥ 2 class pairs")
    idx = _sized(cfg, np.arange(n_train), labels[:n_train], num_clients, rng)
    train_by_class = [rng.permutation(idx[labels[idx] == c]) for c in range(num_classes)]
    K = num_clients
    clients, partner = [None] * K, np.arange(K) ^ 1
    major = np.arange(K)  # client 2p: majority class 2p; client 2p+1: majority class 2p+1
    minor = major ^ 1
    for a in range(0, num_classes, 2):
        ia, ib = train_by_class[a], train_by_class[a + 1]
        ma, mb = int(round(majority * len(ia))), int(round(majority * len(ib)))
        clients[a], clients[a + 1] = [ia[:ma], ib[mb:]], [ib[:mb], ia[ma:]]
    noise_class = np.full(K, -1)
    if noise:
        for k in range(K):
            others = np.setdiff1d(np.arange(num_classes), [major[k], minor[k]])
            noise_class[k] = rng.choice(others)
            n_min = len(clients[k][1])
            pool = train_by_class[noise_class[k]]
            clients[k].append(rng.choice(pool, min(n_min, len(pool)), replace=False))
    clients = [np.concatenate(c) for c in clients]
    test = None
    if ts == "balanced":
        test_idx = np.arange(n_train, len(labels))
        test_by_class = [test_idx[labels[test_idx] == c] for c in range(num_classes)]
        test = []
        for k in range(K):
            ta, tb = test_by_class[major[k]], test_by_class[minor[k]]
            m = min(len(ta), len(tb))
            test.append(np.concatenate([rng.choice(ta, m, replace=False), rng.choice(tb, m, replace=False)]))
    info = {"partner": partner, "majority_class": major, "minority_class": minor, "noise_class": noise_class}
    return _finish(cfg, clients, labels, n_train, num_classes, rng, info, test=test)


# ---------------------------------------------------------------------------- natural (LEAF)
def natural(cfg, labels, n_train, num_classes, num_clients, rng, attrs=None) -> Partition:
    """One client per writer (LEAF's natural partition; CAFeMe Table 2 on FEMNIST): ``num_clients`` distinct
    values of the per-sample attribute ``by`` drawn at random among those with train samples (the CAFeMe code:
    ``random.sample`` of 100 LEAF writers per run seed); client k = all train-split samples of its writer.
    Test ``local``: ``test_fraction`` of those (the code: 20%); ``official``: the writer's own samples of the
    official test split (LEAF's test files).
    """
    by = _opt(cfg, "by")
    ts = _check_test_split(cfg, ("local", "official"))
    if not attrs or by not in attrs:
        raise ConfigError(
            "partition.by",
            by,
            f"a per-sample attribute of the dataset ({', '.join(attrs or {}) or 'this dataset has none'}; "
            "dataset=femnist has writer)",
        )
    who = np.asarray(attrs[by], dtype=np.int64)
    present = np.unique(who[:n_train])
    if not isinstance(num_clients, (int, np.integer)) or not 1 <= num_clients <= len(present):
        raise ConfigError("clients", num_clients, f"an integer in [1, {len(present)}] (the {by}s with train samples)")
    chosen = rng.choice(present, num_clients, replace=False)
    mine = np.flatnonzero(np.isin(who[:n_train], chosen))
    mine = _sized(cfg, mine, who[mine], num_clients, rng)  # per writer, in proportion to its samples
    clients = [mine[who[mine] == w] for w in chosen]
    test = None
    if ts == "official":
        test = [n_train + np.flatnonzero(who[n_train:] == w) for w in chosen]
    return _finish(cfg, clients, labels, n_train, num_classes, rng, {by: chosen}, test=test)


# ---------------------------------------------------------------------------- registry
PARTITIONS = {
    "iid": iid,
    "dirichlet": dirichlet,
    "shards": shards,
    "dominant_groups": dominant_groups,
    "longtail": longtail,
    "complementary_pairs": complementary_pairs,
    "natural": natural,
}
NEEDS_ATTRS = {"natural"}  # partitions that read the dataset's per-sample attributes (Dataset.attrs)


def make_partition(
    cfg,
    labels: np.ndarray,
    n_train: int,
    num_classes: int,
    num_clients: int,
    rng: np.random.Generator,
    attrs: dict | None = None,
) -> Partition:
    """Partition the pool ``labels`` (train split ``[0, n_train)``) with ``PARTITIONS[cfg.name]``; ``attrs`` = the
    dataset's per-sample attributes (e.g. FEMNIST's writer), read by the partitions in :data:`NEEDS_ATTRS`."""
    name = cfg.get("name")
    if name not in PARTITIONS:
        raise ConfigError("partition.name", name, " | ".join(PARTITIONS))
    labels = np.asarray(labels, dtype=np.int64)
    if labels.ndim != 1 or not 0 < n_train <= len(labels):
        raise ValueError(f"labels must be 1-D with 0 < n_train ≤ len(labels), got {labels.shape}, n_train={n_train}")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"labels must lie in [0, {num_classes})")
    extra = {"attrs": attrs} if name in NEEDS_ATTRS else {}
    return PARTITIONS[name](cfg, labels, n_train, num_classes, num_clients, rng, **extra)
