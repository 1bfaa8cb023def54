"""Datasets as whole tensors: decoded once, cached on disk, normalised in one op.

Every loader returns the pool ``official train split ++ official test split`` as
one tensor (uint8 where the source is 8-bit), labels, and optional per-sample
attributes. :func:`load_dataset` caches that raw result in ``cache_dir`` and
then normalises the whole tensor in one op, so no per-sample Python runs after
the one-time decode. torchvision is imported only by the loaders that read its
files (importing it costs ~1.5 s per process; the embedded datasets need none).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from omegaconf import OmegaConf

from fedbench.data.leaf import load_femnist
from fedbench.data.pool import Dataset, from_splits
from fedbench.errors import ConfigError
from fedbench.seeding import rng, torch_generator

CACHE_VERSION = 1  # bump when a loader's output changes, so old cache files are ignored


# ---------------------------------------------------------------- shared helpers


def _missing(cfg, looked: list[Path], what: str, no_download: str | None = None) -> ConfigError:
    """The error for absent data: every path looked in, and how to fix it."""
    if no_download:
        fix = f"({no_download})"
    elif cfg.download:
        fix = "(download=true was tried and failed: no internet? place the files there by hand)"
    else:
        fix = "or set dataset.download=true (needs internet)"
    paths = ", ".join(str(p) for p in looked)
    return ConfigError(
        "dataset.root",
        cfg.root,
        f"{cfg.name} not found; looked in: {paths}. Point data_root (every dataset; default $FEDBENCH_DATA, "
        f"else ./data) or dataset.root at a folder containing {what} {fix}",
    )


def _decode_files(paths: list[str], channels: int, image_size: int | None) -> torch.Tensor:
    """Decode image files into one uint8 [N, C, H, W] tensor (one-time, per file)."""
    from torchvision.io import ImageReadMode, decode_image, read_file
    from torchvision.transforms.v2 import functional as F

    if channels not in (1, 3):
        raise ConfigError("dataset.channels", channels, "1 (grayscale) or 3 (RGB)")
    mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
    with warnings.catch_warnings():  # torchvision 0.29 warns on every call (codecs → torchcodec)
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
        imgs = []
        for p in paths:
            try:
                imgs.append(decode_image(read_file(p), mode=mode))
            except (RuntimeError, ValueError) as e:  # a 0-byte or truncated file: name it (was "run failed: ...")
                raise ConfigError("dataset.root", p, f"a readable image file: {str(e).splitlines()[0]} (replace it)")
    if image_size is not None:
        size = [int(image_size)] * 2
        imgs = [im if list(im.shape[1:]) == size else F.resize(im, size, antialias=True) for im in imgs]
    shapes = {tuple(im.shape) for im in imgs}
    if len(shapes) > 1:
        raise ConfigError(
            "dataset.image_size", image_size, f"images have different sizes {sorted(shapes)[:3]}…; set an integer size"
        )
    return torch.stack(imgs) if imgs else torch.zeros(0, channels, 1, 1, dtype=torch.uint8)


def _is_image_tree(path: Path) -> bool:
    return path.is_dir() and any(p.is_dir() for p in path.iterdir())


def _image_folder_split(split_dir: Path, class_to_idx, channels, image_size):
    """One ImageFolder split, in torchvision's order (class folders sorted, files sorted)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    samples = make_dataset(str(split_dir), class_to_idx, extensions=IMG_EXTENSIONS, allow_empty=True)
    x = _decode_files([p for p, _ in samples], channels, image_size)
    return x, torch.tensor([c for _, c in samples], dtype=torch.int64)


def _load_image_folder(name, train_dir: Path, test_dir: Path, channels, image_size) -> Dataset:
    from torchvision.datasets.folder import find_classes

    classes, class_to_idx = find_classes(str(train_dir))  # labels come from the train split
    test_classes = {p.name for p in test_dir.iterdir() if p.is_dir()}
    if test_classes != set(classes):  # a missing or misnamed class folder: its samples would be scored as nothing
        missing, extra = sorted(set(classes) - test_classes), sorted(test_classes - set(classes))
        raise ConfigError(
            "dataset.root",
            str(test_dir),
            f"the train split's class folders (missing: {missing}, not in train: {extra})",
        )
    tr_x, tr_y = _image_folder_split(train_dir, class_to_idx, channels, image_size)
    te_x, te_y = _image_folder_split(test_dir, class_to_idx, channels, image_size)
    empty = [c for i, c in enumerate(classes) if not bool((te_y == i).any()) or not bool((tr_y == i).any())]
    if empty:
        where = train_dir.parent
        print(
            f"fedbench: warning: {name}: class folder(s) {empty} hold no images in train or test ({where})",
            file=sys.stderr,
        )
    return from_splits(name, tr_x, tr_y, te_x, te_y, classes)


