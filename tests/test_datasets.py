"""Facts about fedbench.data.datasets: shapes, label order, determinism, caching, errors."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torchvision.io import encode_jpeg, write_file, write_png

from fedbench.data.datasets import DATASETS, Dataset, load_dataset
from fedbench.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")  # torchvision 0.29

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf" / "dataset"


def make_cfg(name: str, data_root="data", **overrides):
    """The dataset node as Hydra would compose it: conf/dataset/<name>.yaml + overrides."""
    top = OmegaConf.create({"data_root": str(data_root), "dataset": OmegaConf.load(CONF / f"{name}.yaml")})
    for k, v in overrides.items():
        OmegaConf.update(top, f"dataset.{k}", v, force_add=True)
    return top.dataset


def write_image(path: Path, img: torch.Tensor) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".png":
        write_png(img, str(path))
    else:
        write_file(str(path), encode_jpeg(img, quality=95))


def colour(i: int, size=(6, 6)) -> torch.Tensor:
    """A solid uint8 RGB image whose colour encodes i."""
    return torch.tensor([40 * i, 255 - 40 * i, 100], dtype=torch.uint8).view(3, 1, 1).expand(3, *size).contiguous()


# ---------------------------------------------------------------- configs


def test_every_yaml_names_a_registered_loader():
    names = sorted(p.stem for p in CONF.glob("*.yaml"))
    assert names == sorted(DATASETS)
    for name in names:
        assert make_cfg(name).name == name


def test_unknown_name_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_dataset(OmegaConf.create({"name": "imagenet"}), tmp_path)
    assert e.value.key == "dataset.name"


# ---------------------------------------------------------------- digits / synthetic


def test_digits_shape_labels_and_fixed_split(tmp_path):
    a = load_dataset(make_cfg("digits"), tmp_path)
    b = load_dataset(make_cfg("digits"), tmp_path)
    assert isinstance(a, Dataset) and a.x.dtype == torch.float32 and a.y.dtype == torch.int64
    assert a.x.shape == (1797, 1, 8, 8) and a.input_shape == (1, 8, 8) and a.num_classes == 10
    assert a.n_train == 1437  # 20% of each class held out
    assert 0.0 <= a.x.min() and a.x.max() <= 1.0
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    # stratified: every class has ~20% of its samples in the test split
    frac = torch.bincount(a.y[a.n_train :], minlength=10) / torch.bincount(a.y, minlength=10)
    assert torch.allclose(frac, torch.full((10,), 0.2), atol=0.01)
    assert not any(tmp_path.iterdir())  # no cache for embedded data


def test_digits_and_its_split_are_scikit_learns_bit_for_bit(tmp_path):
    """The digits loader reads scikit-learn's file without importing it, and its stratified split is scikit-learn's
    train_test_split(stratify=...) step for step: the same images, labels and indices for several seeds and
    fractions, on the digits labels and on uneven classes whose proportional shares tie (the random tie-breaks)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from fedbench.data.datasets import stratified_split

    d = load_digits()
    for seed, frac in [(0, 0.2), (7, 0.2), (3, 0.33), (11, 0.05)]:
        ours = load_dataset(make_cfg("digits", split_seed=seed, test_fraction=frac), tmp_path)
        tr, te = train_test_split(np.arange(1797), test_size=frac, stratify=d.target, random_state=seed)
        x = torch.from_numpy(d.images / 16.0).float().unsqueeze(1)
        assert torch.equal(ours.x, torch.cat([x[tr], x[te]])) and torch.equal(
            ours.y[: ours.n_train], torch.from_numpy(d.target[tr])
        )
    y = np.repeat(np.arange(7), [2, 3, 3, 5, 5, 9, 13])  # remainders tie between classes
    for seed, frac in [(0, 0.3), (1, 0.5), (5, 0.45)]:
        for a, b in zip(
            stratified_split(y, frac, seed),
            train_test_split(np.arange(len(y)), test_size=frac, stratify=y, random_state=seed),
        ):
            assert np.array_equal(a, b), (seed, frac)
    with pytest.raises(ConfigError) as e:
        load_dataset(make_cfg("digits", test_fraction=1.0), tmp_path)
    assert e.value.key == "dataset.test_fraction"


