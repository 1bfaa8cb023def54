#!/usr/bin/env python
"""The travel kit for a borrowed GPU machine, and the rehearsal of that machine on a CPU (README, "On a GPU").

The GPU machines we borrow have no package index. Their image has Python 3.12 and torch with the packages in
``IMAGE`` below, but not hydra-core, omegaconf, antlr4-python3-runtime (nor wandb or submitit, which fedbench imports
only for ``logger`` W&B modes and the SLURM launcher). Only the working tree travels (64 MiB with the carried
ignored paths), and only files under ``$OUT`` come back.

    python scripts/device_kit.py pins                 # the kit's wheels, one version each (as installed here)
    python scripts/device_kit.py pins peers           # + pfl-research's, for scripts/peers/ on the GPU (--peers)
    python scripts/device_kit.py data DIR             # pack ../shared/data (CIFAR-10 JPEGs, MNIST .gz) into DIR
    python scripts/device_kit.py rehearsal-env DIR    # a venv holding only the image's packages (from this venv)
    python scripts/device_kit.py size PATH...         # MiB that would travel (the working tree + these paths, e.g.
                                                      # .whl .device-data .device-runs: scripts/device_pack.py)

``scripts/device_prep.sh`` runs the first two; ``make gpu-rehearsal`` the third, then the GPU command in
``--cpu-smoke`` mode inside that venv.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What the GPU image has (distribution names; the device tool's page): nothing else may be imported there.
IMAGE = [
    "torch",
    "torchvision",
    "numpy",
    "scipy",
    "matplotlib",
    "rich",
    "pandas",
    "pyyaml",
    "filelock",
    "joblib",
    "threadpoolctl",
    "scikit-learn",
]
# What fedbench needs that the image lacks: pure-Python wheels (any Python 3), so the ones pip gives for 3.12 are the
# ones a rehearsal on this machine's Python runs.
KIT = ["hydra-core", "omegaconf", "antlr4-python3-runtime"]
# pfl-research (scripts/peers/pfl_cifar10.py --device cuda) on the GPU image: pfl and what it imports that the image
# lacks, all pure Python (multiprocess's wheel is one per Python version, none-any), at the versions its side-by-side
# ran with (pip install -e ".[peers]": README "Against pfl-research"). pfl also requires dm-tree and wrapt (compiled,
# reached through dp-accounting) and wheel, which the side-by-side never imports: left out, installed with --no-deps.
PEERS = [
    "pfl==0.6.0",
    "dp-accounting==0.5.1",
    "prv-accountant==0.2.0",
    "multiprocess==0.70.19",
    "dill==0.4.1",
    "absl-py==1.4.0",
    "attrs==23.2.0",
]
LIMIT_MIB = 64


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    """``name==version`` of each kit package as installed in this environment (what the tests ran with)."""
    return [f"{n}=={metadata.version(n)}" for n in KIT]


def closure(names: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions ``names`` require, transitively (extras off, markers of this interpreter)."""
    from packaging.requirements import Requirement

    todo, seen = list(names), {}
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # e.g. pandas is in the image but not needed here; the rehearsal does without it
        seen[name] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def rehearsal_env(target: Path) -> None:
    """A venv whose site-packages holds only the image's distributions (symlinks to this environment's files), so
    that an import the GPU machine lacks fails here too."""
    target = target.resolve()
    if target.exists():
        subprocess.run(["rm", "-rf", str(target)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    site = Path(
        subprocess.run(
            [str(target / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    here = Path(sysconfig.get_paths()["purelib"])
    dists = closure(IMAGE)
    linked = set()
    for dist in dists.values():
        for f in dist.files or []:
            top = Path(str(f)).parts[0]
            if top in linked or top.startswith("..") or top == "__pycache__":
                continue
            src = here / top
            if src.exists():
                (site / top).symlink_to(src)
                linked.add(top)
    missing = [n for n in ("hydra", "omegaconf", "antlr4", "wandb", "submitit") if (site / n).exists()]
    if missing:
        raise SystemExit(f"device_kit: {', '.join(missing)} leaked into the rehearsal env through {sorted(dists)}")
    print(
        f"rehearsal env {target}: {len(dists)} distributions ({', '.join(sorted(dists))}); "
        f"not there: {', '.join(KIT)}, wandb, submitit"
    )


def pack_data(src: Path, dst: Path) -> None:
    """CIFAR-10's JPEG tree as one .tar.gz (60k small files) and MNIST's four original .gz files."""
    dst.mkdir(parents=True, exist_ok=True)
    if (src / "cifar10").is_dir() and not (dst / "cifar10.tar.gz").exists():
        tmp = dst / "cifar10.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            tar.add(src / "cifar10", arcname="cifar10")
        tmp.rename(dst / "cifar10.tar.gz")
    raw = src / "MNIST" / "raw"
    if raw.is_dir():
        (dst / "MNIST" / "raw").mkdir(parents=True, exist_ok=True)
        for f in raw.glob("*.gz"):
            out = dst / "MNIST" / "raw" / f.name
            if not out.exists():
                out.write_bytes(f.read_bytes())


def travel_mib(paths: list[str]) -> float:
    """MiB of the working tree (tracked + untracked, not ignored) plus the given ignored paths."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True
    ).stdout.split(b"\0")
    total = sum(os.path.getsize(REPO / p.decode()) for p in listed if p and (REPO / p.decode()).is_file())
    for p in paths:
        for f in [Path(REPO / p)] if (REPO / p).is_file() else (REPO / p).rglob("*"):
            total += f.stat().st_size if f.is_file() else 0
    return total / 2**20


def main() -> None:
    cmd, *args = sys.argv[1:] or ["--help"]
    if cmd == "pins":
        print(" ".join(pins() + (PEERS if args == ["peers"] else [])))
    elif cmd == "data":
        src = Path(os.environ.get("FEDBENCH_DATA") or REPO.parent / "shared" / "data")
        pack_data(src, Path(args[0]))
    elif cmd == "rehearsal-env":
        rehearsal_env(Path(args[0]))
    elif cmd == "size":
        mib, tree = travel_mib(args), travel_mib([])
        parts = "".join(f", {p} {travel_mib([p]) - tree:.1f}" for p in args)
        print(f"{mib:.1f} MiB would travel (limit {LIMIT_MIB} MiB): the working tree {tree:.1f}{parts}")
        if mib > LIMIT_MIB - 2:
            raise SystemExit(f"device_kit: {mib:.1f} MiB is over the {LIMIT_MIB} MiB the device tool carries")
    else:
        print(__doc__)


if __name__ == "__main__":
    main()