def _torchvision_split(cls, cfg, train: bool):
    """``.data`` / ``.targets`` of a torchvision dataset class (no per-sample transform); a file that is there but
    cannot be read (bad header, truncated, empty) is named, not reported as missing."""
    folder = Path(cfg.root) / getattr(cls, "base_folder", cls.__name__ + "/raw")
    try:
        return cls(str(cfg.root), train=train, download=bool(cfg.download))
    except (RuntimeError, OSError, AssertionError, ValueError, IndexError) as e:  # not found / download failed / bad
        bad = _unreadable_idx_file(cls, cfg)
        if bad is not None:
            raise ConfigError("dataset.root", str(bad[0]), f"a readable {cfg.name} file: this one {bad[1]}") from e
        raise _missing(cfg, [folder], f"{folder.relative_to(cfg.root)}/ (torchvision layout)") from e


def _unreadable_idx_file(cls, cfg) -> tuple[Path, str] | None:
    """(path, problem) of the first of an MNIST-like dataset's raw idx files that exists and does not parse, or
    None."""
    from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor

    raw = Path(cfg.root) / cls.__name__ / "raw"
    for url, _ in getattr(cls, "resources", []):
        f = raw / Path(url).name.removesuffix(".gz")
        if not f.is_file():
            continue
        try:
            read_sn3_pascalvincent_tensor(str(f), strict=True)
        except Exception as e:  # noqa: BLE001  (torchvision asserts on a bad header or length)
            return f, f"cannot be read ({type(e).__name__}: a bad header, an empty or a truncated file)"
    return None


def _normalise(x: torch.Tensor, norm) -> torch.Tensor:
    """uint8 → [0,1] float32, then (x - mean) / std per channel (null = keep [0,1]): torchvision's
    ``to_dtype(scale=True)`` and ``normalize(inplace=True)``, op for op (the same bits)."""
    if not x.is_floating_point():
        x = x.to(torch.float32).mul_(1.0 / torch.iinfo(x.dtype).max)
    elif x.dtype != torch.float32:
        x = x.to(torch.float32)  # floats are already in [0,1]
    if norm is None:
        return x
    mean, std = list(norm.mean), list(norm.std)
    if not len(mean) == len(std) == x.shape[1]:
        raise ConfigError(
            "dataset.normalize", OmegaConf.to_container(norm), f"mean and std need one value per channel ({x.shape[1]})"
        )
    if not all(std):
        raise ConfigError("dataset.normalize", OmegaConf.to_container(norm), "a std that is not 0 for every channel")
    mean = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    return x.sub_(mean).div_(torch.as_tensor(std, dtype=x.dtype, device=x.device).view(-1, 1, 1))


def _cache_file(cfg, cache_dir) -> Path:
    """``<name>-<hash of source path and decoding options>.pt``."""
    opts = OmegaConf.to_container(cfg, resolve=True)
    for k in ("normalize", "cache", "download"):  # do not change the decoded data
        opts.pop(k, None)
    if "root" in opts:
        opts["root"] = os.path.abspath(os.path.expanduser(str(opts["root"])))
    opts["_version"] = CACHE_VERSION
    digest = hashlib.sha1(json.dumps(opts, sort_keys=True).encode()).hexdigest()[:10]
    return Path(cache_dir) / f"{cfg.name}-{digest}.pt"