def test_synthetic_is_deterministic_and_learnable(tmp_path):
    cfg = make_cfg("synthetic")
    a, b = load_dataset(cfg, tmp_path), load_dataset(cfg, tmp_path)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert a.x.shape == (10 * (100 + 20), 1, 8, 8) and a.n_train == 1000
    assert torch.equal(torch.bincount(a.y[a.n_train :]), torch.full((10,), 20))
    assert not torch.equal(load_dataset(make_cfg("synthetic", seed=1), tmp_path).x, a.x)
    # nearest class mean fitted on train, scored on test
    xtr, ytr = a.x[: a.n_train].flatten(1), a.y[: a.n_train]
    means = torch.stack([xtr[ytr == c].mean(0) for c in range(10)])
    pred = torch.cdist(a.x[a.n_train :].flatten(1), means).argmin(1)
    assert (pred == a.y[a.n_train :]).float().mean() > 0.8


def test_normalisation_is_per_channel_and_checked(tmp_path):
    raw = load_dataset(make_cfg("digits"), tmp_path).x
    norm = load_dataset(make_cfg("digits", normalize={"mean": [0.25], "std": [0.5]}), tmp_path).x
    assert torch.allclose(norm, (raw - 0.25) / 0.5)
    with pytest.raises(ConfigError) as e:
        load_dataset(make_cfg("digits", normalize={"mean": [0.1, 0.2, 0.3], "std": [1, 1, 1]}), tmp_path)
    assert e.value.key == "dataset.normalize"


# ---------------------------------------------------------------- torchvision MNIST layout


def write_idx(root: Path, folder: str, n_train=30, n_test=20) -> None:
    """Tiny fake IDX files in torchvision's layout root/<folder>/raw (pixels i+row, label i%10)."""
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    for prefix, n in [("train", n_train), ("t10k", n_test)]:
        px = (torch.arange(n).view(n, 1, 1) + torch.arange(28).view(1, 28, 1)).expand(n, 28, 28)
        header = b"\x00\x00\x08\x03" + b"".join(v.to_bytes(4, "big") for v in (n, 28, 28))
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + px.to(torch.uint8).numpy().tobytes())
        labels = bytes(i % 10 for i in range(n))
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01" + n.to_bytes(4, "big") + labels)


def test_fashionmnist_reads_torchvision_layout(tmp_path):
    write_idx(tmp_path, "FashionMNIST")
    d = load_dataset(make_cfg("fashionmnist", data_root=tmp_path, normalize=None), tmp_path / "cache")
    assert d.x.shape == (50, 1, 28, 28) and d.n_train == 30 and d.classes[0] == "T-shirt/top"
    assert d.y.tolist() == [i % 10 for i in range(30)] + [i % 10 for i in range(20)]
    assert torch.equal((d.x[31, 0] * 255).round(), (1 + torch.arange(28.0)).view(28, 1).expand(28, 28))


def test_rmnist_chunks_on_fake_mnist(tmp_path):
    write_idx(tmp_path, "MNIST", n_train=40, n_test=20)
    cfg = make_cfg("rmnist", data_root=tmp_path, num_rotations=4, angles=[0, 90, 45, 180], normalize=None)
    d = load_dataset(cfg, tmp_path / "cache")
    plain = load_dataset(make_cfg("mnist", data_root=tmp_path, normalize=None), tmp_path / "cache")
    rot = d.attrs["rotation"]
    assert torch.equal(torch.bincount(rot[:40]), torch.full((4,), 10))
    assert torch.equal(torch.bincount(rot[40:]), torch.full((4,), 5))
    assert torch.equal(d.y, plain.y)
    assert torch.equal(d.x[rot == 0], plain.x[rot == 0])
    assert torch.equal(d.x[rot == 1], plain.x[rot == 1].rot90(1, (-2, -1)))  # 90° counter-clockwise
    assert torch.equal(d.x[rot == 3], plain.x[rot == 3].flip(-1, -2))
    again = load_dataset(cfg, tmp_path / "other-cache")  # same split_seed, fresh decode
    assert torch.equal(again.attrs["rotation"], rot) and torch.equal(again.x, d.x)
    with pytest.raises(ConfigError) as e:
        load_dataset(make_cfg("rmnist", data_root=tmp_path, angles=[0, 90]), tmp_path)
    assert e.value.key == "dataset.angles"
    # nearest (the default) only moves pixels, bilinear blends them at 45°; passed to torchvision as its enum (a GPU
    # image's torchvision rejected the name), a value it does not have is one ConfigError naming the key
    values = set(plain.x[rot == 2].unique().tolist()) | {0.0}
    assert set(d.x[rot == 2].unique().tolist()) <= values
    blend = load_dataset(
        make_cfg(
            "rmnist",
            data_root=tmp_path,
            num_rotations=4,
            angles=[0, 90, 45, 180],
            normalize=None,
            interpolation="bilinear",
        ),
        tmp_path / "cache-b",
    )
    assert not set(blend.x[rot == 2].unique().tolist()) <= values and torch.equal(blend.x[rot == 1], d.x[rot == 1])
    with pytest.raises(ConfigError) as e:
        load_dataset(make_cfg("rmnist", data_root=tmp_path, interpolation="cubic"), tmp_path / "cache-c")
    assert (e.value.key, e.value.value) == ("dataset.interpolation", "cubic")