def _save_atomic(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it 0600: follow the umask, so a group can share the cache
        os.replace(tmp, path)  # readers never see a half-written file
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# ---------------------------------------------------------------- loaders (one per source)


def load_digits(cfg) -> Dataset:
    """scikit-learn's bundled 8×8 digits (no download: the file its ``load_digits`` reads, found without importing
    scikit-learn, whose import costs a process ~2 s); a fixed stratified split, :func:`stratified_split`."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # a top-level package's spec: found, not imported
    data = np.loadtxt(Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    images, target = data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    x = torch.from_numpy(images / 16.0).float().unsqueeze(1)  # pixel values 0..16
    frac = float(cfg.test_fraction)
    if not 0.0 < frac < 1.0:
        raise ConfigError("dataset.test_fraction", cfg.test_fraction, "a fraction strictly between 0 and 1")
    idx_tr, idx_te = stratified_split(target, frac, int(cfg.split_seed))
    y = torch.from_numpy(target)
    return from_splits("digits", x[idx_tr], y[idx_tr], x[idx_te], y[idx_te], np.arange(10))


def stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices of ``y`` split class by class: scikit-learn's ``train_test_split(arange(n),
    test_size=test_fraction, stratify=y, random_state=seed)`` (StratifiedShuffleSplit, 1.x) step for step, so the
    same seed gives the same split bit for bit (tests/test_datasets.py compares the two) — and keeps giving it if
    scikit-learn changes its algorithm. n_test = ⌈f·n⌉; each class's share of n_train and then of n_test is the
    floor of its proportional share, the remaining draws going to the largest remainders (ties drawn at random)."""
    rng = np.random.RandomState(seed)
    n = len(y)
    n_test = math.ceil(test_fraction * n)
    n_train = n - n_test
    _, y_idx, counts = np.unique(y, return_inverse=True, return_counts=True)
    by_class = np.split(np.argsort(y_idx, kind="stable"), np.cumsum(counts)[:-1])

    def share(counts: np.ndarray, draws: int) -> np.ndarray:  # sklearn.utils.extmath._approximate_mode
        continuous = counts / counts.sum() * draws
        floored = np.floor(continuous)
        need = int(draws - floored.sum())
        if need > 0:
            remainder = continuous - floored
            for value in np.sort(np.unique(remainder))[::-1]:
                (inds,) = np.where(remainder == value)
                add = min(len(inds), need)
                floored[rng.choice(inds, size=add, replace=False)] += 1
                need -= add
                if need == 0:
                    break
        return floored.astype(int)

    n_i = share(counts, n_train)
    t_i = share(counts - n_i, n_test)
    train, test = [], []
    for i in range(len(counts)):
        members = by_class[i].take(rng.permutation(counts[i]), mode="clip")
        train.extend(members[: n_i[i]])
        test.extend(members[n_i[i] : n_i[i] + t_i[i]])
    return rng.permutation(train), rng.permutation(test)


def load_synthetic(cfg) -> Dataset:
    """Class prototypes (uniform [0,1] pixels) plus Gaussian noise; deterministic by cfg.seed."""
    g = torch_generator(cfg.seed, "synthetic")
    shape, k = list(cfg.shape), int(cfg.num_classes)
    prototypes = torch.rand([k, *shape], generator=g)

    def draw(per_class: int):
        y = torch.arange(k).repeat(per_class)  # 0,1,…,k-1,0,1,…
        return prototypes[y] + cfg.noise * torch.randn([len(y), *shape], generator=g), y

    (tr_x, tr_y), (te_x, te_y) = draw(cfg.train_per_class), draw(cfg.test_per_class)
    return from_splits("synthetic", tr_x, tr_y, te_x, te_y, [f"class_{i}" for i in range(k)])


def _load_mnist_like(cls, cfg) -> Dataset:
    tr, te = _torchvision_split(cls, cfg, True), _torchvision_split(cls, cfg, False)
    for split, d in (("train", tr), ("test", te)):
        if len(d.data) != len(d.targets):  # e.g. a labels file of another split
            raise ConfigError(
                "dataset.root",
                cfg.root,
                f"{cfg.name}'s {split} images and labels to match: {len(d.data)} images, {len(d.targets)} labels "
                "(a labels file of another split or dataset?)",
            )
    return from_splits(cfg.name, tr.data.unsqueeze(1), tr.targets, te.data.unsqueeze(1), te.targets, tr.classes)


def load_mnist(cfg) -> Dataset:
    from torchvision.datasets import MNIST

    return _load_mnist_like(MNIST, cfg)


def load_fashionmnist(cfg) -> Dataset:
    from torchvision.datasets import FashionMNIST

    return _load_mnist_like(FashionMNIST, cfg)


def _load_cifar(cls, folder: str, num_classes: int, cfg) -> Dataset:
    """CIFAR from an ImageFolder tree or torchvision's python batches (cfg.format)."""
    root, fmt = Path(cfg.root), cfg.format
    if fmt not in ("auto", "imagefolder", "torchvision"):
        raise ConfigError("dataset.format", fmt, "auto, imagefolder or torchvision")
    trees = [root / folder, root]
    batches = root / cls.base_folder
    if fmt in ("auto", "imagefolder"):
        for tree in trees:
            if _is_image_tree(tree / "train") and _is_image_tree(tree / "test"):
                ds = _load_image_folder(cfg.name, tree / "train", tree / "test", 3, None)
                if ds.num_classes != num_classes or ds.input_shape != (3, 32, 32):
                    raise ConfigError(
                        "dataset.root",
                        cfg.root,
                        f"{tree} has {ds.num_classes} classes of shape "
                        f"{ds.input_shape}, expected {num_classes} of (3, 32, 32)",
                    )
                return ds
        if fmt == "imagefolder":
            raise _missing(
                cfg,
                [t / s for t in trees for s in ("train", "test")],
                f"{folder}/{{train,test}}/<class>/ images",
                no_download="format=imagefolder never downloads; use format=auto",
            )
    if fmt == "torchvision" or batches.is_dir() or cfg.download:
        tr, te = _torchvision_split(cls, cfg, True), _torchvision_split(cls, cfg, False)
        hwc = lambda d: torch.from_numpy(d.data).permute(0, 3, 1, 2).contiguous()  # noqa: E731
        return from_splits(cfg.name, hwc(tr), tr.targets, hwc(te), te.targets, tr.classes)
    raise _missing(
        cfg,
        [t / s for t in trees for s in ("train", "test")] + [batches],
        f"{folder}/{{train,test}}/<class>/ images or {cls.base_folder}/",
    )


def load_cifar10(cfg) -> Dataset:
    from torchvision.datasets import CIFAR10

    return _load_cifar(CIFAR10, "cifar10", 10, cfg)


def load_cifar100(cfg) -> Dataset:
    from torchvision.datasets import CIFAR100

    return _load_cifar(CIFAR100, "cifar100", 100, cfg)


def load_imagefolder(cfg) -> Dataset:
    """Any ImageFolder tree ``root/{train_dir,test_dir}/<class>/<image>``."""
    root = Path(cfg.root)
    train_dir, test_dir = root / cfg.train_dir, root / cfg.test_dir
    if not (_is_image_tree(train_dir) and _is_image_tree(test_dir)):
        if cfg.download:
            raise ConfigError("dataset.download", True, "imagefolder has no downloader; use false")
        raise _missing(
            cfg,
            [train_dir, test_dir],
            f"{cfg.train_dir}/<class>/ and {cfg.test_dir}/<class>/ image folders",
            no_download="a local tree has no downloader",
        )
    return _load_image_folder(cfg.name, train_dir, test_dir, cfg.channels, cfg.image_size)


def load_rmnist(cfg) -> Dataset:
    """Rotated MNIST (CAFeMe §5): each split shuffled by split_seed, cut into
    num_rotations equal chunks, chunk g rotated by angles[g]; attrs["rotation"] = g.
    The pool keeps MNIST's order (train[0] is still MNIST train[0])."""
    k = int(cfg.num_rotations)
    angles = list(cfg.angles) if cfg.angles is not None else [20 * g for g in range(k)]
    if len(angles) != k:
        raise ConfigError("dataset.angles", angles, f"a list of num_rotations={k} angles or null")
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    modes = {m.value: m for m in InterpolationMode}  # the enum: the GPU image's torchvision rejects its name
    if cfg.interpolation not in ("nearest", "bilinear"):
        raise ConfigError("dataset.interpolation", cfg.interpolation, "nearest or bilinear")
    ds = load_mnist(cfg)
    rotation = torch.empty(len(ds.y), dtype=torch.int64)
    for split, (lo, hi) in {"train": (0, ds.n_train), "test": (ds.n_train, len(ds.y))}.items():
        perm = lo + rng(cfg.split_seed, "rmnist", split).permutation(hi - lo)
        for g, chunk in enumerate(np.array_split(perm, k)):
            chunk = torch.from_numpy(chunk)
            rotation[chunk] = g
            ds.x[chunk] = F.rotate(ds.x[chunk], float(angles[g]), interpolation=modes[cfg.interpolation])
    ds.name, ds.attrs = "rmnist", {"rotation": rotation}
    return ds


TINY_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"


def load_tinyimagenet(cfg) -> Dataset:
    """Tiny-ImageNet-200: train/<wnid>/images/*.JPEG; the labelled val split is the test split."""
    if cfg.download:
        raise ConfigError(
            "dataset.download",
            True,
            f"Tiny-ImageNet has no torchvision downloader: fetch {TINY_URL}, "
            f"unzip it under dataset.root (giving <root>/tiny-imagenet-200/) "
            f"and set dataset.download=false",
        )
    base = Path(cfg.root) / "tiny-imagenet-200"
    val_ann = base / "val" / "val_annotations.txt"
    if not (_is_image_tree(base / "train") and val_ann.is_file()):
        raise _missing(
            cfg,
            [base / "train", val_ann],
            f"tiny-imagenet-200/ (unzip {TINY_URL} there)",
            no_download="this dataset has no downloader",
        )
    from torchvision.datasets.folder import find_classes

    classes, class_to_idx = find_classes(str(base / "train"))
    tr_x, tr_y = _image_folder_split(base / "train", class_to_idx, 3, cfg.image_size)
    rows = [line.split("\t")[:2] for line in val_ann.read_text().splitlines() if line.strip()]
    te_x = _decode_files([str(base / "val" / "images" / f) for f, _ in rows], 3, cfg.image_size)
    te_y = torch.tensor([class_to_idx[w] for _, w in rows], dtype=torch.int64)
    return from_splits("tinyimagenet", tr_x, tr_y, te_x, te_y, classes)


DATASETS: dict[str, Callable[..., Dataset]] = {
    "digits": load_digits,
    "synthetic": load_synthetic,
    "mnist": load_mnist,
    "fashionmnist": load_fashionmnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "imagefolder": load_imagefolder,
    "rmnist": load_rmnist,
    "tinyimagenet": load_tinyimagenet,
    "femnist": load_femnist,  # LEAF's per-writer JSON files (fedbench/data/leaf.py)
}
_GENERATED = {"digits", "synthetic"}  # built in milliseconds; caching them only adds files


def load_dataset(cfg, cache_dir: str | Path) -> Dataset:
    """Build ``cfg.name`` (the omegaconf ``dataset`` node), decoding at most once per cache_dir."""
    if cfg.name not in DATASETS:
        raise ConfigError("dataset.name", cfg.name, f"one of {', '.join(DATASETS)}")
    use_cache = bool(cfg.cache) and cfg.name not in _GENERATED
    path = _cache_file(cfg, cache_dir) if use_cache else None
    raw = None
    if path is not None and path.is_file():
        try:
            d = torch.load(path, weights_only=True)
            raw = Dataset(cfg.name, d["x"], d["y"], d["n_train"], d["classes"], d["attrs"])
        except Exception as e:  # truncated or corrupted (a crash while copying it, a full disk): decode again
            print(
                f"fedbench: warning: dataset cache {path} cannot be read ({type(e).__name__}); decoding "
                f"{cfg.name} from its source again",
                file=sys.stderr,
            )
    if raw is None:
        raw = DATASETS[cfg.name](cfg)
        if path is not None:
            try:
                _save_atomic(
                    {"x": raw.x, "y": raw.y, "n_train": raw.n_train, "classes": raw.classes, "attrs": raw.attrs}, path
                )
            except OSError as e:  # the cache only saves time: a read-only or full cache dir does not stop the run
                print(
                    f"fedbench: warning: cannot write the dataset cache {path} ({e.strerror}); "
                    "the run goes on without it",
                    file=sys.stderr,
                )
    bad = (raw.y < 0) | (raw.y >= len(raw.classes))
    if bool(bad.any()):  # a corrupt labels file: it would train on, scoring chance
        i = int(bad.nonzero()[0])
        raise ConfigError(
            "dataset.root",
            str(cfg.get("root")),
            f"{cfg.name}'s labels in 0..{len(raw.classes) - 1}: sample {i} is labelled {int(raw.y[i])} (a corrupt "
            "labels file?)",
        )
    raw.x = _normalise(raw.x, cfg.normalize)
    return raw