# ---------------------------------------------------------------- image folders


@pytest.fixture
def image_tree(tmp_path):
    """root/{train,test}/<class>/ with class folders created out of alphabetical order."""
    root = tmp_path / "tree"
    for i, cls in [(2, "zebra"), (0, "ant"), (1, "bee")]:
        for k in range(3):
            write_image(root / "train" / cls / f"{k}.png", colour(i))
        write_image(root / "test" / cls / "0.png", colour(i))
    return root


def test_imagefolder_labels_follow_sorted_folders_and_cache_is_used(image_tree, tmp_path):
    cache = tmp_path / "cache"
    cfg = make_cfg("imagefolder", root=str(image_tree))
    a = load_dataset(cfg, cache)
    assert a.classes == ["ant", "bee", "zebra"] and a.n_train == 9 and a.x.shape == (12, 3, 6, 6)
    assert a.y.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 1, 2]
    expected = torch.stack([colour(int(c)) for c in a.y])  # PNG is lossless
    assert torch.equal((a.x * 255).round().to(torch.uint8), expected)
    (cache_file,) = cache.glob("imagefolder-*.pt")
    shutil.rmtree(image_tree)  # the cache alone must now be enough
    b = load_dataset(cfg, cache)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and a.classes == b.classes
    assert list(cache.iterdir()) == [cache_file]  # no tmp files left behind


def test_imagefolder_options_and_no_cache(image_tree, tmp_path):
    cfg = make_cfg(
        "imagefolder",
        root=str(image_tree),
        image_size=4,
        channels=1,
        cache=False,
        normalize={"mean": [0.5], "std": [0.5]},
    )
    d = load_dataset(cfg, tmp_path / "cache")
    assert d.x.shape == (12, 1, 4, 4) and -1 <= d.x.min() and d.x.max() <= 1
    assert not (tmp_path / "cache").exists()
    write_image(image_tree / "train" / "ant" / "big.png", colour(0, size=(8, 8)))
    with pytest.raises(ConfigError) as e:
        load_dataset(make_cfg("imagefolder", root=str(image_tree), cache=False), tmp_path)
    assert e.value.key == "dataset.image_size"


def test_tinyimagenet_fake_tree(tmp_path):
    base = tmp_path / "tiny-imagenet-200"
    wnids = ["n02", "n01"]  # train folders; sorted order gives n01 -> 0, n02 -> 1
    for i, w in enumerate(wnids):
        for k in range(2):
            write_image(base / "train" / w / "images" / f"{w}_{k}.JPEG", colour(i, size=(64, 64)))
        (base / "train" / w / f"{w}_boxes.txt").write_text("ignored\n")
    gray = torch.full((1, 64, 64), 128, dtype=torch.uint8)  # Tiny-ImageNet has some grayscale JPEGs
    val = [
        ("val_0.JPEG", "n01", colour(1, size=(64, 64))),
        ("val_1.JPEG", "n02", gray),
        ("val_2.JPEG", "n02", colour(0, size=(64, 64))),
    ]
    for f, _, img in val:
        write_image(base / "val" / "images" / f, img)
    (base / "val" / "val_annotations.txt").write_text("".join(f"{f}\t{w}\t0\t0\t63\t63\n" for f, w, _ in val))

    d = load_dataset(make_cfg("tinyimagenet", data_root=tmp_path, cache=False, normalize=None), tmp_path)
    assert d.classes == ["n01", "n02"] and d.num_classes == 2
    assert d.x.shape == (7, 3, 64, 64) and d.n_train == 4
    assert d.y.tolist() == [0, 0, 1, 1, 0, 1, 1]
    assert (d.x[5] - 128 / 255).abs().max() < 0.02  # grey replicated to 3 channels
    with pytest.raises(ConfigError, match="tiny-imagenet-200.zip") as e:
        load_dataset(make_cfg("tinyimagenet", data_root=tmp_path, download=True), tmp_path)
    assert e.value.key == "dataset.download"


@pytest.mark.parametrize(
    "name", ["mnist", "fashionmnist", "cifar10", "cifar100", "rmnist", "imagefolder", "tinyimagenet"]
)
def test_missing_data_names_root_and_paths(name, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = make_cfg(name, data_root=empty, root=str(empty)) if name == "imagefolder" else make_cfg(name, data_root=empty)
    with pytest.raises(ConfigError) as e:
        load_dataset(cfg, tmp_path / "cache")
    msg = str(e.value)
    assert e.value.key == "dataset.root" and e.value.value == str(empty)
    assert f"looked in: {empty}/" in msg and "Point data_root (every dataset; default $FEDBENCH_DATA" in msg
    assert ("has no downloader" if name in ("imagefolder", "tinyimagenet") else "dataset.download=true") in msg
    assert not (tmp_path / "cache").exists()


def test_cifar_imagefolder_format_without_tree_lists_paths(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_dataset(make_cfg("cifar10", data_root=tmp_path, format="imagefolder"), tmp_path)
    assert str(tmp_path / "cifar10" / "train") in str(e.value) and str(tmp_path / "train") in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_dataset(make_cfg("cifar10", data_root=tmp_path, format="png"), tmp_path)
    assert e.value.key == "dataset.format"


# ---------------------------------------------------------------- real data (../shared/data)


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = Path(os.environ.get("FEDBENCH_DATA") or REPO.parent / "shared" / "data")
    if not root.is_dir():
        pytest.skip(f"real data not found at {root} (set FEDBENCH_DATA to the shared data folder)")
    return root


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dataset-cache")  # one decode per session


def need(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not present")


@pytest.mark.data
def test_real_mnist(data_root, cache_dir):
    need(data_root / "MNIST" / "raw")
    d = load_dataset(make_cfg("mnist", data_root=data_root, normalize=None), cache_dir)
    assert d.x.shape == (70000, 1, 28, 28) and d.n_train == 60000 and d.num_classes == 10
    assert d.y[0] == 5 and d.y[60000] == 7
    assert abs(d.x[:60000].mean().item() - 0.1307) < 1e-4
    assert abs(d.x[:60000].std().item() - 0.3081) < 1e-4


@pytest.mark.data
@pytest.mark.slow
def test_real_cifar10_imagefolder(data_root, cache_dir):
    need(data_root / "cifar10" / "train")
    d = load_dataset(make_cfg("cifar10", data_root=data_root), cache_dir)
    assert d.x.shape == (60000, 3, 32, 32) and d.n_train == 50000
    assert d.classes == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    assert torch.equal(torch.bincount(d.y[:50000]), torch.full((10,), 5000))
    assert torch.equal(torch.bincount(d.y[50000:]), torch.full((10,), 1000))
    assert d.x[:50000].mean((0, 2, 3)).abs().max() < 0.01  # normalised with the yaml's mean/std


@pytest.mark.data
def test_real_rmnist_rotation_chunks(data_root, cache_dir):
    need(data_root / "MNIST" / "raw")
    mnist = load_dataset(make_cfg("mnist", data_root=data_root), cache_dir)
    d = load_dataset(make_cfg("rmnist", data_root=data_root), cache_dir)
    rot = d.attrs["rotation"]
    assert torch.equal(d.y, mnist.y)  # order and labels of MNIST are kept
    assert torch.equal(torch.bincount(rot[:60000]), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(rot[60000:]), torch.full((10,), 1000))
    assert torch.equal(d.x[rot == 0], mnist.x[rot == 0])  # chunk 0 is unrotated
    assert torch.equal(d.x[rot == 9], mnist.x[rot == 9].flip(-1, -2))  # 180 degrees, exact on 28x28
    assert not torch.equal(d.x[rot == 1], mnist.x[rot == 1])
